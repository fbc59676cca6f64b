// The bounds of the QEMUs kept for hibernated VMs: each leaves after keepMs, the oldest first over max, none that a
// wake took or that was replaced meanwhile; with injected timers (no waiting).
import { describe, expect, it } from "vitest";
import { WaitingPool, type WaitingTimers } from "../../fleet-agent/drivers/qemu/waiting.ts";

/** Timers that fire when the test says the time has come. */
function manualTimers(): WaitingTimers & { advance(ms: number): void; pending(): number } {
  let now = 0;
  let timers: { at: number; fn: () => void; id: number }[] = [];
  let next = 0;
  return {
    set(fn, ms) {
      const id = next++;
      timers.push({ at: now + ms, fn, id });
      return id;
    },
    clear(h) {
      timers = timers.filter((t) => t.id !== h);
    },
    advance(ms) {
      now += ms;
      const due = timers.filter((t) => t.at <= now);
      timers = timers.filter((t) => t.at > now);
      for (const t of due) t.fn();
    },
    pending: () => timers.length,
  };
}

describe("WaitingPool", () => {
  it("ends a kept one after keepMs; one a wake took before that is never ended", () => {
    const timers = manualTimers();
    const ended: string[] = [];
    const pool = new WaitingPool<string>({ keepMs: 1000, max: 10 }, (id, v, why) => ended.push(`${id}:${v}:${why}`), { timers });
    pool.set("a", "qemu-a");
    pool.set("b", "qemu-b");
    timers.advance(500);
    expect(pool.get("b")).toBe("qemu-b");
    expect(pool.delete("b")).toBe(true); // the wake took it
    timers.advance(600);
    expect(ended).toEqual(["a:qemu-a:expired"]);
    expect(pool.size).toBe(0);
    expect(timers.pending()).toBe(0); // b's timer went with it
  });

  it("over max, the oldest kept is ended first; keeping a VM's QEMU again ends nothing and makes it the newest", () => {
    const timers = manualTimers();
    const ended: string[] = [];
    const pool = new WaitingPool<string>({ keepMs: 0, max: 2 }, (id, _v, why) => ended.push(`${id}:${why}`), { timers });
    pool.set("a", "1");
    pool.set("b", "1");
    pool.set("a", "2"); // the same VM again: no eviction, and a is now the newest
    expect(ended).toEqual([]);
    pool.set("c", "1");
    expect(ended).toEqual(["b:over_max"]);
    expect(pool.keys()).toEqual(["a", "c"]);
    expect(timers.pending()).toBe(0); // keepMs 0: until the wake
  });

  it("a timer of a value that was replaced ends nothing", () => {
    const timers = manualTimers();
    const ended: string[] = [];
    const pool = new WaitingPool<string>({ keepMs: 1000, max: 10 }, (id, v) => ended.push(`${id}:${v}`), { timers });
    pool.set("a", "old");
    timers.advance(900);
    pool.set("a", "new");
    timers.advance(200);
    expect(ended).toEqual([]);
    timers.advance(900);
    expect(ended).toEqual(["a:new"]);
  });

  it("over the memory budget, the least recently kept go first; a burst of 50 keeps stays within it", () => {
    const ended: string[] = [];
    const weights = new Map<string, number>();
    const pool = new WaitingPool<string>({ keepMs: 0, max: 100, maxBytes: 250 }, (id, _v, why) => ended.push(`${id}:${why}`), {
      timers: manualTimers(),
      weigh: (v) => weights.get(v) ?? 0,
    });
    weights.set("a", 100).set("b", 100).set("c", 100).set("big", 300);
    pool.set("a", "a");
    pool.set("b", "b");
    expect(pool.bytes).toBe(200);
    pool.set("c", "c");
    expect(ended).toEqual(["a:over_memory"]);
    expect(pool.bytes).toBe(200);
    pool.delete("b"); // a wake took it: its bytes are free again
    expect(pool.bytes).toBe(100);
    pool.set("big", "big"); // over the budget alone: everything older goes, then itself
    expect(ended).toEqual(["a:over_memory", "c:over_memory", "big:over_memory"]);
    expect(pool.size).toBe(0);
    expect(pool.bytes).toBe(0);
    for (let i = 0; i < 50; i++) {
      weights.set(`q${i}`, 40 + (i % 7));
      pool.set(`q${i}`, `q${i}`);
      expect(pool.bytes).toBeLessThanOrEqual(250);
    }
    expect(pool.keys()).toEqual(["q44", "q45", "q46", "q47", "q48", "q49"].slice(-pool.size)); // the most recent
  });

  it("refuses a bound below one", () => {
    expect(() => new WaitingPool<string>({ keepMs: 0, max: 0 }, () => undefined)).toThrow(/at least 1/);
  });
});

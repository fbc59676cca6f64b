// The host's event-log writer alone: writes land in the order issued, and a failed write is logged, never thrown.
import { describe, expect, it } from "vitest";
import { silentLogger, type Logger } from "../../lib/log.ts";
import { EventLog } from "../../fleet-agent/event-log.ts";
import type { HostStore, RunStart, TransitionRecord } from "../../fleet-agent/store.ts";

function record(toState: string): TransitionRecord {
  return {
    at: new Date(0),
    hostId: "host_t",
    agentId: "agt_a",
    tenantId: "ten_a",
    vmId: "vm_a",
    runId: null,
    fromState: "x",
    toState,
    reason: "request",
    timings: null,
    detail: null,
  };
}

const run: RunStart = {
  id: "run_1",
  agentId: "agt_a",
  tenantId: "ten_a",
  hostId: "host_t",
  vmId: "vm_a",
  wokeAt: new Date(0),
  wakeReason: "request",
  wakeMode: "boot",
  timings: {},
};

/** A store that notes each write as it lands; `hold` makes the write for one state wait until `release` is called. */
function recordingStore(opts: { hold?: string; fail?: string } = {}) {
  const landed: string[] = [];
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  const store: HostStore = {
    async transition(r) {
      if (r.toState === opts.hold) await held;
      if (r.toState === opts.fail) throw new Error("db down");
      landed.push(`transition:${r.toState}`);
    },
    async runStarted(r) {
      landed.push(`runStarted:${r.id}`);
    },
    async runTimings(runId, t) {
      landed.push(`runTimings:${runId}:${t.firstByteMs}`);
    },
    async runEnded(runId, _at, reason) {
      landed.push(`runEnded:${runId}:${reason}`);
    },
    leftovers: async () => ({ openRuns: [], awakeAgents: [] }),
    recordCrash: async () => undefined,
    owners: async () => new Map(),
    claimWake: async () => undefined,
    markAsleep: async () => {},
    draining: async () => false,
  };
  return { store, landed, release };
}

const turn = () => new Promise((r) => setImmediate(r));

describe("event log", () => {
  it("keeps the order writes were issued in while an earlier write is slow, and flush waits for all of them", async () => {
    const { store, landed, release } = recordingStore({ hold: "booting" });
    const log = new EventLog(store, silentLogger);
    log.transition(record("booting"));
    log.transition(record("running"));
    log.runStarted(run);
    log.runTimings("run_1", { firstByteMs: 7 });
    log.runEnded("run_1", new Date(1), "idle");
    let flushed = false;
    const flushing = log.flush().then(() => (flushed = true));
    await turn();
    expect(landed).toEqual([]); // nothing overtakes the held first write
    expect(flushed).toBe(false);
    release();
    await flushing;
    expect(landed).toEqual(["transition:booting", "transition:running", "runStarted:run_1", "runTimings:run_1:7", "runEnded:run_1:idle"]);
  });

  it("a failed write is logged, not thrown, and the writes after it still land", async () => {
    const { store, landed } = recordingStore({ fail: "snapshotting" });
    const errors: { msg: string; fields?: Record<string, unknown> }[] = [];
    const logger: Logger = { ...silentLogger, error: (msg, fields) => void errors.push({ msg, fields }) };
    const log = new EventLog(store, logger);
    expect(() => log.transition(record("snapshotting"))).not.toThrow();
    log.transition(record("hibernated"));
    await expect(log.flush()).resolves.toBeUndefined();
    expect(landed).toEqual(["transition:hibernated"]);
    expect(errors).toHaveLength(1);
    expect(errors[0]!.msg).toBe("event log write failed");
    expect((errors[0]!.fields!.err as Error).message).toBe("db down");
  });
  it("a hold keeps the writes queued after it back until it is released (a hibernation's or a wake's steps), in order, and never longer than its cap", async () => {
    const { store, landed } = recordingStore();
    const log = new EventLog(store, silentLogger);
    log.transition(record("running")); // queued before the hold: not held
    const driverDone = log.hold();
    log.transition(record("snapshotting"));
    log.runEnded("run_1", new Date(1), "idle");
    await turn();
    expect(landed).toEqual(["transition:running"]);
    driverDone();
    await log.flush();
    expect(landed).toEqual(["transition:running", "transition:snapshotting", "runEnded:run_1:idle"]);

    // A hold that never settles (a migration stuck) lets the writes through after its cap.
    log.hold(30);
    log.transition(record("hibernated"));
    await turn();
    expect(landed).not.toContain("transition:hibernated");
    const started = performance.now();
    await log.flush();
    expect(performance.now() - started).toBeGreaterThanOrEqual(20);
    expect(landed.at(-1)).toBe("transition:hibernated");

    // Released twice (its cap passed, then the driver answered): nothing is written twice.
    const release = log.hold(10);
    log.transition(record("running"));
    await log.flush();
    release();
    await log.flush();
    expect(landed.filter((l) => l === "transition:running")).toHaveLength(2);
  });
});

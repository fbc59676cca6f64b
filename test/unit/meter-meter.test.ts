// Meter cutting rules with a manual clock and an in-memory spool: heartbeats, reasons, continuity, wall-clock jumps, rounding.
import { describe, expect, it } from "vitest";
import { ManualClock, type Clock } from "../../lib/clock.ts";
import { Meter } from "../../fleet-agent/meter/meter.ts";
import type { MeterSegment } from "../../contracts/meter.ts";
import type { SegmentLog } from "../../fleet-agent/meter/spool.ts";
import type { ActivityStart } from "../../fleet-agent/activity.ts";

class MemorySpool implements SegmentLog {
  segments: MeterSegment[] = [];
  seqs = new Map<string, number>();
  forgotten: string[] = [];
  closed = false;
  nextSeq(vmId: string): number {
    const n = (this.seqs.get(vmId) ?? -1) + 1;
    this.seqs.set(vmId, n);
    return n;
  }
  append(s: MeterSegment): void {
    this.segments.push(s);
  }
  forget(vmId: string): void {
    this.forgotten.push(vmId);
  }
  async close(): Promise<void> {
    this.closed = true;
  }
}

const startWall = Date.UTC(2026, 2, 1, 12, 0, 0);

function start(clock: Clock, over: Partial<ActivityStart> = {}): ActivityStart {
  return {
    at: clock.now(),
    mono: clock.monotonic(),
    hostId: "host_1",
    vmId: "vm_1",
    agentId: "agt_1",
    tenantId: "ten_1",
    runId: "run_1",
    vcpus: 2,
    memMiB: 512,
    reason: "request",
    ...over,
  };
}

const span = (s: MeterSegment) => [Date.parse(s.startedAt) - startWall, Date.parse(s.endedAt) - startWall, s.startReason, s.endReason];

describe("Meter", () => {
  it("cuts a run at every heartbeat and at the end, with the wake reason first and heartbeat after", () => {
    const clock = new ManualClock(startWall);
    const spool = new MemorySpool();
    const meter = new Meter({ hostId: "host_1", clock, spool, heartbeatMs: 10_000 });
    meter.active(start(clock));
    clock.advance(25_000);
    meter.inactive({ at: clock.now(), mono: clock.monotonic(), vmId: "vm_1", reason: "idle" });
    expect(spool.segments.map(span)).toEqual([
      [0, 10_000, "request", "heartbeat"],
      [10_000, 20_000, "heartbeat", "heartbeat"],
      [20_000, 25_000, "heartbeat", "idle"],
    ]);
    expect(spool.segments.map((s) => s.id)).toEqual(["host_1:vm_1:0", "host_1:vm_1:1", "host_1:vm_1:2"]);
    expect(spool.segments[0]).toMatchObject({
      tenantId: "ten_1",
      agentId: "agt_1",
      runId: "run_1",
      vcpus: 2,
      memMiB: 512,
      hostId: "host_1",
      vmId: "vm_1",
      seq: 0,
    });
    // no timer left: time passing adds nothing
    clock.advance(60_000);
    expect(spool.segments).toHaveLength(3);
    expect(meter.activeVms).toEqual([]);
  });

  it("measures with the monotonic clock, so setting the wall clock mid-run neither adds nor removes time", () => {
    const manual = new ManualClock(startWall);
    let jump = 0;
    const clock: Clock = { now: () => manual.now() + jump, monotonic: () => manual.monotonic(), setTimeout: (fn, ms) => manual.setTimeout(fn, ms) };
    const spool = new MemorySpool();
    const meter = new Meter({ hostId: "host_1", clock, spool, heartbeatMs: 10_000 });
    meter.active(start(clock));
    manual.advance(12_000);
    jump = -3_600_000; // NTP steps the wall clock back an hour
    manual.advance(13_000);
    jump = +7_200_000;
    meter.inactive({ at: clock.now(), mono: clock.monotonic(), vmId: "vm_1", reason: "api" });
    expect(spool.segments.map(span)).toEqual([
      [0, 10_000, "request", "heartbeat"],
      [10_000, 20_000, "heartbeat", "heartbeat"],
      [20_000, 25_000, "heartbeat", "api"],
    ]);
  });

  it("rounds fractional monotonic readings without drift: segments touch and sum to the rounded total", () => {
    let mono = 1000.37;
    const timers: { at: number; fn: () => void }[] = [];
    const clock: Clock = {
      now: () => startWall,
      monotonic: () => mono,
      setTimeout: (fn, ms) => {
        const t = { at: mono + ms, fn };
        timers.push(t);
        return { cancel: () => void timers.splice(timers.indexOf(t), 1) };
      },
    };
    const spool = new MemorySpool();
    const meter = new Meter({ hostId: "host_1", clock, spool, heartbeatMs: 1000 });
    meter.active(start(clock));
    for (let i = 0; i < 50; i++) {
      const t = timers.shift()!;
      mono = t.at + 0.61; // timers fire a little late, at fractional times
      t.fn();
    }
    mono += 123.456;
    meter.inactive({ at: startWall, mono, vmId: "vm_1", reason: "idle" });
    const spans = spool.segments.map((s) => [Date.parse(s.startedAt), Date.parse(s.endedAt)] as const);
    for (let i = 1; i < spans.length; i++) expect(spans[i]![0]).toBe(spans[i - 1]![1]);
    expect(spans.at(-1)![1] - spans[0]![0]).toBe(Math.round(mono - 1000.37));
  });

  it("closes open segments with shutdown on stop, and ignores duplicate or unknown transitions", async () => {
    const clock = new ManualClock(startWall);
    const spool = new MemorySpool();
    const meter = new Meter({ hostId: "host_1", clock, spool, heartbeatMs: 10_000 });
    meter.inactive({ at: clock.now(), mono: clock.monotonic(), vmId: "vm_x", reason: "idle" });
    meter.active(start(clock));
    clock.advance(3_000);
    meter.active(start(clock)); // same run again: nothing changes
    meter.active(start(clock, { vmId: "vm_2", runId: "run_2", reason: "webhook" }));
    clock.advance(4_000);
    await meter.stop();
    expect(spool.segments.map((s) => [s.vmId, ...span(s)])).toEqual([
      ["vm_1", 0, 7_000, "request", "shutdown"],
      ["vm_2", 3_000, 7_000, "webhook", "shutdown"],
    ]);
    expect(spool.closed).toBe(true);
    meter.active(start(clock, { vmId: "vm_3" }));
    expect(meter.activeVms).toEqual([]);
  });

  it("continues seamlessly when a VM's run changes while it stays active, and forgets deleted VMs", () => {
    const clock = new ManualClock(startWall);
    const spool = new MemorySpool();
    spool.seqs.set("vm_1", 41); // a restarted meter continues the VM's sequence
    const meter = new Meter({ hostId: "host_1", clock, spool, heartbeatMs: 10_000 });
    meter.active(start(clock));
    clock.advance(4_000.4);
    meter.active(start(clock, { runId: "run_2", reason: "api" }));
    clock.advance(2_000);
    meter.inactive({ at: clock.now(), mono: clock.monotonic(), vmId: "vm_1", reason: "delete" });
    expect(spool.segments.map((s) => [s.id, s.runId, ...span(s)])).toEqual([
      ["host_1:vm_1:42", "run_1", 0, 4_000, "request", "heartbeat"],
      ["host_1:vm_1:43", "run_2", 4_000, 6_000, "api", "delete"],
    ]);
    expect(spool.forgotten).toEqual(["vm_1"]);
  });

  it("drops zero-length segments instead of spooling empty intervals", () => {
    const clock = new ManualClock(startWall);
    const spool = new MemorySpool();
    const meter = new Meter({ hostId: "host_1", clock, spool, heartbeatMs: 10_000 });
    meter.active(start(clock));
    meter.inactive({ at: clock.now(), mono: clock.monotonic(), vmId: "vm_1", reason: "crash" });
    expect(spool.segments).toEqual([]);
  });
});

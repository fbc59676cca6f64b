// Meter cutting rules with a manual clock and an in-memory spool: heartbeats, reasons, continuity, wall-clock jumps, rounding, dozing.
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

  describe("dozing", () => {
    const doze = (clock: Clock, dozing: boolean, vmId = "vm_1") => ({ at: clock.now(), mono: clock.monotonic(), vmId, dozing });
    const withState = (s: MeterSegment) => [...span(s), s.state ?? "active"];

    it("cuts active → dozing → active at the doze and the resume, heartbeats keep the state, and the segments touch", () => {
      const clock = new ManualClock(startWall);
      const spool = new MemorySpool();
      const meter = new Meter({ hostId: "host_1", clock, spool, heartbeatMs: 10_000 });
      meter.active(start(clock));
      clock.advance(3_000);
      meter.doze(doze(clock, true));
      clock.advance(14_000); // one heartbeat while dozing (the heartbeat restarts at the doze)
      meter.doze(doze(clock, false));
      clock.advance(2_500);
      meter.inactive({ at: clock.now(), mono: clock.monotonic(), vmId: "vm_1", reason: "idle" });
      expect(spool.segments.map(withState)).toEqual([
        [0, 3_000, "request", "doze", "active"],
        [3_000, 13_000, "doze", "heartbeat", "dozing"],
        [13_000, 17_000, "heartbeat", "resume", "dozing"],
        [17_000, 19_500, "resume", "idle", "active"],
      ]);
      for (let i = 1; i < spool.segments.length; i++) expect(spool.segments[i]!.startedAt).toBe(spool.segments[i - 1]!.endedAt);
      expect(spool.segments.map((s) => s.seq)).toEqual([0, 1, 2, 3]);
    });

    it("writes no state on active segments: their bodies are exactly those of a meter without dozing", () => {
      const clock = new ManualClock(startWall);
      const spool = new MemorySpool();
      const meter = new Meter({ hostId: "host_1", clock, spool, heartbeatMs: 10_000 });
      meter.active(start(clock));
      clock.advance(1_000);
      meter.doze(doze(clock, true));
      clock.advance(1_000);
      meter.doze(doze(clock, false));
      clock.advance(1_000);
      meter.inactive({ at: clock.now(), mono: clock.monotonic(), vmId: "vm_1", reason: "idle" });
      const [first, dozing, last] = spool.segments;
      expect(Object.keys(first!)).not.toContain("state");
      expect(Object.keys(last!)).not.toContain("state");
      expect(dozing!.state).toBe("dozing");
      expect(JSON.stringify(first)).toBe(
        JSON.stringify({
          id: "host_1:vm_1:0",
          hostId: "host_1",
          vmId: "vm_1",
          seq: 0,
          tenantId: "ten_1",
          agentId: "agt_1",
          runId: "run_1",
          startedAt: new Date(startWall).toISOString(),
          endedAt: new Date(startWall + 1_000).toISOString(),
          vcpus: 2,
          memMiB: 512,
          startReason: "request",
          endReason: "doze",
        }),
      );
    });

    it("ends a dozing run with the sleep reason (or shutdown), ignores repeats and VMs it does not meter", async () => {
      const clock = new ManualClock(startWall);
      const spool = new MemorySpool();
      const meter = new Meter({ hostId: "host_1", clock, spool, heartbeatMs: 10_000 });
      meter.doze(doze(clock, true, "vm_x")); // not metered: nothing happens
      meter.active(start(clock));
      meter.active(start(clock, { vmId: "vm_2", runId: "run_2" }));
      clock.advance(2_000);
      meter.doze(doze(clock, true));
      meter.doze(doze(clock, true, "vm_2"));
      clock.advance(1_000);
      meter.doze(doze(clock, true)); // already dozing: no cut
      meter.doze(doze(clock, false, "vm_x"));
      clock.advance(1_000);
      meter.inactive({ at: clock.now(), mono: clock.monotonic(), vmId: "vm_1", reason: "api" });
      clock.advance(500);
      await meter.stop();
      expect(spool.segments.map((s) => [s.vmId, ...withState(s)])).toEqual([
        ["vm_1", 0, 2_000, "request", "doze", "active"],
        ["vm_2", 0, 2_000, "request", "doze", "active"],
        ["vm_1", 2_000, 4_000, "doze", "api", "dozing"],
        ["vm_2", 2_000, 4_500, "doze", "shutdown", "dozing"],
      ]);
    });

    it("keeps the wake reason on the run's first segment when it dozes at the wake's millisecond, and rounds like any cut", () => {
      const clock = new ManualClock(startWall);
      const spool = new MemorySpool();
      const meter = new Meter({ hostId: "host_1", clock, spool, heartbeatMs: 10_000 });
      meter.active(start(clock, { reason: "webhook" }));
      meter.doze(doze(clock, true));
      clock.advance(1_000.4);
      meter.doze(doze(clock, false));
      meter.doze(doze(clock, true)); // a resume and a doze in one millisecond: no empty segment
      clock.advance(999.7);
      meter.doze(doze(clock, false));
      clock.advance(5_000);
      meter.inactive({ at: clock.now(), mono: clock.monotonic(), vmId: "vm_1", reason: "idle" });
      expect(spool.segments.map(withState)).toEqual([
        [0, 1_000, "webhook", "resume", "dozing"],
        [1_000, 2_000, "doze", "resume", "dozing"],
        [2_000, 7_000, "resume", "idle", "active"],
      ]);
    });

    it("a dozing VM whose run changes goes on dozing in the new run", () => {
      const clock = new ManualClock(startWall);
      const spool = new MemorySpool();
      const meter = new Meter({ hostId: "host_1", clock, spool, heartbeatMs: 10_000 });
      meter.active(start(clock));
      clock.advance(1_000);
      meter.doze(doze(clock, true));
      clock.advance(1_000);
      meter.active(start(clock, { runId: "run_2", reason: "api" }));
      clock.advance(1_000);
      meter.doze(doze(clock, false));
      clock.advance(1_000);
      meter.inactive({ at: clock.now(), mono: clock.monotonic(), vmId: "vm_1", reason: "idle" });
      expect(spool.segments.map((s) => [s.runId, ...withState(s)])).toEqual([
        ["run_1", 0, 1_000, "request", "doze", "active"],
        ["run_1", 1_000, 2_000, "doze", "heartbeat", "dozing"],
        ["run_2", 2_000, 3_000, "api", "resume", "dozing"],
        ["run_2", 3_000, 4_000, "resume", "idle", "active"],
      ]);
    });
  });
});

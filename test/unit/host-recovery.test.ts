// Crash recovery's rules over the in-memory store: where a cut-off run ends, what the event log and the agent's row
// get, whose rows are left alone; and the meter's last awake instant a rollback after the crash reports.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { Meter, SegmentSpool } from "../../fleet-agent/meter/index.ts";
import { ManualClock } from "../../lib/clock.ts";
import { silentLogger } from "../../lib/log.ts";
import { vmIdFor } from "../../fleet-agent/host.ts";
import { recoverCrashes, type RecoveryDeps } from "../../fleet-agent/recovery.ts";
import { createMemoryHostStore, type MemoryHostStore } from "../../fleet-agent/store.ts";

const T = Date.parse("2026-03-01T10:00:00.000Z");

function setup(rows: { id: string; state: string; hostId?: string }[]) {
  const store = createMemoryHostStore();
  for (const r of rows) store.agentRows.set(r.id, { id: r.id, tenantId: "ten_1", state: r.state, hostId: r.hostId ?? "host_a" });
  return store;
}

function run(store: MemoryHostStore, id: string, agentId: string, wokeAt: number, ended?: { at: number; reason: string }) {
  store.runs.set(id, {
    id,
    agentId,
    tenantId: "ten_1",
    hostId: "host_a",
    vmId: vmIdFor(agentId),
    wokeAt: new Date(wokeAt),
    wakeReason: "request",
    wakeMode: "restore",
    timings: {},
    ...(ended ? { sleptAt: new Date(ended.at), sleepReason: ended.reason } : {}),
  });
}

function deps(store: MemoryHostStore, over: Partial<RecoveryDeps> = {}): RecoveryDeps {
  return {
    hostId: "host_a",
    store,
    vmIdFor,
    lastAwakeAt: () => undefined,
    known: () => false,
    startedAt: new Date(T + 60_000),
    clock: new ManualClock(T + 60_000),
    log: silentLogger,
    ...over,
  };
}

describe("crash recovery", () => {
  it("ends an open run at the meter's last instant, writes running → stopped (crash), sets the row; falls back to the wake", async () => {
    const store = setup([
      { id: "agt_a", state: "running" },
      { id: "agt_b", state: "running" },
    ]);
    run(store, "run_a", "agt_a", T);
    run(store, "run_b", "agt_b", T + 1000);
    const r = await recoverCrashes(deps(store, { lastAwakeAt: (vm, runId) => (vm === vmIdFor("agt_a") && runId === "run_a" ? T + 25_000 : undefined) }));
    expect(r).toMatchObject({ runsClosed: 2, agents: 2 });
    expect(store.runs.get("run_a")).toMatchObject({ sleptAt: new Date(T + 25_000), sleepReason: "crash" });
    expect(store.runs.get("run_b")).toMatchObject({ sleptAt: new Date(T + 1000), sleepReason: "crash" }); // never metered: its wake
    expect(store.crashes.find((c) => c.agentId === "agt_a")).toMatchObject({ fromState: "running", toState: "stopped", runId: "run_a", setAgentState: true });
    expect(store.agentRows.get("agt_a")?.state).toBe("stopped");
  });

  it("runs woken after the start and agents the host has are left alone", async () => {
    const store = setup([
      { id: "agt_a", state: "running" },
      { id: "agt_k", state: "running" },
    ]);
    run(store, "run_a", "agt_a", T + 5000);
    run(store, "run_new", "agt_a", T + 61_000); // this process's own
    run(store, "run_k", "agt_k", T);
    await recoverCrashes(deps(store, { known: (id) => id === "agt_k" }));
    expect(store.runs.get("run_a")?.sleptAt).toEqual(new Date(T + 5000));
    expect(store.runs.get("run_new")?.sleptAt).toBeUndefined();
    expect(store.runs.get("run_k")?.sleptAt).toBeUndefined();
    expect(store.crashes.map((c) => c.agentId)).toEqual(["agt_a"]);
  });

  it("an agent that moved to another host keeps its row; an agent cut off mid-wake with no run gets the crash event", async () => {
    const store = setup([
      { id: "agt_m", state: "running", hostId: "host_b" },
      { id: "agt_w", state: "restoring" },
      { id: "agt_h", state: "hibernated" },
    ]);
    run(store, "run_m", "agt_m", T);
    await recoverCrashes(deps(store));
    expect(store.runs.get("run_m")?.sleepReason).toBe("crash");
    expect(store.crashes.find((c) => c.agentId === "agt_m")).toMatchObject({ fromState: "running", toState: "stopped", setAgentState: false });
    expect(store.agentRows.get("agt_m")?.state).toBe("running");
    expect(store.crashes.find((c) => c.agentId === "agt_w")).toMatchObject({ fromState: "restoring", toState: "stopped", runId: null, runs: [] });
    expect(store.agentRows.get("agt_w")?.state).toBe("stopped");
    expect(store.crashes.some((c) => c.agentId === "agt_h")).toBe(false);
  });

  it("the meter's last awake instant of a run: its last segment's end across a reopen, nothing for another run of the VM", async () => {
    const dir = mkdtempSync(join(tmpdir(), "recovery-meter-"));
    try {
      const clock = new ManualClock(T);
      const first = new Meter({ hostId: "host_a", clock, spool: SegmentSpool.open(dir), heartbeatMs: 1000 });
      first.active({
        at: T,
        mono: clock.monotonic(),
        hostId: "host_a",
        vmId: "vm_a",
        agentId: "agt_a",
        tenantId: "ten_1",
        runId: "run_1",
        vcpus: 1,
        memMiB: 256,
        reason: "request",
      });
      clock.advance(2500); // two heartbeats, then a "crash": no stop
      const again = new Meter({ hostId: "host_a", clock, spool: SegmentSpool.open(dir) });
      expect(again.lastAwakeAt("vm_a", "run_1")).toBe(T + 2000);
      expect(again.lastAwakeAt("vm_a", "run_2")).toBeUndefined();
      expect(again.lastAwakeAt("vm_b", "run_1")).toBeUndefined();
      await again.stop();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

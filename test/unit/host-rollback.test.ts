// Rollbacks told by the wake, with an injected clock and a snapshotting driver over real state directories: a restore of
// a snapshot older than the agent's last run says what it lost (x-wake-rollback's figure, the run's timings, the
// running transition), whether that run ended with the host killed, its VM crashed or a failed hibernation at
// shutdown; a restore of a snapshot taken after the last run says nothing.
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ManualClock } from "../../lib/clock.ts";
import { silentLogger } from "../../lib/log.ts";
import { Host, vmIdFor } from "../../fleet-agent/host.ts";
import { createMemoryHostStore, type MemoryHostStore } from "../../fleet-agent/store.ts";
import type { BootResult, RunningVm, SnapshotResult, VmDriver, VmExit, VmSpec, WakeResult } from "../../fleet-agent/drivers/driver.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import type { ActivityListener } from "../../fleet-agent/activity.ts";

const T = Date.parse("2026-03-01T10:00:00.000Z");
const heartbeatMs = 10_000;

/** A driver whose snapshot is a time: hibernate takes one (unless told to fail), wake restores the last one, a crash is an exit. */
class SnapshotDriver implements VmDriver {
  readonly name = "qemu" as const;
  readonly isolated = true;
  /** Per VM: when its snapshot was taken (kept across host "restarts": the test passes the same driver on). */
  readonly snapshots = new Map<string, number>();
  failHibernate = false;
  private readonly exits = new Map<string, (e: VmExit) => void>();
  private readonly clock: ManualClock;
  constructor(clock: ManualClock) {
    this.clock = clock;
  }

  private vm(spec: VmSpec): RunningVm {
    mkdirSync(spec.stateDir, { recursive: true });
    return { spec, endpoint: { host: "127.0.0.1", port: 1 }, pid: 1 };
  }
  async boot(spec: VmSpec): Promise<BootResult> {
    return { vm: this.vm(spec), bootMs: 5 };
  }
  async hibernate(vm: RunningVm): Promise<SnapshotResult> {
    if (this.failHibernate) throw new Error("no space left on device");
    this.snapshots.set(vm.spec.vmId, this.clock.now());
    return { completed: true, snapshotMs: 1, bytes: 100 };
  }
  async wake(spec: VmSpec): Promise<WakeResult> {
    const at = this.snapshots.get(spec.vmId);
    if (at === undefined)
      return {
        ...(await this.boot(spec)),
        mode: "boot",
        timings: { restoreMs: 0, bootMs: 5, clockFixMs: 0, skewBeforeMs: 0, skewAfterMs: 0 },
        fallbackReason: "no snapshot",
      };
    return { vm: this.vm(spec), mode: "restore", timings: { restoreMs: 3, clockFixMs: 1, skewBeforeMs: 0, skewAfterMs: 0 }, snapshotAt: at };
  }
  async stop() {}
  async destroy() {}
  async cpuSeconds() {
    return 0;
  }
  async guestLeases() {
    return 0;
  }
  onExit(vm: RunningVm, l: (e: VmExit) => void) {
    this.exits.set(vm.spec.vmId, l);
  }
  crash(vmId: string) {
    this.exits.get(vmId)?.({ code: null, signal: "SIGKILL" });
  }
  logPath(spec: VmSpec): string {
    return join(spec.stateDir, "qemu.log");
  }
  async reap() {}
  async close() {}
}

const spec: AgentSpec = {
  id: "agt_rollback1",
  tenantId: "ten_a",
  image: "demo",
  vcpus: 1,
  memMiB: 256,
  idleTimeoutMs: 600_000,
  streamIdleMs: 2000,
  allowEgress: false,
};

const vmId = vmIdFor(spec.id);
let vmsDir: string;
let clock: ManualClock;
let driver: SnapshotDriver;
let store: MemoryHostStore;
/** The meter's last awake instant per run, as the spool would answer it. */
let metered: Map<string, number>;

beforeEach(() => {
  vmsDir = mkdtempSync(join(tmpdir(), "host-rollback-"));
  clock = new ManualClock(T);
  driver = new SnapshotDriver(clock);
  store = createMemoryHostStore();
  metered = new Map();
});
afterEach(() => rmSync(vmsDir, { recursive: true, force: true }));

/** A host process over the same state directories (a restart is a new one; the old one is simply dropped, as a kill leaves it). */
function startHost(): Host {
  const activity: ActivityListener = { active() {}, inactive() {}, lastAwakeAt: (_vmId, runId) => metered.get(runId) };
  return new Host({
    config: {
      hostId: "host_t",
      vmsDir,
      wakeQueueLimit: 10,
      wakeDeadlineMs: 1000,
      reaperIntervalMs: 100,
      cpuBusyThreshold: 0.2,
      drainTimeoutMs: 0,
      meterHeartbeatMs: heartbeatMs,
    },
    driver,
    store,
    clock,
    log: silentLogger,
    activity,
  });
}

/** Wakes the agent for one call and answers what the call's wake said. */
async function call(host: Host) {
  const t = await host.acquire(spec, "request");
  t.release();
  return t.wake;
}

/** Boot, then a hibernation (the snapshot, at T+1 s), then a wake from it at T+2 s: the run that is then lost. */
async function runOnSnapshot(host: Host): Promise<string> {
  expect((await call(host)).wake).toBe("boot");
  clock.advance(1000);
  await host.hibernateNow(spec.id);
  clock.advance(1000);
  const woke = await call(host);
  expect(woke).toMatchObject({ wake: "restore" });
  expect(woke.timings.rollbackMs).toBeUndefined(); // the snapshot is newer than the boot's run
  return woke.runId;
}

async function runningEvent(host: Host) {
  await host.flush();
  return store.transitions.filter((t) => t.agentId === spec.id && t.toState === "running").at(-1)!;
}

describe("rollbacks", () => {
  it("host killed within the run's first heartbeat: the next restore tells it, estimated up to the restart", async () => {
    const first = startHost();
    const lost = await runOnSnapshot(first);
    clock.advance(2000); // killed 2 s after the wake, before the meter's first cut (none recorded)
    const second = startHost();
    clock.advance(500);
    const woke = await call(second);
    expect(woke).toMatchObject({ wake: "restore", timings: { rollbackMs: 2000 } }); // the wake until the restart
    const ev = await runningEvent(second);
    expect(ev.timings).toMatchObject({ rollbackMs: 2000 });
    expect(ev.detail).toMatchObject({ rollback: { rollbackMs: 2000, lostRunId: lost, estimated: true, snapshotAt: new Date(T + 1000).toISOString() } });
    expect(store.runs.get(woke.runId)?.timings).toMatchObject({ rollbackMs: 2000 });
  });

  it("an estimate is bounded by the heartbeat: the meter would have cut a segment", async () => {
    const first = startHost();
    await runOnSnapshot(first);
    clock.advance(60_000);
    const second = startHost();
    expect((await call(second)).timings.rollbackMs).toBe(heartbeatMs);
  });

  it("host killed later: the meter's last instant of the run", async () => {
    const first = startHost();
    const lost = await runOnSnapshot(first);
    metered.set(lost, T + 2000 + 25_000);
    clock.advance(30_000);
    const second = startHost();
    const woke = await call(second);
    expect(woke.timings.rollbackMs).toBe(25_000);
    expect((await runningEvent(second)).detail).toMatchObject({ rollback: { lostRunId: lost, lastAwakeAt: new Date(T + 27_000).toISOString() } });
  });

  it("the VM crashed while awake, no restart: the next call's restore tells what the run did, once", async () => {
    const host = startHost();
    const lost = await runOnSnapshot(host);
    clock.advance(7000);
    driver.crash(vmId);
    expect(host.status(spec.id)?.state).toBe("failed");
    clock.advance(3000);
    const woke = await call(host);
    expect(woke).toMatchObject({ wake: "restore", timings: { rollbackMs: 7000 } });
    expect((await runningEvent(host)).detail).toMatchObject({ rollback: { rollbackMs: 7000, lostRunId: lost } });
    expect((await runningEvent(host)).detail).not.toHaveProperty("rollback.estimated");
    // the next hibernation and wake lose nothing
    clock.advance(1000);
    await host.hibernateNow(spec.id);
    expect((await call(host)).timings.rollbackMs).toBeUndefined();
  });

  it("a failed hibernation at shutdown, then a restart: the restore of the older snapshot tells the run's time", async () => {
    const first = startHost();
    const lost = await runOnSnapshot(first);
    clock.advance(4000);
    driver.failHibernate = true;
    await first.stop();
    expect(driver.snapshots.get(vmId)).toBe(T + 1000); // the older one is kept
    driver.failHibernate = false;
    clock.advance(60_000);
    const second = startHost();
    const woke = await call(second);
    expect(woke).toMatchObject({ wake: "restore", timings: { rollbackMs: 4000 } });
    expect((await runningEvent(second)).detail).toMatchObject({ rollback: { lostRunId: lost, lastAwakeAt: new Date(T + 6000).toISOString() } });
  });

  it("no rollback after a hibernation or a clean shutdown", async () => {
    const first = startHost();
    await runOnSnapshot(first);
    clock.advance(4000);
    await first.stop(); // hibernates: a snapshot newer than the run
    const second = startHost();
    clock.advance(1000);
    expect((await call(second)).timings.rollbackMs).toBeUndefined();
    clock.advance(1000);
    await second.hibernateNow(spec.id);
    expect((await call(second)).timings.rollbackMs).toBeUndefined();
  });
});

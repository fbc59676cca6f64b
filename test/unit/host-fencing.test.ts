// Fencing on the host: a call of an older lease generation is refused, a newer one discards the stale copy, and `fence`
// stops the agents the database gives to another host (no snapshot, no transition on their rows, the meter closed):
// every awake copy each time, the sleeping ones in turns.
import { afterEach, describe, expect, it } from "vitest";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ManualClock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import { silentLogger } from "../../lib/log.ts";
import { Host } from "../../fleet-agent/host.ts";
import { createMemoryHostStore } from "../../fleet-agent/store.ts";
import type { BootResult, RunningVm, SnapshotResult, VmDriver, VmSpec, WakeResult } from "../../fleet-agent/drivers/driver.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import type { ActivityEnd } from "../../fleet-agent/activity.ts";
import { Fencing } from "../../fleet-agent/host/fencing.ts";
import type { HostFs } from "../../fleet-agent/host-fs.ts";
import type { VmEntry } from "../../fleet-agent/vm-entry.ts";

class CountingDriver implements VmDriver {
  readonly name = "process" as const;
  readonly isolated = false;
  boots = 0;
  wakes = 0;
  hibernates = 0;
  stops = 0;
  reaped: string[] = [];
  destroyed: string[] = [];
  logPath(spec: VmSpec): string {
    return join(spec.stateDir, "workload.log");
  }
  async boot(spec: VmSpec): Promise<BootResult> {
    this.boots++;
    mkdirSync(spec.stateDir, { recursive: true });
    return { vm: { spec, endpoint: { host: "127.0.0.1", port: 1 }, pid: 1 }, bootMs: 1 };
  }
  async hibernate(): Promise<SnapshotResult> {
    this.hibernates++;
    return { completed: true, snapshotMs: 1, bytes: 1 };
  }
  async wake(spec: VmSpec): Promise<WakeResult> {
    this.wakes++;
    return {
      vm: { spec, endpoint: { host: "127.0.0.1", port: 1 }, pid: 1 },
      mode: "restore",
      timings: { restoreMs: 1, clockFixMs: 0, skewBeforeMs: 0, skewAfterMs: 0 },
    };
  }
  async stop(_vm: RunningVm) {
    this.stops++;
  }
  async destroy(spec: VmSpec) {
    this.destroyed.push(spec.agentId);
  }
  async cpuSeconds() {
    return 0;
  }
  async guestLeases() {
    return 0;
  }
  onExit() {}
  async reap(spec: VmSpec) {
    this.reaped.push(spec.agentId);
  }
  async close() {}
}

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** A host over `vmsDir` with a counting driver (or the given parts). */
function hostOn(vmsDir: string, parts: Partial<ConstructorParameters<typeof Host>[0]> = {}): Host {
  return new Host({
    config: { hostId: "host_old", vmsDir, wakeQueueLimit: 10, wakeDeadlineMs: 1000, reaperIntervalMs: 100, cpuBusyThreshold: 0.2, drainTimeoutMs: 0 },
    driver: new CountingDriver(),
    store: createMemoryHostStore(),
    clock: new ManualClock(),
    log: silentLogger,
    activity: { active() {}, inactive() {} },
    ...parts,
  });
}

function setup() {
  const root = mkdtempSync(join(tmpdir(), "agentvm-fence-"));
  dirs.push(root);
  const vmsDir = join(root, "vms");
  const driver = new CountingDriver();
  const store = createMemoryHostStore();
  const ends: ActivityEnd[] = [];
  const host = hostOn(vmsDir, { driver, store, activity: { active() {}, inactive: (e) => void ends.push(e) } });
  return { vmsDir, driver, store, host, ends };
}

const spec = (generation?: number): AgentSpec => ({
  id: "agt_fence0001",
  tenantId: "ten_a",
  image: "demo",
  vcpus: 1,
  memMiB: 256,
  idleTimeoutMs: 60_000,
  streamIdleMs: 2000,
  allowEgress: false,
  ...(generation === undefined ? {} : { generation }),
});

describe("host fencing by lease generation", () => {
  it("refuses a call of an older generation than the one it runs the agent under (503, retry)", async () => {
    const { host } = setup();
    (await host.acquire(spec(3), "request")).release();
    const err = await host.acquire(spec(2), "request").catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AppError);
    expect(err).toMatchObject({ code: "host_unavailable", status: 503, retryAfterS: 1 });
    expect((err as Error).message).toMatch(/generation 3.*carries 2/);
  });

  it("a newer generation stops the stale copy without a snapshot and starts afresh; the generation survives a restart", async () => {
    const { host, driver, vmsDir, ends } = setup();
    (await host.acquire(spec(1), "request")).release();
    expect(driver.boots).toBe(1);
    const moved = await host.acquire(spec(2), "request");
    moved.release();
    expect(driver.stops).toBe(1);
    expect(driver.hibernates).toBe(0); // never a snapshot of a copy that is not the agent's any more
    expect(ends.map((e) => e.reason)).toEqual(["moved"]);
    expect(driver.boots).toBe(2);
    expect(moved.wake.wake).toBe("boot");
    expect(existsSync(join(vmsDir, "..", "leases", "agt_fence0001"))).toBe(true);

    // A second host process on the same directory knows generation 2: a call of 1 is stale.
    const again = hostOn(vmsDir);
    await expect(again.acquire(spec(1), "request")).rejects.toMatchObject({ code: "host_unavailable" });
  });

  it("fence stops the agents the database gives to another host or a newer generation, and leaves its own alone", async () => {
    const { host, driver, store, vmsDir, ends } = setup();
    const mine: AgentSpec = { ...spec(1), id: "agt_fence0002" };
    (await host.acquire(spec(1), "request")).release();
    (await host.acquire(mine, "request")).release();
    await host.flush();
    const before = store.transitions.length;
    store.owned.set("agt_fence0001", { hostId: "host_new", generation: 2, deleted: false });
    store.owned.set("agt_fence0002", { hostId: "host_old", generation: 1, deleted: false });
    expect(await host.fence()).toBe(1);
    expect(host.status("agt_fence0001")).toBeUndefined();
    expect(host.status("agt_fence0002")?.state).toBe("running");
    expect(driver.stops).toBe(1);
    expect(driver.hibernates).toBe(0);
    expect(ends.map((e) => e.reason)).toEqual(["moved"]);
    expect(existsSync(join(vmsDir, "agt_fence0001"))).toBe(false);
    await host.flush();
    expect(store.transitions.length).toBe(before); // no state of ours reaches a row that is another host's
    expect(store.runs.get([...store.runs.values()].find((r) => r.agentId === "agt_fence0001")!.id)?.sleepReason).toBe("moved");
  });

  it("the first fence after a start removes the state directories of agents that moved while the host was down", async () => {
    const { host, driver, store, vmsDir } = setup();
    for (const id of ["agt_movedaway1", "agt_stayshere1"]) {
      mkdirSync(join(vmsDir, id), { recursive: true });
      writeFileSync(join(vmsDir, id, "snapshot.json"), "{}");
    }
    store.owned.set("agt_movedaway1", { hostId: "host_new", generation: 1, deleted: false });
    store.owned.set("agt_stayshere1", { hostId: "host_old", generation: 0, deleted: false });
    expect(await host.fence()).toBe(1);
    expect(driver.reaped).toContain("agt_movedaway1");
    expect(existsSync(join(vmsDir, "agt_movedaway1"))).toBe(false);
    expect(existsSync(join(vmsDir, "agt_stayshere1", "snapshot.json"))).toBe(true);
  });
});

describe("host start: checkpoint directories without a live row", () => {
  it("are removed (a crash between a checkpoint's rename and its row, an agent deleted while its host was down); live ones stay", async () => {
    const root = mkdtempSync(join(tmpdir(), "agentvm-ckpsweep-"));
    dirs.push(root);
    const vmsDir = join(root, "vms");
    const checkpointsDir = join(root, "checkpoints");
    for (const id of ["ckp_live00000001", "ckp_orphan000001", "ckp_deleted00001"]) mkdirSync(join(checkpointsDir, id), { recursive: true });
    mkdirSync(join(checkpointsDir, "ckp_half00000001.tmp-abc"), { recursive: true });
    const asked: string[][] = [];
    const store = {
      insert: async () => undefined,
      get: async () => undefined,
      nameTaken: async () => false,
      markDeleted: async () => false,
      deleteOfAgent: async () => [],
      forkedFrom: async () => undefined,
      liveOf: async (ids: readonly string[]) => (asked.push([...ids].sort()), new Set(ids.filter((id) => id === "ckp_live00000001"))),
    };
    const host = hostOn(vmsDir, { checkpoints: store });
    await host.start();
    await host.stop();
    expect(asked).toEqual([["ckp_deleted00001", "ckp_live00000001", "ckp_orphan000001"]]);
    expect(existsSync(join(checkpointsDir, "ckp_live00000001"))).toBe(true);
    for (const gone of ["ckp_orphan000001", "ckp_deleted00001", "ckp_half00000001.tmp-abc"]) expect(existsSync(join(checkpointsDir, gone))).toBe(false);
  });
});

describe("host: work on a hibernated agent's snapshot (the shipper's checkpoint step)", () => {
  it("runs only while the agent is still hibernated; one woken since is refused, its next hibernation commits", async () => {
    const { host } = setup();
    (await host.acquire(spec(0), "request")).release();
    await expect(host.whileHibernated(spec().id, async () => "copied")).rejects.toMatchObject({ code: "conflict" });
    expect(await host.hibernateNow(spec().id)).toBe("hibernated");
    expect(await host.whileHibernated(spec().id, async () => "copied")).toBe("copied");
  });
});

describe("host: a wake asks who owns the agent first", () => {
  it("refuses to wake a copy the database gives to another host (a gateway's placement kept from before a move); an owner it cannot read does not hold the wake", async () => {
    const { host, driver, store } = setup();
    (await host.acquire(spec(1), "request")).release();
    expect(await host.hibernateNow(spec().id)).toBe("hibernated");
    store.owned.set(spec().id, { hostId: "host_new", generation: 2, deleted: false });
    await expect(host.acquire(spec(1), "request")).rejects.toMatchObject({ code: "host_unavailable", status: 503 });
    expect(driver.wakes).toBe(0);
    store.owned.delete(spec().id);
    (store as { owners: unknown }).owners = async () => {
      throw new Error("database away");
    };
    const woke = await host.acquire(spec(1), "request");
    expect(woke.wake.wake).toBe("restore");
    woke.release();
  });

  it("on a draining host a wake goes ahead only on its claim's answer: without one in time it is refused (503, retry), never run beside a move", async () => {
    const root = mkdtempSync(join(tmpdir(), "agentvm-fence-"));
    dirs.push(root);
    const clock = new ManualClock();
    const driver = new CountingDriver();
    const store = createMemoryHostStore();
    const host = hostOn(join(root, "vms"), { driver, store, clock });
    (await host.acquire(spec(1), "request")).release();
    expect(await host.hibernateNow(spec().id)).toBe("hibernated");
    let answer!: () => void;
    store.claimWake = () => new Promise((resolve) => (answer = () => resolve(undefined)));
    const attempt = async () => {
      const wake = host.acquire(spec(1), "request").then(
        (t) => (t.release(), "woken"),
        (e: AppError) => e.code,
      );
      let outcome: string | undefined;
      void wake.then((o) => (outcome = o));
      for (let i = 0; i < 50 && outcome === undefined; i++) {
        await new Promise((r) => setTimeout(r, 2));
        clock.advance(100);
      }
      return wake;
    };
    host.setDraining(true);
    expect(await attempt()).toBe("host_draining");
    expect(driver.wakes).toBe(0);
    answer();
    // Not draining: no gateway moves its sleeping agents, and a database that does not answer does not hold the wake.
    host.setDraining(false);
    expect(await host.hibernateNow(spec().id)).toBe("hibernated");
    expect(await attempt()).toBe("woken");
    expect(driver.wakes).toBe(1);
  });
});

describe("fence at scale", () => {
  it("asks about every awake copy each time and the sleeping ones in turns, a failed query's turn again", async () => {
    const entries = new Map<string, VmEntry>();
    const entry = (id: string, state: VmEntry["state"]) => entries.set(id, { spec: { id }, state, generation: 0 } as unknown as VmEntry);
    entry("agt_awake00001", "running");
    for (let i = 1; i <= 3; i++) entry(`agt_sleeping0${i}`, "hibernated");
    const onDisk = ["agt_ondisk0001", "agt_ondisk0002", "agt_sleeping01"];
    const asked: string[][] = [];
    let failNext = false;
    const evicted: string[] = [];
    const fencing = new Fencing({
      hostId: "host_old",
      vmsDir: "/nowhere",
      clock: new ManualClock(),
      fs: { vmDirs: () => onDisk, hasStateDir: () => true } as unknown as HostFs,
      store: {
        owners: async (ids) => {
          asked.push([...ids].sort());
          if (failNext) {
            failNext = false;
            throw new Error("database away");
          }
          // Every copy moved to another host: each is stopped (or its files discarded) on its turn.
          return new Map(ids.map((id) => [id, { hostId: "host_new", generation: 1, deleted: false }]));
        },
        claimWake: async () => undefined,
        markAsleep: async () => undefined,
      },
      events: { overtake: async () => undefined },
      vms: { get: (id) => entries.get(id), ids: () => entries.keys(), entryFor: () => undefined as unknown as VmEntry },
      generations: { read: () => 0, write: () => undefined },
      eviction: {
        evict: async (e) => void evicted.push(e.spec.id),
        discardStateDir: async (id) => void evicted.push(id),
      },
      draining: () => false,
      sleepingPerFence: 2,
    });
    expect(await fencing.fence()).toBe(3);
    expect(asked[0]).toEqual(["agt_awake00001", "agt_sleeping01", "agt_sleeping02"]);
    failNext = true;
    await expect(fencing.fence()).rejects.toThrow("database away");
    expect(await fencing.fence()).toBe(3);
    expect(await fencing.fence()).toBe(2);
    // The turn the failed query had is asked again; every awake copy is in every query, each sleeping one in one round.
    expect(asked.slice(1)).toEqual([
      ["agt_awake00001", "agt_ondisk0001", "agt_sleeping03"],
      ["agt_awake00001", "agt_ondisk0001", "agt_sleeping03"],
      ["agt_awake00001", "agt_ondisk0002"],
    ]);
    expect(evicted.filter((id) => id !== "agt_awake00001").sort()).toEqual([
      "agt_ondisk0001",
      "agt_ondisk0002",
      "agt_sleeping01",
      "agt_sleeping02",
      "agt_sleeping03",
    ]);
  });
});

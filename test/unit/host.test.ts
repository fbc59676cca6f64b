// The host's rules with an injected clock and a scripted driver: single-flight wake, queue and deadline, idle, cancel, crash.
import { describe, expect, it, vi } from "vitest";
import { ManualClock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import { silentLogger } from "../../lib/log.ts";
import { Host, type HostConfig } from "../../fleet-agent/host.ts";
import type { HostFs } from "../../fleet-agent/host-fs.ts";
import { createMemoryHostStore } from "../../fleet-agent/store.ts";
import type { BootResult, RunningVm, SnapshotResult, VmDriver, VmExit, VmSpec, WakeResult } from "../../fleet-agent/drivers/driver.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import type { ActivityEnd, ActivityStart } from "../../fleet-agent/activity.ts";
import { canTransition } from "../../fleet-agent/host/lifecycle.ts";

/** A driver whose every call is counted and can be held open until the test releases it. */
class ScriptedDriver implements VmDriver {
  readonly name = "process" as const;
  readonly isolated = false;
  boots = 0;
  wakes = 0;
  hibernates = 0;
  cpu = 0;
  leases = 0;
  gate: Promise<void> | undefined;
  hibernateGate: Promise<void> | undefined;
  failBoot = false;
  reaped: VmSpec[] = [];
  private exitListeners: ((e: VmExit) => void)[] = [];

  logPath(spec: VmSpec): string {
    return `${spec.stateDir}/workload.log`;
  }

  private vm(spec: VmSpec): RunningVm {
    return { spec, endpoint: { host: "127.0.0.1", port: 1 }, pid: 1 };
  }
  async boot(spec: VmSpec): Promise<BootResult> {
    this.boots++;
    await this.gate;
    if (this.failBoot) throw new Error("boom");
    return { vm: this.vm(spec), bootMs: 5 };
  }
  async hibernate(_vm: RunningVm, signal?: AbortSignal): Promise<SnapshotResult> {
    this.hibernates++;
    if (this.hibernateGate) {
      await Promise.race([this.hibernateGate, new Promise((r) => signal?.addEventListener("abort", r))]);
      if (signal?.aborted) return { completed: false, snapshotMs: 1, bytes: 0 };
    }
    return { completed: true, snapshotMs: 1, bytes: 100 };
  }
  async wake(spec: VmSpec): Promise<WakeResult> {
    this.wakes++;
    await this.gate;
    return { vm: this.vm(spec), mode: "restore", timings: { restoreMs: 3, clockFixMs: 1, skewBeforeMs: 9000, skewAfterMs: 1 } };
  }
  async stop() {}
  async destroy() {}
  async cpuSeconds() {
    return this.cpu;
  }
  async guestLeases() {
    return this.leases;
  }
  onExit(_vm: RunningVm, l: (e: VmExit) => void) {
    this.exitListeners.push(l);
  }
  crash() {
    for (const l of this.exitListeners.splice(0)) l({ code: null, signal: "SIGKILL" });
  }
  async reap(spec: VmSpec) {
    this.reaped.push(spec);
  }
  async close() {}
}

const spec: AgentSpec = {
  id: "agt_test0001",
  tenantId: "ten_a",
  image: "demo",
  vcpus: 1,
  memMiB: 256,
  idleTimeoutMs: 5000,
  streamIdleMs: 2000,
  allowEgress: false,
};

function setup(overrides: Partial<HostConfig> = {}, fs?: HostFs) {
  const clock = new ManualClock();
  const driver = new ScriptedDriver();
  const store = createMemoryHostStore();
  const activity = {
    starts: [] as ActivityStart[],
    ends: [] as ActivityEnd[],
    active(e: ActivityStart) {
      this.starts.push(e);
    },
    inactive(e: ActivityEnd) {
      this.ends.push(e);
    },
  };
  const host = new Host({
    config: {
      hostId: "host_t",
      vmsDir: "/nonexistent/agentvm-test",
      wakeQueueLimit: 10,
      wakeDeadlineMs: 1000,
      reaperIntervalMs: 100,
      cpuBusyThreshold: 0.2,
      drainTimeoutMs: 0,
      ...overrides,
    },
    driver,
    store,
    clock,
    log: silentLogger,
    activity,
    ...(fs ? { fs } : {}),
  });
  return { clock, driver, store, host, activity };
}

function deferred() {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

const flush = () => new Promise((r) => setImmediate(r));

describe("host", () => {
  it("two deletes of one agent at once are one removal: both answer, the VM is stopped and destroyed once", async () => {
    const { host, driver } = setup();
    let stops = 0;
    let destroys = 0;
    driver.stop = async () => void stops++;
    driver.destroy = async () => void destroys++;
    (await host.acquire(spec, "request")).release();
    await Promise.all([host.remove(spec.id), host.remove(spec.id)]);
    expect({ stops, destroys }).toEqual({ stops: 1, destroys: 1 });
    expect(host.status(spec.id)).toBeUndefined();
  });

  it("a call that comes while the agent's deletion stops its VM wakes nothing: 404, and the VM is destroyed once", async () => {
    const { host, driver } = setup();
    const stopping = deferred();
    let destroys = 0;
    driver.stop = () => stopping.promise;
    driver.destroy = async () => void destroys++;
    (await host.acquire(spec, "request")).release();
    const boots = driver.boots;
    const removal = host.remove(spec.id);
    await flush();
    // Warm or not, no ticket and no wake while the removal is under way.
    const during = await host.acquire(spec, "request").then(
      () => "acquired",
      (e: AppError) => e.code,
    );
    expect(during).toBe("not_found");
    stopping.resolve();
    await removal;
    expect({ boots: driver.boots - boots, destroys }).toEqual({ boots: 0, destroys: 1 });
    expect(host.status(spec.id)).toBeUndefined();
  });

  it("N concurrent acquires of a sleeping VM cause exactly one boot", async () => {
    const { host, driver } = setup();
    const gate = deferred();
    driver.gate = gate.promise;
    const tickets = Array.from({ length: 5 }, () => host.acquire(spec, "request"));
    await flush();
    gate.resolve();
    const all = await Promise.all(tickets);
    expect(driver.boots).toBe(1);
    expect(all.every((t) => t.wake.wake === "boot")).toBe(true);
    expect(new Set(all.map((t) => t.wake.runId)).size).toBe(1);
    expect(host.status(spec.id)?.inFlight).toBe(5);
    for (const t of all) t.release();
    expect(host.status(spec.id)?.inFlight).toBe(0);
  });

  it("requests beyond the queue limit get queue_full with Retry-After; the rest are served", async () => {
    const { host, driver } = setup({ wakeQueueLimit: 3 });
    const gate = deferred();
    driver.gate = gate.promise;
    const waiting = Array.from({ length: 3 }, () => host.acquire(spec, "request"));
    await flush();
    const refused = await host.acquire(spec, "request").catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(AppError);
    expect((refused as AppError).code).toBe("queue_full");
    expect((refused as AppError).retryAfterS).toBeGreaterThan(0);
    gate.resolve();
    expect(await Promise.all(waiting)).toHaveLength(3);
  });

  it("a wake slower than the deadline answers wake_failed instead of hanging", async () => {
    const { host, driver, clock } = setup({ wakeDeadlineMs: 1000 });
    driver.gate = new Promise(() => {}); // never finishes
    const p = host.acquire(spec, "request").catch((e: unknown) => e);
    await flush();
    clock.advance(1001);
    const err = await p;
    expect((err as AppError).code).toBe("wake_failed");
    expect((err as AppError).status).toBe(503);
  });

  it("the idle reaper hibernates only after the idle timeout and never with a request in flight", async () => {
    const { host, clock, store, activity } = setup();
    const t = await host.acquire(spec, "request");
    clock.advance(10_000);
    await host.reapIdle();
    expect(host.status(spec.id)?.state).toBe("running"); // in flight
    t.release();
    clock.advance(4000);
    await host.reapIdle();
    expect(host.status(spec.id)?.state).toBe("running"); // 4 s < 5 s idle timeout
    clock.advance(1001);
    await host.reapIdle();
    await flush();
    expect(host.status(spec.id)?.state).toBe("hibernated");
    await host.flush();
    expect(store.transitions.map((r) => `${r.toState}:${r.reason}`)).toEqual(["booting:request", "running:request", "snapshotting:idle", "hibernated:idle"]);
    expect(activity.starts).toHaveLength(1);
    expect(activity.ends.map((e) => e.reason)).toEqual(["idle"]);
    const run = [...store.runs.values()][0]!;
    expect(run.sleepReason).toBe("idle");
  });

  it("a stream keeps the VM awake only while bytes moved within the stream idle window", async () => {
    const { host, clock } = setup();
    const t = await host.acquire(spec, "request");
    t.streaming();
    let closed = 0;
    t.onHibernate(() => closed++);
    clock.advance(1500);
    t.touch();
    clock.advance(1500);
    await host.reapIdle();
    expect(host.status(spec.id)?.state).toBe("running"); // bytes 1.5 s ago < 2 s window
    clock.advance(6000);
    await host.reapIdle();
    await flush();
    expect(host.status(spec.id)?.state).toBe("hibernated");
    expect(closed).toBe(1);
  });

  it("API and guest leases and a busy guest CPU keep it awake", async () => {
    const { host, clock, driver } = setup();
    await host.wake(spec);
    const lease = await host.addLease(spec, 20_000);
    clock.advance(10_000);
    await host.reapIdle();
    expect(host.status(spec.id)?.state).toBe("running");
    host.dropLease(spec.id, lease.leaseId);
    driver.leases = 1;
    clock.advance(10_000);
    await host.reapIdle();
    expect(host.status(spec.id)?.state).toBe("running");
    driver.leases = 0;
    // CPU: 0.5 s of CPU per 1 s of wall = 50 % ≥ 20 %
    for (let i = 0; i < 8; i++) {
      clock.advance(1000);
      driver.cpu += 0.5;
      await host.reapIdle();
    }
    expect(host.status(spec.id)?.state).toBe("running");
    for (let i = 0; i < 6; i++) {
      clock.advance(1000);
      await host.reapIdle();
    }
    await flush();
    expect(host.status(spec.id)?.state).toBe("hibernated");
  });

  it("a request during a snapshot cancels it and is served by the still-running VM", async () => {
    const { host, clock, driver, store } = setup();
    (await host.acquire(spec, "request")).release();
    driver.hibernateGate = new Promise(() => {}); // a snapshot that would take forever
    clock.advance(6000);
    await host.reapIdle();
    expect(host.status(spec.id)?.state).toBe("snapshotting");
    const t = await host.acquire(spec, "request");
    expect(t.wake.wake).toBe("warm");
    expect(host.status(spec.id)?.state).toBe("running");
    expect(driver.wakes).toBe(0);
    await host.flush();
    expect(store.transitions.at(-1)).toMatchObject({ fromState: "snapshotting", toState: "running", reason: "cancelled" });
  });

  it("a VM that exits on its own is recorded as a crash and woken again on the next request", async () => {
    const { host, driver, store, activity } = setup();
    (await host.acquire(spec, "request")).release();
    driver.crash();
    expect(host.status(spec.id)?.state).toBe("failed");
    expect(activity.ends.map((e) => e.reason)).toEqual(["crash"]);
    const t = await host.acquire(spec, "request");
    expect(t.wake.wake).toBe("restore");
    await host.flush();
    expect(store.transitions.map((r) => `${r.toState}:${r.reason}`)).toContain("failed:crash");
  });

  it("a failed boot is a 503 wake_failed, recorded, and the next request tries again", async () => {
    const { host, driver } = setup();
    driver.failBoot = true;
    const err = await host.acquire(spec, "request").catch((e: unknown) => e);
    expect((err as AppError).code).toBe("wake_failed");
    expect(host.status(spec.id)?.state).toBe("failed");
    driver.failBoot = false;
    const t = await host.acquire(spec, "request");
    expect(t.wake.wake).toBe("restore");
  });

  it("a built image reaches the driver as its files and disk size; an image this host lacks is boot_failed, not a driver call", async () => {
    const digest = `sha256:${"ab".repeat(32)}`;
    const artifact = {
      digest,
      rootfs: "/images/rootfs.ext4",
      sizeBytes: 1,
      config: { entrypoint: [], cmd: ["/agent"], env: [], workdir: "/", user: "", uid: 0, gid: 0, port: 8080 },
    };
    let present = false;
    const clock = new ManualClock();
    const driver = new ScriptedDriver();
    const booted: VmSpec[] = [];
    const boot = driver.boot.bind(driver);
    driver.boot = async (s) => (booted.push(s), boot(s));
    const tails: string[] = [];
    const fs: HostFs = { vmDirs: () => [], hasStateDir: () => false, tail: (path) => (tails.push(path), path.endsWith(".1") ? "" : "console says why") };
    const host = new Host({
      config: {
        hostId: "host_t",
        vmsDir: "/nonexistent/agentvm-test",
        wakeQueueLimit: 10,
        wakeDeadlineMs: 1000,
        reaperIntervalMs: 100,
        cpuBusyThreshold: 0.2,
        drainTimeoutMs: 0,
      },
      driver,
      store: createMemoryHostStore(),
      clock,
      log: silentLogger,
      fs,
      activity: { active() {}, inactive() {} },
      images: (d) => (present && d === digest ? artifact : undefined),
    });
    const agent: AgentSpec = { ...spec, id: "agt_image0001", image: digest, diskMiB: 300 };
    const missing = await host.acquire(agent, "request").catch((e: unknown) => e);
    expect((missing as AppError).code).toBe("boot_failed");
    expect((missing as AppError).message).toContain(`image ${digest} is not on host host_t`);
    expect(driver.boots).toBe(0);
    expect(host.status(agent.id)?.state).toBe("creating"); // nothing ran; the next call looks again
    present = true;
    (await host.acquire(agent, "request")).release();
    expect(booted[0]).toMatchObject({ image: digest, rootImage: artifact, diskMiB: 300 });
    // A driver's boot_failed stays boot_failed for the caller; the event carries the console's tail (rotated file first).
    driver.wake = driver.boot = async () => {
      throw new AppError("boot_failed", "entrypoint exited with status 3");
    };
    driver.crash();
    const failed = await host.acquire(agent, "request").catch((e: unknown) => e);
    expect((failed as AppError).code).toBe("boot_failed");
    expect(tails.some((p) => p.endsWith("workload.log.1"))).toBe(true);
  });

  it("shutdown refuses new requests and hibernates running VMs", async () => {
    const { host } = setup();
    (await host.acquire(spec, "request")).release();
    await host.stop();
    expect(host.status(spec.id)?.state).toBe("hibernated");
    const err = await host.acquire(spec, "request").catch((e: unknown) => e);
    expect((err as AppError).code).toBe("shutting_down");
  });

  it("records first-byte time on the run a request woke", async () => {
    const { host, store, clock } = setup();
    const t = await host.acquire(spec, "request");
    clock.advance(7);
    t.firstByte();
    t.release();
    await host.flush();
    const run = [...store.runs.values()][0]!;
    expect(run.timings.firstByteMs).toBe(7);
  });
});

describe("host start and shutdown", () => {
  it("at start reaps the VMs an earlier process left; an agent whose state dir survived restores instead of booting", async () => {
    const fs: HostFs = { vmDirs: () => ["agt_left0001", spec.id], hasStateDir: (dir) => dir.endsWith(`/${spec.id}`), tail: () => "" };
    const { host, driver } = setup({}, fs);
    await host.start();
    expect(driver.reaped.map((s) => [s.vmId, s.stateDir])).toEqual([
      ["vm_left0001", "/nonexistent/agentvm-test/agt_left0001"],
      ["vm_test0001", `/nonexistent/agentvm-test/${spec.id}`],
    ]);
    const t = await host.acquire(spec, "request");
    expect(t.wake.wake).toBe("restore");
    expect(driver.boots).toBe(0);
    t.release();
    await host.stop();
  });

  it("stop() waits on the injected clock for an in-flight request, then hibernates", async () => {
    await withRealTimersFrozen(async () => {
      const { host, ticket, stopping, stopped } = await stopDuringRequest(30_000);
      expect(stopped()).toBe(false);
      expect(host.status(spec.id)?.state).toBe("running");
      ticket.release();
      await stopping;
      expect(host.status(spec.id)?.state).toBe("hibernated");
    });
  });

  it("stop() gives up on a request still open at drainTimeoutMs, closes it and hibernates", async () => {
    await withRealTimersFrozen(async () => {
      const { host, clock, stopping, stopped, closed } = await stopDuringRequest(30_000);
      expect(stopped()).toBe(false);
      clock.advance(1);
      await stopping;
      expect(closed()).toBe(1);
      expect(host.status(spec.id)?.state).toBe("hibernated");
    });
  });
});

/** Real timers frozen: a drain that slept for real instead of on the injected clock would never finish. */
async function withRealTimersFrozen(fn: () => Promise<void>): Promise<void> {
  vi.useFakeTimers({ toFake: ["setTimeout", "setInterval"] });
  try {
    await fn();
  } finally {
    vi.useRealTimers();
  }
}

/** Starts shutdown with one request open and moves the injected clock to 1 ms before the drain timeout. */
async function stopDuringRequest(drainTimeoutMs: number) {
  const s = setup({ drainTimeoutMs });
  const ticket = await s.host.acquire(spec, "request");
  let closed = 0;
  ticket.onHibernate(() => closed++);
  let stopped = false;
  const stopping = s.host.stop().then(() => void (stopped = true));
  await flush();
  s.clock.advance(drainTimeoutMs - 1);
  await flush();
  return { ...s, ticket, stopping, stopped: () => stopped, closed: () => closed };
}

describe("VM lifecycle table", () => {
  it("allows the DESIGN.md cycle and refuses shortcuts", () => {
    for (const [a, b] of [
      ["creating", "booting"],
      ["booting", "running"],
      ["running", "snapshotting"],
      ["snapshotting", "hibernated"],
      ["hibernated", "restoring"],
      ["restoring", "running"],
    ] as const) {
      expect(canTransition(a, b)).toBe(true);
    }
    expect(canTransition("hibernated", "running")).toBe(false);
    expect(canTransition("destroyed", "booting")).toBe(false);
    expect(canTransition("creating", "running")).toBe(false);
  });
});

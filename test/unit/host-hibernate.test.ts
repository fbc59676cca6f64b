// A failed hibernate on the host core (fake driver, hand-driven clock): the VM stays running and metered, the failure
// is in the event log and the status with its cause, the idle reaper backs off (doubling, capped, reset by a success),
// and a cold-boot fallback is reported as a boot.
import { describe, expect, it } from "vitest";
import { ManualClock } from "../../lib/clock.ts";
import { silentLogger } from "../../lib/log.ts";
import { Host } from "../../fleet-agent/host.ts";
import { createMemoryHostStore } from "../../fleet-agent/store.ts";
import { SnapshotNoSpace } from "../../fleet-agent/drivers/common/snapshot-space.ts";
import type { RunningVm, SnapshotResult, VmDriver, VmSpec, WakeResult } from "../../fleet-agent/drivers/driver.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import { serverTiming } from "../../contracts/fleet.ts";

const MiB = 1024 * 1024;
const agent: AgentSpec = {
  id: "agt_hib00001",
  tenantId: "ten_h",
  image: "demo",
  vcpus: 1,
  memMiB: 256,
  idleTimeoutMs: 1000,
  streamIdleMs: 1000,
  allowEgress: false,
};

/** Snapshots answer from a queue the test fills: an Error rejects, `true` completes. */
function fakeDriver() {
  const outcomes: (Error | true)[] = [];
  const calls = { hibernate: 0, stop: 0 };
  let wakeAs: WakeResult["mode"] = "restore";
  const vm = (spec: VmSpec): RunningVm => ({ spec, endpoint: { host: "127.0.0.1", port: 9 }, pid: 42 });
  const driver: VmDriver = {
    name: "qemu",
    isolated: true,
    logPath: (spec) => `${spec.stateDir}/console.log`,
    boot: async (spec) => ({ vm: vm(spec), bootMs: 2000 }),
    hibernate: async (): Promise<SnapshotResult> => {
      calls.hibernate++;
      const next = outcomes.shift() ?? true;
      if (next instanceof Error) throw next;
      return { completed: true, snapshotMs: 100, bytes: 60 * MiB };
    },
    wake: async (spec) =>
      wakeAs === "boot"
        ? {
            vm: vm(spec),
            mode: "boot",
            fallbackReason: "snapshot checksum mismatch",
            timings: { restoreMs: 40, bootMs: 2500, clockFixMs: 2, skewBeforeMs: 300, skewAfterMs: 1 },
          }
        : { vm: vm(spec), mode: "restore", timings: { restoreMs: 150, clockFixMs: 2, skewBeforeMs: 9000, skewAfterMs: 1 } },
    stop: async () => {
      calls.stop++;
    },
    destroy: async () => {},
    cpuSeconds: async () => 0,
    guestLeases: async () => 0,
    onExit: () => {},
    reap: async () => {},
    close: async () => {},
  };
  return { driver, outcomes, calls, wakeAs: (m: WakeResult["mode"]) => (wakeAs = m) };
}

function setup() {
  const clock = new ManualClock();
  const fake = fakeDriver();
  const store = createMemoryHostStore();
  const activity = { active: [] as string[], inactive: [] as string[] };
  const host = new Host({
    config: {
      hostId: "host_h",
      vmsDir: "/nonexistent/agentvm-hibernate-test",
      wakeQueueLimit: 10,
      wakeDeadlineMs: 1000,
      reaperIntervalMs: 100,
      cpuBusyThreshold: 0.2,
      drainTimeoutMs: 0,
      hibernateRetry: { initialMs: 1000, maxMs: 4000 },
    },
    driver: fake.driver,
    store,
    clock,
    log: silentLogger,
    activity: { active: (e) => activity.active.push(e.reason), inactive: (e) => activity.inactive.push(e.reason) },
  });
  const noSpace = () => new SnapshotNoSpace({ dir: "/vms/agt_hib00001", neededBytes: 288 * MiB, freeBytes: 20 * MiB });
  const failedEvents = async () => {
    await host.flush();
    return store.transitions.filter((t) => t.reason === "hibernate_failed");
  };
  /** One idle pass `ms` after the last one; resolves once a snapshot it started has settled. */
  const idlePass = async (ms: number) => {
    clock.advance(ms);
    await host.reapIdle();
    for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
  };
  return { clock, fake, store, activity, host, noSpace, failedEvents, idlePass };
}

describe("host: a failed hibernate", () => {
  it("keeps the VM running and metered, says why, and backs off 1 s → 2 s → 4 s → 4 s until a hibernate succeeds", async () => {
    const { host, fake, store, activity, clock, noSpace, failedEvents, idlePass } = setup();
    (await host.acquire(agent, "request")).release();
    fake.outcomes.push(noSpace(), noSpace(), noSpace(), noSpace());

    await idlePass(1000); // idle timeout reached: first attempt, refused
    expect(fake.calls.hibernate).toBe(1);
    expect(host.status(agent.id)?.state).toBe("running");
    expect(fake.calls.stop).toBe(0); // never stopped: the VM keeps what it holds in memory
    const [first] = await failedEvents();
    expect(first).toMatchObject({ fromState: "snapshotting", toState: "running", reason: "hibernate_failed" });
    expect(first!.detail).toMatchObject({ code: "ENOSPC", neededBytes: 288 * MiB, freeBytes: 20 * MiB, sleepReason: "idle", attempts: 1, retryInMs: 1000 });
    expect(String(first!.detail!.error)).toMatch(/no space for the snapshot/);
    expect(activity.inactive).toEqual(["idle"]);
    expect(activity.active).toEqual(["request", "request"]); // metered as awake again at once
    expect(host.status(agent.id)?.lastHibernateError).toMatchObject({
      code: "ENOSPC",
      neededBytes: 288 * MiB,
      freeBytes: 20 * MiB,
      attempts: 1,
      retryAt: clock.now() + 1000,
    });

    // A call during the backoff is served warm by the same run.
    const warm = await host.acquire(agent, "request");
    expect(warm.wake.wake).toBe("warm");
    warm.release();

    const attemptsAt: number[] = [];
    for (let t = 0; t < 12_000; t += 100) {
      const before = fake.calls.hibernate;
      await idlePass(100);
      if (fake.calls.hibernate > before) attemptsAt.push(t + 100);
    }
    // Retries at +1 s, then 2 s and 4 s later, then capped at 4 s (times since the first failure, in 100 ms passes).
    expect(attemptsAt.slice(0, 4)).toEqual([1000, 3000, 7000, 11000]);
    expect((await failedEvents()).map((e) => e.detail!.retryInMs)).toEqual([1000, 2000, 4000, 4000]);
    expect(host.status(agent.id)?.state).toBe("hibernated"); // the fifth attempt had room
    expect(host.status(agent.id)?.lastHibernateError).toBeUndefined();
    await host.flush();
    expect(store.transitions.filter((t) => t.toState === "hibernated")).toHaveLength(1);
    const runs = [...store.runs.values()];
    expect(runs).toHaveLength(1); // one run from the wake to the sleep that worked, never ended by a failure
    expect(runs[0]!.sleepReason).toBe("idle");

    // A success starts the backoff over.
    (await host.acquire(agent, "request")).release();
    fake.outcomes.push(noSpace());
    await idlePass(1000);
    expect((await failedEvents()).at(-1)!.detail).toMatchObject({ attempts: 1, retryInMs: 1000 });
  });

  it("an explicit hibernate is tried at once and answers the state it left: running", async () => {
    const { host, fake, noSpace, failedEvents } = setup();
    (await host.acquire(agent, "request")).release();
    fake.outcomes.push(noSpace(), new Error("snapshot migration failed: Unable to write to command: Broken pipe"));
    expect(await host.hibernateNow(agent.id)).toBe("running");
    expect(await host.hibernateNow(agent.id)).toBe("running"); // no backoff for the operator
    const failed = await failedEvents();
    expect(failed[1]!.detail).toMatchObject({ error: /Broken pipe/, attempts: 2, sleepReason: "api" });
    expect(failed[1]!.detail!.code).toBeUndefined();
    expect(await host.hibernateNow(agent.id)).toBe("hibernated");
  });

  it("at shutdown a failed snapshot stops the VM and says so; the run ends", async () => {
    const { host, fake, store, noSpace } = setup();
    (await host.acquire(agent, "request")).release();
    fake.outcomes.push(noSpace());
    await host.stop();
    await host.flush();
    expect(fake.calls.stop).toBe(1);
    expect(host.status(agent.id)?.state).toBe("stopped");
    expect(store.transitions.map((t) => `${t.fromState}→${t.toState}:${t.reason}`).slice(-3)).toEqual([
      "running→snapshotting:shutdown",
      "snapshotting→running:hibernate_failed",
      "running→stopped:shutdown",
    ]);
    expect([...store.runs.values()][0]!.sleepReason).toBe("shutdown");
  });
});

describe("server-timing", () => {
  it("names a restore's sleep tier as its description", () => {
    expect(serverTiming({ restoreMs: 6.9, tier: "kept", clockFixMs: 2 })).toBe("restore;dur=6.9;desc=kept, clockfix;dur=2");
    expect(serverTiming({ restoreMs: 120 })).toBe("restore;dur=120");
  });
});

describe("host: a restore that fell back to a cold boot", () => {
  it("is reported as a boot: bootMs in the wake, the run and server-timing, no restoreMs", async () => {
    const { host, fake, store } = setup();
    (await host.acquire(agent, "request")).release();
    expect(await host.hibernateNow(agent.id)).toBe("hibernated");
    fake.wakeAs("boot");
    const t = await host.acquire(agent, "request");
    t.release();
    expect(t.wake.wake).toBe("boot");
    expect(t.wake.timings).toMatchObject({ bootMs: 2500, clockFixMs: 2 });
    expect(t.wake.timings.restoreMs).toBeUndefined();
    await host.flush();
    expect(serverTiming(t.wake.timings)).toMatch(/^queue;dur=[\d.]+, clockfix;dur=2, boot;dur=2500$/);
    const run = [...store.runs.values()].at(-1)!;
    expect(run.wakeMode).toBe("boot");
    expect(run.timings).toMatchObject({ bootMs: 2500 });
    expect(run.timings.restoreMs).toBeUndefined();
    const woke = store.transitions.at(-1)!;
    expect(woke).toMatchObject({ fromState: "restoring", toState: "running" });
    expect(woke.detail).toMatchObject({ wake: "boot", fallbackReason: "snapshot checksum mismatch", restoreAttemptMs: 40 });
  });
});

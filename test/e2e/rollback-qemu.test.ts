// Rollbacks on real VMs: counter to N, hibernate (snapshot), wake, counter to N+k, then the run is cut off without a
// snapshot: a kill -9 of the fleet-agent (its QEMU is reaped at the restart), also within the run's first meter
// heartbeat, or QEMU itself killed while the host runs on. The next call restores the snapshot and says what was lost
// (`x-wake-rollback`: the awake ms since the wake), in the run's timings and in the event log; only that first wake.
import { spawnSync } from "node:child_process";
import { symlinkSync } from "node:fs";
import { dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { processAlive, readPidFile } from "../../fleet-agent/drivers/common/proc.ts";
import { guestImage } from "../helpers/qemu.ts";
import { startCrashStack, type CrashStack } from "../helpers/host-crash.ts";
import { waitFor } from "../helpers/wait.ts";

const qemuPresent = spawnSync("sh", ["-c", "command -v qemu-system-x86_64"]).status === 0;
if (!qemuPresent && process.env.CI === "true") throw new Error("CI: qemu-system-x86_64 missing (npm test provisions it: scripts/provision.ts)");

const heartbeatMs = 200;
const slackMs = 700;
let stack: CrashStack;

const title = qemuPresent
  ? "rollback after a host crash (qemu)"
  : "rollback after a host crash (qemu) — skipped: qemu-system-x86_64 is not installed (npm run setup:vm)";
describe.skipIf(!qemuPresent)(title, () => {
  beforeAll(async () => {
    const images = dirname(dirname((await guestImage()).kernel)); // the suite's built guest image, not a second build
    stack = await startCrashStack({
      // Streamed RAM: a snapshot outlives a crash while awake. With file-backed RAM (the default) the guest's RAM file
      // has moved on, and the next wake boots cold saying so (qemu-file-memory.test.ts): nothing to roll back to.
      hostEnv: { DRIVER: "qemu", QEMU_MEMORY: "stream", REAPER_INTERVAL_MS: "200", METER_HEARTBEAT_MS: String(heartbeatMs), LOG_LEVEL: "warn" },
      readyTimeoutMs: 120_000,
      prepare: (dataDir) => symlinkSync(images, join(dataDir, "images")),
    });
  }, 180_000);

  afterAll(async () => {
    await stack?.close();
  }, 60_000);

  const counter = async (id: string) => {
    const res = await stack.call(`/a/${id}/counter`, { method: "POST" });
    expect(res.status).toBe(200);
    return { wake: res.headers.get("x-wake"), rollback: res.headers.get("x-wake-rollback"), count: ((await res.json()) as { count: number }).count };
  };

  it("the first call after the crash restores the snapshot and says how much awake time it lost", async () => {
    const id = await stack.createAgent({ idleTimeoutMs: 600_000 });
    expect(await counter(id)).toMatchObject({ wake: "boot", count: 1, rollback: null });
    expect(await counter(id)).toMatchObject({ wake: "warm", count: 2 }); // N = 2
    expect((await (await stack.call(`/v1/agents/${id}/hibernate`, { method: "POST" })).json()) as object).toMatchObject({ state: "hibernated" });

    const wakeCalled = Date.now();
    expect(await counter(id)).toMatchObject({ wake: "restore", count: 3, rollback: null });
    const woke = Date.now();
    expect(await counter(id)).toMatchObject({ wake: "warm", count: 4 }); // N + k = 4
    await new Promise((r) => setTimeout(r, 1500));
    const qemu = readPidFile(join(stack.vmsDir, id, "qemu.pid"))!.pid;
    const killAt = await stack.killHost();
    // Its QEMU dies with it (exec-stub.c: PR_SET_PDEATHSIG), not at a restart that may never come: nothing runs unmetered.
    await waitFor(() => !processAlive(qemu), 3000, "the killed host's QEMU gone");
    await stack.startHost();

    const after = await counter(id);
    expect(after.wake).toBe("restore");
    expect(after.count).toBe(3); // N + 1: what it did in memory since the snapshot is gone
    const rollbackMs = Number(after.rollback);
    expect(rollbackMs, `x-wake-rollback: ${after.rollback}`).toBeGreaterThan(0);
    expect(rollbackMs).toBeLessThanOrEqual(killAt - wakeCalled);
    expect(rollbackMs).toBeGreaterThanOrEqual(killAt - woke - heartbeatMs - slackMs);

    // The run the crash cut off ended at its last metered instant: exactly the awake time lost.
    await waitFor(async () => (await stack.runs(id)).length === 3, 5000, "the run of the wake after the crash");
    const [now, crashed] = await stack.runs(id);
    expect(crashed!.sleepReason).toBe("crash");
    expect(Date.parse(crashed!.sleptAt!) - Date.parse(crashed!.wokeAt)).toBe(rollbackMs);
    expect(now!.wakeMode).toBe("restore");
    expect(now!.timings.rollbackMs).toBe(rollbackMs);
    expect(now!.timings.tier).toBe("files"); // the restarted host kept no QEMU for it: a new one, from the files

    const events = await stack.events(id);
    expect(events.filter((e) => e.reason === "crash")).toEqual([expect.objectContaining({ fromState: "running", toState: "stopped", runId: crashed!.runId })]);
    const wake = events.findLast((e) => e.toState === "running")!;
    expect(wake.timings?.rollbackMs).toBe(rollbackMs);
    expect(wake.detail).toMatchObject({ wake: "restore", rollback: { rollbackMs, lostRunId: crashed!.runId, lastAwakeAt: crashed!.sleptAt } });

    // Only the first wake after the crash says so: a warm call, and the wake after the next hibernation, do not.
    expect(await counter(id)).toMatchObject({ wake: "warm", count: 4, rollback: null });
    expect((await (await stack.call(`/v1/agents/${id}/hibernate`, { method: "POST" })).json()) as object).toMatchObject({ state: "hibernated" });
    expect(await counter(id)).toMatchObject({ wake: "restore", count: 5, rollback: null });
  }, 120_000);

  const hibernate = async (id: string) =>
    expect((await (await stack.call(`/v1/agents/${id}/hibernate`, { method: "POST" })).json()) as object).toMatchObject({ state: "hibernated" });
  const runningEvents = async (id: string) => (await stack.events(id)).filter((e) => e.toState === "running");

  it("QEMU killed while awake, no host restart: the next call restores the snapshot and says what the run did", async () => {
    const id = await stack.createAgent({ idleTimeoutMs: 600_000 });
    expect(await counter(id)).toMatchObject({ wake: "boot", count: 1 });
    await hibernate(id);
    const wakeCalled = Date.now();
    expect(await counter(id)).toMatchObject({ wake: "restore", count: 2, rollback: null });
    const woke = Date.now();
    expect(await counter(id)).toMatchObject({ wake: "warm", count: 3 });
    await new Promise((r) => setTimeout(r, 1000));
    const qemu = readPidFile(join(stack.vmsDir, id, "qemu.pid"));
    expect(qemu, "the VM's QEMU").toBeDefined();
    const killAt = Date.now();
    process.kill(qemu!.pid, "SIGKILL");
    await waitFor(async () => (await stack.agentState(id)) === "failed", 10_000, "the host to see its VM crash");
    const seen = Date.now();

    const after = await counter(id);
    expect(after).toMatchObject({ wake: "restore", count: 2 }); // what it did since the snapshot is gone
    const rollbackMs = Number(after.rollback);
    expect(rollbackMs, `x-wake-rollback: ${after.rollback}`).toBeGreaterThanOrEqual(killAt - woke);
    expect(rollbackMs).toBeLessThanOrEqual(seen - wakeCalled);

    // The crashed run ended when the host saw QEMU exit: exactly the awake time lost.
    await waitFor(async () => (await stack.runs(id)).length === 3, 5000, "the run of the wake after the crash");
    const [now, crashed] = await stack.runs(id);
    expect(crashed!.sleepReason).toBe("crash");
    expect(Date.parse(crashed!.sleptAt!) - Date.parse(crashed!.wokeAt)).toBe(rollbackMs);
    expect(now!.timings.rollbackMs).toBe(rollbackMs);
    const wake = (await runningEvents(id)).at(-1)!;
    expect(wake.timings?.rollbackMs).toBe(rollbackMs);
    expect(wake.detail).toMatchObject({ wake: "restore", rollback: { rollbackMs, lostRunId: crashed!.runId, lastAwakeAt: crashed!.sleptAt } });
    expect(wake.detail).not.toHaveProperty("rollback.estimated");
    expect(await counter(id)).toMatchObject({ wake: "warm", count: 3, rollback: null });
  }, 120_000);

  it("host killed within the run's first meter heartbeat: the next restore says so, its figure bounded by the restart", async () => {
    const id = await stack.createAgent({ idleTimeoutMs: 600_000 });
    expect(await counter(id)).toMatchObject({ wake: "boot", count: 1 });
    await hibernate(id);
    await stack.killHost();
    await stack.startHost({ METER_HEARTBEAT_MS: "600000" }); // no cut of the next run before the kill
    const wakeCalled = Date.now();
    expect(await counter(id)).toMatchObject({ wake: "restore", count: 2, rollback: null });
    await stack.killHost();
    const restart = Date.now();
    await stack.startHost();

    const after = await counter(id);
    expect(after).toMatchObject({ wake: "restore", count: 2 }); // the snapshot's 1, and this call: the lost call's 2 is gone
    const rollbackMs = Number(after.rollback);
    expect(rollbackMs, `x-wake-rollback: ${after.rollback}`).toBeGreaterThan(0);
    expect(rollbackMs).toBeLessThanOrEqual(Date.now() - wakeCalled);
    const wake = (await runningEvents(id)).at(-1)!;
    expect(wake.detail).toMatchObject({ rollback: { rollbackMs, estimated: true } });
    // the estimate runs from the lost run's wake to the new host process's start
    const lastAwakeAt = Date.parse((wake.detail!.rollback as { lastAwakeAt: string }).lastAwakeAt);
    expect(lastAwakeAt).toBeGreaterThanOrEqual(restart);
    expect(lastAwakeAt).toBeLessThanOrEqual(Date.now());
  }, 180_000);
});

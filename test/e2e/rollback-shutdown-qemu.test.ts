// A failed hibernation at shutdown rolls the agent back, and its next wake says so, on real QEMU: counter to 1,
// hibernate (the snapshot), wake, counter to 2, then the disk under the VMs' directory (a small tmpfs of its own) is
// filled so the shutdown's hibernation is refused by the space check and the VM is stopped without a snapshot. After
// the restart the first call restores the older snapshot (count 1 + 1 again) with `x-wake-rollback`: the run's awake
// time, from its wake to its stop, as the run and the event log record it.
import { spawnSync } from "node:child_process";
import { closeSync, mkdirSync, openSync, rmSync, statfsSync, symlinkSync, writeSync } from "node:fs";
import { dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { guestImage } from "../helpers/qemu.ts";
import { startCrashStack, type CrashStack } from "../helpers/host-crash.ts";
import { mountTmpfs, type Tmpfs } from "../helpers/tmpfs.ts";
import { waitFor } from "../helpers/wait.ts";

const qemuPresent = spawnSync("sh", ["-c", "command -v qemu-system-x86_64"]).status === 0;
if (!qemuPresent && process.env.CI === "true") throw new Error("CI: qemu-system-x86_64 missing (npm test provisions it: scripts/provision.ts)");

const MiB = 1024 * 1024;
const HOST_ID = "host_rollbackdown";
/** The agent's memory: a snapshot needs it plus a margin free (common/snapshot-space.ts), 160 MiB. */
const memMiB = 128;
let stack: CrashStack | undefined;
let vmsDir: string | undefined;
let fs: Tmpfs | undefined;
const unmount = () => fs?.unmount();

const title = qemuPresent
  ? "rollback after a failed hibernation at shutdown (qemu)"
  : "rollback after a failed hibernation at shutdown (qemu) — skipped: qemu-system-x86_64 is not installed (npm run setup:vm)";
describe.skipIf(!qemuPresent)(title, () => {
  beforeAll(async () => {
    const images = dirname(dirname((await guestImage()).kernel));
    stack = await startCrashStack({
      // Streamed RAM: a snapshot outlives a run that ended without one (with file-backed RAM, the default, the stopped
      // run's RAM file has moved on and the next wake boots cold saying so: nothing to roll back to).
      hostEnv: { DRIVER: "qemu", QEMU_MEMORY: "stream", HOST_ID, REAPER_INTERVAL_MS: "200", LOG_LEVEL: "warn" },
      readyTimeoutMs: 120_000,
      prepare: (dataDir) => {
        symlinkSync(images, join(dataDir, "images"));
        vmsDir = join(dataDir, "hosts", HOST_ID, "vms");
        mkdirSync(vmsDir, { recursive: true });
        // Room for the first snapshot and the filler.
        fs = mountTmpfs(vmsDir, 256, "agentvm-rollbackdown");
        if (!fs) throw new Error("this test needs a tmpfs of its own (root)");
      },
      unprepare: unmount,
    });
  }, 180_000);

  afterAll(async () => {
    try {
      await stack?.close();
    } finally {
      unmount();
    }
  }, 60_000);

  const counter = async (id: string) => {
    const res = await stack!.call(`/a/${id}/counter`, { method: "POST" });
    expect(res.status, res.status === 200 ? "" : await res.clone().text()).toBe(200);
    return { wake: res.headers.get("x-wake"), rollback: res.headers.get("x-wake-rollback"), count: ((await res.json()) as { count: number }).count };
  };

  it("the restore of the older snapshot after the restart says what the stopped run did", async () => {
    const s = stack!;
    const id = await s.createAgent({ idleTimeoutMs: 600_000, memMiB });
    expect(await counter(id)).toMatchObject({ wake: "boot", count: 1 });
    expect((await (await s.call(`/v1/agents/${id}/hibernate`, { method: "POST" })).json()) as object).toMatchObject({ state: "hibernated" });
    const wakeCalled = Date.now();
    expect(await counter(id)).toMatchObject({ wake: "restore", count: 2, rollback: null });
    await new Promise((r) => setTimeout(r, 1000));

    // Leave less than the next snapshot needs (file-backed RAM: the margin; streamed: the guest's memory too): the
    // shutdown's hibernation is refused before anything is written.
    const filler = join(vmsDir!, "filler.bin");
    const fd = openSync(filler, "w");
    const chunk = Buffer.alloc(4 * MiB, 1);
    const free = () => {
      const st = statfsSync(vmsDir!);
      return st.bavail * st.bsize;
    };
    while (free() > 8 * MiB) writeSync(fd, chunk);
    closeSync(fd);
    await s.stopHost();
    const stopped = Date.now();
    rmSync(filler);
    const events = await s.events(id);
    expect(events.at(-1)).toMatchObject({ fromState: "running", toState: "stopped", reason: "shutdown" });
    await s.startHost();

    const after = await counter(id);
    expect(after).toMatchObject({ wake: "restore", count: 2 }); // the snapshot's 1, and this call: the lost 2 is gone
    const rollbackMs = Number(after.rollback);
    expect(rollbackMs, `x-wake-rollback: ${after.rollback}`).toBeGreaterThanOrEqual(1000);
    expect(rollbackMs).toBeLessThanOrEqual(stopped - wakeCalled);

    await waitFor(async () => (await s.runs(id)).length === 3, 5000, "the run of the wake after the restart");
    const [now, lost] = await s.runs(id);
    expect(lost!.sleepReason).toBe("shutdown");
    expect(Date.parse(lost!.sleptAt!) - Date.parse(lost!.wokeAt)).toBe(rollbackMs);
    expect(now!.timings.rollbackMs).toBe(rollbackMs);
    const wake = (await s.events(id)).findLast((e) => e.toState === "running")!;
    expect(wake.detail).toMatchObject({ wake: "restore", rollback: { rollbackMs, lostRunId: lost!.runId, lastAwakeAt: lost!.sleptAt } });
  }, 180_000);
});

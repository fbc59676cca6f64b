// A full disk under the snapshot directory, on real QEMU behind the whole system: the snapshot directory is a small
// tmpfs of its own. A hibernate that does not fit leaves the agent awake with its memory (no rollback to the older
// snapshot), says why (ENOSPC, bytes needed and free, the writer's own words), keeps the older snapshot intact, is
// retried only after a growing backoff, and succeeds once there is room. A restore that falls back to a cold boot
// reports `boot` in server-timing and in the run's timings.
import { createHash } from "node:crypto";
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, readdirSync, rmSync, statfsSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { HibernateFailure } from "../../contracts/agent.ts";
import type { SnapshotManifest } from "../../fleet-agent/drivers/qemu/snapshot.ts";
import { makeDriver } from "../helpers/qemu.ts";
import { mountTmpfs, type Tmpfs } from "../helpers/tmpfs.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";
import { waitFor } from "../helpers/wait.ts";

const MiB = 1024 * 1024;
const HOST_ID = "host_diskfull";
const root = mkdtempSync(join(tmpdir(), "agentvm-diskfull-"));
const dataDir = join(root, "data");
const vmsDir = join(dataDir, "hosts", HOST_ID, "vms");
const filler = join(vmsDir, "filler.bin");
/** What the driver's free-space check asks for; the test moves it to reach both the early refusal and a write that fills the disk. */
let needed = 64 * MiB;
let fs: Tmpfs | undefined;
let sys: TestSystem | undefined;

beforeAll(async () => {
  mkdirSync(vmsDir, { recursive: true });
  // Room for two demo snapshots (≈ 60 MB each) and the filler.
  fs = mountTmpfs(vmsDir, 256, "agentvm-diskfull");
  if (!fs) return;
  sys = await startSystem({
    driver: await makeDriver({ snapshotBytesNeeded: () => needed }),
    env: { DATA_DIR: dataDir, HOST_ID, REAPER_INTERVAL_MS: "100", HIBERNATE_RETRY_MS: "2000", HIBERNATE_RETRY_MAX_MS: "8000" },
  });
}, 120_000);

afterAll(async () => {
  try {
    await sys?.stop();
  } finally {
    fs?.unmount();
    rmSync(root, { recursive: true, force: true });
  }
}, 120_000);

interface Event {
  id: number;
  at: string;
  fromState: string;
  toState: string;
  reason: string;
  detail: Record<string, unknown> | null;
}

/** The agent's VM event log as an operator reads it (oldest first). */
async function events(agentId: string): Promise<Event[]> {
  await sys!.host.flush();
  const res = await sys!.call(`/v1/agents/${agentId}/events?limit=1000`);
  return ((await res.json()) as { events: Event[] }).events.reverse();
}

async function counter(agentId: string): Promise<{ count: number; wake: string | null; timing: string | null }> {
  const res = await sys!.call(`/a/${agentId}/counter`, { method: "POST" });
  expect(res.status).toBe(200);
  const { count } = (await res.json()) as { count: number };
  return { count, wake: res.headers.get("x-wake"), timing: res.headers.get("server-timing") };
}

const freeOf = (dir: string) => {
  const s = statfsSync(dir);
  return s.bavail * s.bsize;
};
const sha = (path: string) => createHash("sha256").update(readFileSync(path)).digest("hex");
const status = (agentId: string) => sys!.host.status(agentId);

describe("a snapshot directory that runs full", () => {
  it("a hibernate that does not fit keeps the agent awake with its state, says ENOSPC, backs off, and succeeds once there is room", async (ctx) => {
    if (!sys) return ctx.skip();
    const agent = await sys.createAgent({ idleTimeoutMs: 1000 });
    const dir = join(vmsDir, agent.id);
    expect((await counter(agent.id)).wake).toBe("boot");
    await counter(agent.id);
    expect((await counter(agent.id)).count).toBe(3);
    await waitFor(() => status(agent.id)?.state === "hibernated", 30_000, "the first idle hibernate");
    const manifestText = readFileSync(join(dir, "snapshot.json"), "utf8");
    const older = JSON.parse(manifestText) as SnapshotManifest;
    const olderSha = sha(join(dir, older.file));

    // Leave 30 MiB: the next snapshot (≈ 60 MB) passes a 16 MiB check and fills the disk while it is written.
    const fd = openSync(filler, "w");
    const chunk = Buffer.alloc(4 * MiB, 1);
    while (freeOf(vmsDir) > 30 * MiB + chunk.length) writeSync(fd, chunk);
    closeSync(fd);
    needed = 16 * MiB;
    const woke = await counter(agent.id);
    expect(woke).toMatchObject({ wake: "restore", count: 4 });
    expect((await counter(agent.id)).count).toBe(5);

    // The second idle snapshot ends one way or another: wait for the transition out of it.
    const settled = async () => {
      const log = await events(agent.id);
      const second = log.filter((e) => e.toState === "snapshotting")[1];
      return second !== undefined && log.at(-1)!.id !== second.id;
    };
    await waitFor(settled, 20_000, "the end of the second snapshot");
    needed = 64 * MiB; // the next attempt is refused before anything is written
    // When it is not running, the log's last entries say why (a crash's exit and console, a wake's error).
    expect(status(agent.id)!.state, JSON.stringify((await events(agent.id)).slice(-3))).toBe("running");
    // Still the same guest: its memory went on (5 → 6), not back to the older snapshot's 3.
    expect(await counter(agent.id)).toMatchObject({ wake: "warm", count: 6 });
    const err = status(agent.id)!.lastHibernateError as HibernateFailure;
    expect(err).toMatchObject({ code: "ENOSPC", attempts: 1 });
    let log = await events(agent.id);
    const fail1 = log.filter((e) => e.reason === "hibernate_failed")[0]!;
    expect(fail1).toMatchObject({ fromState: "snapshotting", toState: "running" });
    expect(fail1.detail).toMatchObject({ code: "ENOSPC", sleepReason: "idle", attempts: 1, retryInMs: 2000 });
    expect(fail1.detail!.writtenBytes as number).toBeGreaterThan(1 * MiB);
    expect(fail1.detail!.freeBytes as number).toBeGreaterThan(20 * MiB);
    expect(fail1.detail!.neededBytes as number).toBeGreaterThanOrEqual(fail1.detail!.writtenBytes as number);
    // QEMU only says "Broken pipe"; its writer's own words came through although QEMU's log file sits on the full disk.
    expect(String(fail1.detail!.error)).toMatch(/No space left on device/);
    // The older snapshot is untouched, and the failed attempt left nothing behind.
    expect(readFileSync(join(dir, "snapshot.json"), "utf8")).toBe(manifestText);
    expect(sha(join(dir, older.file))).toBe(olderSha);
    expect(readdirSync(dir).filter((f) => /\.tmp/.test(f))).toEqual([]);

    // The second attempt waits out the backoff (2 s), and is refused by the free-space check.
    await waitFor(() => (status(agent.id)?.lastHibernateError?.attempts ?? 0) >= 2, 20_000, "a second attempt");
    log = await events(agent.id);
    const fails = log.filter((e) => e.reason === "hibernate_failed");
    const starts = log.filter((e) => e.toState === "snapshotting");
    expect(fails).toHaveLength(2);
    expect(Date.parse(starts[2]!.at) - Date.parse(fails[0]!.at)).toBeGreaterThanOrEqual(2000 - 2);
    expect(fails[1]!.detail).toMatchObject({ code: "ENOSPC", neededBytes: 64 * MiB, attempts: 2, retryInMs: 4000 });
    expect(fails[1]!.detail!.freeBytes as number).toBeLessThan(64 * MiB);
    expect(fails[1]!.detail!.writtenBytes).toBeUndefined();
    expect(log.some((e) => e.toState === "failed" || e.toState === "stopped")).toBe(false);

    // Room again: the third attempt (4 s later) succeeds, and a wake brings back the latest state.
    rmSync(filler);
    await waitFor(() => status(agent.id)?.state === "hibernated", 20_000, "the hibernate after space was freed");
    log = await events(agent.id);
    const done = log.filter((e) => e.toState === "snapshotting").at(-1)!;
    expect(Date.parse(done.at) - Date.parse(log.filter((e) => e.reason === "hibernate_failed")[1]!.at)).toBeGreaterThanOrEqual(4000 - 2);
    expect(status(agent.id)!.lastHibernateError).toBeUndefined();
    const newer = JSON.parse(readFileSync(join(dir, "snapshot.json"), "utf8")) as SnapshotManifest;
    expect(newer.file).not.toBe(older.file);
    expect(existsSync(join(dir, older.file))).toBe(false);
    expect(await counter(agent.id)).toMatchObject({ wake: "restore", count: 7 });
    const took = (i: number) => Date.parse(fails[i]!.at) - Date.parse(starts[i + 1]!.at);
    console.info(`failed hibernates: ${took(0)} ms (the write filled the disk), ${took(1)} ms (refused by the free-space check)`);
    expect((await sys.call(`/v1/agents/${agent.id}`, { method: "DELETE" })).status).toBeLessThan(300);
  }, 120_000);

  it("a restore that falls back to a cold boot is named boot in server-timing and in the run's timings", async (ctx) => {
    if (!sys) return ctx.skip();
    const agent = await sys.createAgent({ idleTimeoutMs: 600_000 });
    const dir = join(vmsDir, agent.id);
    expect((await counter(agent.id)).count).toBe(1);
    expect(await (await sys.call(`/v1/agents/${agent.id}/hibernate`, { method: "POST" })).json()).toMatchObject({ state: "hibernated" });
    const m = JSON.parse(readFileSync(join(dir, "snapshot.json"), "utf8")) as SnapshotManifest;
    const fd = openSync(join(dir, m.file), "r+");
    writeSync(fd, Buffer.alloc(64, 0xa5), 0, 64, Math.floor(m.bytes / 2));
    closeSync(fd);

    const fallback = await counter(agent.id);
    expect(fallback).toMatchObject({ wake: "boot", count: 1 }); // a new guest: the corrupt state never ran
    expect(fallback.timing).toMatch(/(^|, )boot;dur=\d/);
    expect(fallback.timing).not.toMatch(/restore;/);

    await sys.host.flush();
    const { runs } = (await (await sys.call(`/v1/agents/${agent.id}/runs`)).json()) as { runs: { wakeMode: string; timings: Record<string, number> }[] };
    expect(runs[0]!.wakeMode).toBe("boot");
    expect(runs[0]!.timings.bootMs).toBeGreaterThan(0);
    expect(runs[0]!.timings.restoreMs).toBeUndefined();
    const woke = (await events(agent.id)).filter((e) => e.fromState === "restoring" && e.toState === "running").at(-1)!;
    expect(woke.detail).toMatchObject({ wake: "boot", fallbackReason: expect.stringMatching(/checksum/) });
  }, 120_000);
});

// File-backed guest RAM on a filesystem that runs full, on real QEMU: the RAM file is reserved whole while its guest
// runs (a full disk kills no VM, awake or idle: only its hibernation fails, and says why), made sparse again once its
// agent sleeps, and a wake that cannot get its space fails with the snapshot kept, instead of booting an empty guest;
// a wake's reservation runs from a waiting helper stub; a RAM file a dead host left reserved is dug at the next start.
import { execFileSync } from "node:child_process";
import { closeSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, statSync, statfsSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningVm, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { processAlive } from "../../fleet-agent/drivers/common/proc.ts";
import type { QemuDriver } from "../../fleet-agent/drivers/qemu/driver.ts";
import { ramSpaceTool } from "../../fleet-agent/drivers/qemu/ram-space.ts";
import type { SnapshotManifest } from "../../fleet-agent/drivers/qemu/snapshot.ts";
import { fetchAt, json, makeDriver, makeSpec } from "../helpers/qemu.ts";
import { mountTmpfs, type Tmpfs } from "../helpers/tmpfs.ts";
import { waitFor } from "../helpers/wait.ts";

const MiB = 1024 * 1024;
const root = mkdtempSync(join(tmpdir(), "agentvm-ramspace-"));
const fsDir = join(root, "fs");
const filler = join(fsDir, "filler.bin");
let fs: Tmpfs | undefined;
let driver: QemuDriver | undefined;

beforeAll(async () => {
  mkdirSync(fsDir, { recursive: true });
  // Room for one 256 MiB guest's RAM file reserved whole, its snapshots, and little else.
  fs = mountTmpfs(fsDir, 400, "agentvm-ramspace");
  if (!fs) return;
  // The free-space check before a snapshot is off: the test reaches the write that meets the full disk.
  driver = await makeDriver({ memory: "file", snapshotBytesNeeded: () => 0 });
}, 120_000);

afterAll(async () => {
  try {
    await driver?.close();
  } finally {
    fs?.unmount();
    rmSync(root, { recursive: true, force: true });
  }
}, 120_000);

const allocated = (file: string) => statSync(file).blocks * 512;
const freeOf = (dir: string) => {
  const s = statfsSync(dir);
  return s.bavail * s.bsize;
};
const bump = async (vm: RunningVm) => (await json<{ count: number }>(vm.endpoint, "/counter", { method: "POST" })).count;
const manifestOf = (spec: VmSpec) => JSON.parse(readFileSync(join(spec.stateDir, "snapshot.json"), "utf8")) as SnapshotManifest;

/** Fills the filesystem, leaving `leave` bytes free; returns a function that frees it again. */
function fill(leave: number): () => void {
  const fd = openSync(filler, "w");
  const chunk = Buffer.alloc(MiB, 1);
  try {
    while (freeOf(fsDir) > leave + chunk.length) writeSync(fd, chunk);
    for (;;) {
      if (freeOf(fsDir) <= leave) break;
      writeSync(fd, Buffer.alloc(4096, 1));
    }
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOSPC") throw err;
  } finally {
    closeSync(fd);
  }
  return () => rmSync(filler, { force: true });
}

/** Whether a dig of `file` runs (ram-space.ts: a helper whose command line is `… dig FILE`). */
function digging(file: string): boolean {
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").join(" ").includes(`dig ${file}`)) return true;
    } catch {}
  }
  return false;
}

/** Makes the guest write memory: echo bodies pass through its socket buffers and the server's own buffer. */
async function dirtyGuest(vm: RunningVm, times: number): Promise<void> {
  const body = Buffer.alloc(2 * MiB, 7);
  for (let i = 0; i < times; i++) {
    const res = await fetchAt(vm.endpoint, "/echo", { method: "POST", body, signal: AbortSignal.timeout(30_000) });
    expect(res.status).toBe(200);
    expect((await res.arrayBuffer()).byteLength).toBe(body.length);
  }
}

describe("file-backed RAM on a filesystem that runs full", () => {
  it("is reserved while awake and sparse while asleep; a full disk fails only the hibernation, and a wake that cannot get its space keeps the snapshot", async (ctx) => {
    if (!driver) return ctx.skip();
    const d = driver;
    const spec = makeSpec({ stateDir: join(fsDir, "vm") });
    const ram = join(spec.stateDir, "ram");
    const { vm } = await d.boot(spec);
    expect(await bump(vm)).toBe(1);
    // Awake: every block of the RAM file is allocated, whatever the guest has written so far.
    expect(allocated(ram)).toBe(spec.memMiB * MiB);

    // The filesystem full under the running guest: it runs on, writes memory, answers.
    let release = fill(0);
    try {
      expect(freeOf(fsDir)).toBeLessThan(MiB);
      await dirtyGuest(vm, 10);
      await new Promise((r) => setTimeout(r, 2000)); // idle on a full disk: timers and the kernel write memory too
      expect(processAlive(vm.pid!)).toBe(true);
      expect(await bump(vm)).toBe(2);
      // Its hibernation fails (the device state has nowhere to go), says why, and the guest runs on with its memory.
      await expect(d.hibernate(vm)).rejects.toThrow(/no space|No space left on device/i);
      expect(processAlive(vm.pid!)).toBe(true);
      expect(await bump(vm)).toBe(3);
    } finally {
      release();
    }
    const first = await d.hibernate(vm);
    expect(first.completed).toBe(true);
    // Asleep: the zero ranges and the reserved but unwritten blocks are holes again (the dig runs after the answer).
    await waitFor(() => allocated(ram) < 128 * MiB, 30_000, "the RAM file's holes dug");
    const manifest = manifestOf(spec);

    // A wake on a full filesystem cannot reserve the RAM file: it fails, says so, and leaves the snapshot as it was.
    release = fill(0);
    try {
      await expect(d.wake(spec)).rejects.toThrow(/no space for the guest.s RAM file/);
      expect(manifestOf(spec)).toEqual(manifest);
    } finally {
      release();
    }
    // With room again the same snapshot restores: the guest's memory is all there. Its reservation runs from the
    // helper stub that was waiting (no fork of this process on the wake's path).
    const helpers = (
      d as unknown as { helperStubs: { idle: { pid: number }[]; take: (c: { command: string; args: string[] }) => { pid?: number } | undefined } }
    ).helperStubs;
    await waitFor(() => helpers.idle.length > 0, 5000, "a waiting helper stub");
    const waitingPid = helpers.idle[0]!.pid;
    const taken: { command: string; pid?: number }[] = [];
    const take = helpers.take.bind(helpers);
    helpers.take = (c) => {
      const child = take(c);
      taken.push({ command: [c.command, ...c.args].join(" "), ...(child?.pid ? { pid: child.pid } : {}) });
      return child;
    };
    const woke = await d.wake(spec);
    expect(taken[0]).toEqual({ command: expect.stringMatching(/ram-space-\w+ reserve .*\/vm\/ram$/), pid: waitingPid });
    expect(woke.mode).toBe("restore");
    expect(await bump(woke.vm)).toBe(4);
    expect(allocated(ram)).toBe(spec.memMiB * MiB);

    // A RAM file left reserved whole (a kept QEMU that died with its fleet-agent) is dug when the next host reaps the
    // VM at its start; the snapshot still restores over it.
    expect((await d.hibernate(woke.vm)).completed).toBe(true);
    await waitFor(() => allocated(ram) < 128 * MiB && !digging(ram), 30_000, "the RAM file's holes dug, its dig over");
    const tool = ramSpaceTool();
    if (!("path" in tool)) throw new Error(tool.error);
    execFileSync(tool.path, ["reserve", ram]);
    expect(allocated(ram)).toBe(spec.memMiB * MiB);
    await d.reap(spec);
    await waitFor(() => allocated(ram) < 128 * MiB, 30_000, "the reaped VM's RAM file dug");
    const again = await d.wake(spec);
    expect(again.mode).toBe("restore");
    expect(await bump(again.vm)).toBe(5);
    await d.destroy(spec);
  }, 240_000);
});

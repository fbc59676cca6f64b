// File-backed guest RAM (`memory: "file"`): the RAM file `<stateDir>/ram`, its generation, and what a snapshot records
// of it so that device state is never loaded over RAM of another run.
//
// What is checked of the RAM file on a wake, and why that is enough without reading it (a checksum of 256 MiB on
// every wake would cost more than the whole restore):
// - the generation (`ram.gen` beside it, a random id written and synced like common/agent-disk.ts's `disk.gen`). A
//   new one is in effect before a guest can run on the file: at a cold boot (which also starts a fresh, sparse file)
//   and on a wake, staged while QEMU starts and loads and committed after the load, just before `cont` (a host killed
//   before the commit leaves the snapshot valid: no guest ran on it). With `share=on` every guest write lands in the
//   file, so a snapshot is consumed by the wake that uses it; any run since the snapshot (a crash while awake, a kill
//   between the commit and `cont`, a failed hibernation after a wake) has moved the generation on → cold boot.
// - size, inode and mtime (ns): a file replaced, copied over or written from outside (a shared mapping's writes
//   update mtime too; the snapshot records it after the guest was stopped and the file synced). The generation alone
//   would not see a RAM file copied in from another VM without its `ram.gen`.
// Not checked: the bytes themselves (a disk that flips them is the filesystem's concern, as for the agent's disk).
//
// Durability: a hibernation commits its manifest as soon as the device state is durable; the RAM file's dirty pages
// are still being written back (an fsync started when the guest stopped). The manifest then says so (`ramPending`,
// with the host's boot id), and `ram.synced` names the snapshot once the fsync is done. What that can lose, and how a
// wake tells (`ramDurability`):
// - a process kill (of QEMU or the fleet-agent) loses nothing: the page cache holds every page the guest wrote and
//   survives it, so the file reads as the guest left it whether or not it reached the disk. Same boot id: loadable.
// - a power loss or kernel crash within the write-back window (the fsync's duration, tens of ms) may leave some of the
//   new pages on disk and some old: torn RAM. After the reboot the boot id differs and `ram.synced` does not name the
//   snapshot, so the wake refuses it and boots cold with the disk intact (the migration flushed the disk before the
//   manifest was written). Only the agent's memory since its last durable snapshot is lost, as for any hibernation
//   cut short by the power loss.
// - the fsync fails (an I/O error, a full disk under the sparse file): the manifest is removed, the next wake boots cold.
import { readFileSync } from "node:fs";
import { open, readFile, rename, rm, stat } from "node:fs/promises";
import { dirname } from "node:path";
import { fsyncPath, stageGeneration, writeGeneration, type StagedGeneration } from "../common/snapshot-files.ts";
import type { VmPaths } from "./args.ts";

/** A manifest committed before its RAM file's pages were durable (they were being written back). */
export interface RamPending {
  /** The host kernel's boot id then: the page cache that held the pages lives as long as that boot. */
  bootId: string;
}

/** This boot of the host's kernel (`/proc/sys/kernel/random/boot_id`); "" when unreadable (then no pending snapshot is trusted). */
export function currentBootId(): string {
  try {
    return readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
  } catch {
    return "";
  }
}

function syncedMark(file: string, generation: string): string {
  return `${generation} ${file}`;
}

/** `ram.synced` beside the RAM file: `<generation> <snapshot file>` of the snapshot whose RAM pages are durable. */
function syncedPath(paths: Pick<VmPaths, "ram">): string {
  return `${paths.ram}.synced`;
}

/** Records (synced) that the RAM pages of snapshot `file` (RAM generation `generation`) are durable. */
export async function markRamDurable(paths: Pick<VmPaths, "ram">, file: string, generation: string): Promise<void> {
  const path = syncedPath(paths);
  const tmp = `${path}.tmp`;
  const fh = await open(tmp, "w");
  try {
    await fh.writeFile(`${syncedMark(file, generation)}\n`);
    await fh.sync();
  } finally {
    await fh.close();
  }
  await rename(tmp, path);
  await fsyncPath(dirname(path));
}

/**
 * Why the snapshot's RAM file may not hold what its device state pairs with although its fingerprint matches (the
 * write-back of its pages may have been cut short by a reboot); undefined when it does. See the file's opening.
 */
export async function ramDurability(
  paths: Pick<VmPaths, "ram">,
  m: { file: string; ram?: RamFingerprint | undefined; ramPending?: RamPending | undefined },
  bootId: string,
): Promise<string | undefined> {
  if (!m.ramPending || !m.ram) return undefined;
  const mark = await readFile(syncedPath(paths), "utf8").then(
    (t) => t.trim(),
    () => "",
  );
  if (mark === syncedMark(m.file, m.ram.generation)) return undefined;
  if (bootId !== "" && m.ramPending.bootId === bootId) return undefined; // the page cache still holds every page
  return "the host restarted before the RAM file's pages of this snapshot were durable (they may be torn)";
}

/** What a snapshot records of the RAM file it pairs with. */
export interface RamFingerprint {
  bytes: number;
  /** A decimal string: it does not fit a JSON number. */
  mtimeNs: string;
  ino: string;
  generation: string;
}

/** The RAM file's fingerprint now; undefined when the file is missing. */
export async function ramFingerprint(paths: Pick<VmPaths, "ram" | "ramGeneration">): Promise<RamFingerprint | undefined> {
  const s = await stat(paths.ram, { bigint: true }).catch(() => undefined);
  if (!s) return undefined;
  const generation = await readFile(paths.ramGeneration, "utf8").then(
    (t) => t.trim(),
    () => "",
  );
  return { bytes: Number(s.size), mtimeNs: s.mtimeNs.toString(), ino: s.ino.toString(), generation };
}

/** Why device state recorded with `recorded` cannot be loaded over the RAM file as it is `now`; undefined when it can. */
export function ramChange(recorded: RamFingerprint | undefined, now: RamFingerprint | undefined, memMiB: number): string | undefined {
  if (!recorded) return "snapshot records no RAM file (taken with streamed memory)";
  if (!now) return "RAM file is missing";
  if (now.bytes !== memMiB * 1024 * 1024 || recorded.bytes !== now.bytes)
    return `RAM file has ${now.bytes} bytes, the snapshot ${recorded.bytes}, the VM ${memMiB} MiB`;
  if (recorded.generation !== now.generation)
    return "RAM file changed since the snapshot (another generation: the guest ran on it after it was taken, or it is another's)";
  if (recorded.ino !== now.ino || recorded.mtimeNs !== now.mtimeNs) return "RAM file changed since the snapshot (replaced or written from outside)";
  return undefined;
}

/**
 * Starts a new RAM generation: from here no snapshot taken earlier pairs with the file. Call it before a guest may
 * run on the file (a cold boot; a wake after the load, before `cont`).
 */
export function beginRamGeneration(paths: Pick<VmPaths, "ramGeneration">): Promise<string> {
  return writeGeneration(paths.ramGeneration);
}

/** The next RAM generation, staged (snapshot-files.ts `stageGeneration`): a wake commits it just before `cont`. */
export function stageRamGeneration(paths: Pick<VmPaths, "ramGeneration">): Promise<StagedGeneration> {
  return stageGeneration(paths.ramGeneration);
}

/** A cold boot's RAM: a new sparse file of the guest's size (nothing of an earlier run), and a new generation. */
export async function freshRamFile(paths: Pick<VmPaths, "ram" | "ramGeneration">, memMiB: number): Promise<void> {
  await beginRamGeneration(paths);
  await rm(paths.ram, { force: true });
  const fh = await open(paths.ram, "wx");
  try {
    await fh.truncate(memMiB * 1024 * 1024);
  } finally {
    await fh.close();
  }
}

/**
 * Makes the guest's dirty pages durable. With `share=on` they are the file's page cache, so an fsync from here
 * writes them whether or not QEMU still maps the file; done once the guest is stopped (nothing dirties it after).
 */
export function syncRamFile(paths: Pick<VmPaths, "ram">): Promise<void> {
  return fsyncPath(paths.ram);
}

// An agent's persistent disk (`<stateDir>/disk.ext4`, the writable layer over its image) and the fingerprint that
// ties a memory snapshot to the disk it was taken with; shared by the drivers that give a VM real block devices.
//
// Why a fingerprint: a memory snapshot holds the guest's page cache and ext4's in-memory state, so it is only valid
// with the disk exactly as it was when taken. A restored VM writes to its disk again; if the host dies before the
// next snapshot, restoring the old memory over the newer disk would corrupt the filesystem. Size and mtime catch a
// disk changed from outside (copied back, touched, appended to), but mtime is only as fine as the host kernel's
// timestamps and says nothing when a write happened to land in the same tick. So each disk also has a generation
// (`disk.gen` beside it): a new random one is written (and synced) every time a VM is about to run on the disk —
// before a cold boot, and after a restore's checks but before the guest resumes. A snapshot records the generation
// it was taken in; any run on the disk since then has moved it on, whatever the clocks say.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { link, open, readFile, rm, stat, truncate } from "node:fs/promises";
import { dirname, join } from "node:path";
import { silentLogger, type Logger } from "../../../lib/log.ts";
import { fsyncPath, stageGeneration, writeGeneration, type StagedGeneration } from "./snapshot-files.ts";

export const AGENT_DISK_FILE = "disk.ext4";
export const AGENT_DISK_LABEL = "agentvm-disk";
const GENERATION_FILE = "disk.gen";
/** An agent's disk when its spec names no size, MiB. */
export const DEFAULT_DISK_MIB = 1024;
/** Smaller ext4 filesystems with a journal are refused by mke2fs or leave the agent next to nothing. */
export const MIN_DISK_MIB = 16;

/** What a snapshot records of the disk it pairs with. */
export interface DiskFingerprint {
  /** Size of the disk file in bytes. */
  bytes: number;
  /** mtime in ns since the epoch (a decimal string: it does not fit a JSON number). */
  mtimeNs: string;
  /** The disk's generation when the snapshot was taken (see the top of this file); "" when it has none. */
  generation: string;
}

export function agentDiskPath(stateDir: string): string {
  return join(stateDir, AGENT_DISK_FILE);
}

function generationPath(diskPath: string): string {
  return join(dirname(diskPath), GENERATION_FILE);
}

/** The mke2fs to run: PATH's, else e2fsprogs' usual places (a non-login root shell may lack /sbin in PATH). */
export function mke2fsBinary(): string {
  for (const p of ["/usr/sbin/mke2fs", "/sbin/mke2fs"]) if (existsSync(p)) return p;
  return "mke2fs";
}

/** Runs a command to completion; rejects with its stderr when it fails. */
export function runTool(cmd: string, args: readonly string[], env?: NodeJS.ProcessEnv): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, [...args], { stdio: ["ignore", "ignore", "pipe"], ...(env ? { env } : {}) });
    let stderr = "";
    child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr = (stderr + d).slice(-4000)));
    child.once("error", (err) => reject(new Error(`${cmd}: ${err.message}`)));
    child.once("close", (code, signal) => {
      if (code === 0) resolve();
      else reject(new Error(`${cmd} ${args.join(" ")} failed (${signal ?? `exit ${code}`}): ${stderr.trim()}`));
    });
  });
}

/**
 * `<stateDir>/disk.ext4`, created when absent: a sparse file of `diskMiB` formatted with `mke2fs -t ext4` (labelled
 * `agentvm-disk`, no blocks reserved for root: the agent gets all of it), made under a temporary name and linked
 * into place, so a crash leaves no half-formatted disk and a disk that appeared meanwhile is never replaced. An
 * existing disk is returned as it is, even when `diskMiB` changed (resizing it is not done here; logged).
 */
export async function ensureAgentDisk(stateDir: string, diskMiB: number, log: Logger = silentLogger): Promise<string> {
  const path = agentDiskPath(stateDir);
  const existing = await stat(path).catch(() => undefined);
  if (existing) {
    if (existing.size !== diskMiB * 1024 * 1024) log.warn("agent disk kept at its size; diskMiB differs", { path, bytes: existing.size, diskMiB });
    return path;
  }
  if (!Number.isInteger(diskMiB) || diskMiB < MIN_DISK_MIB) throw new Error(`diskMiB must be an integer ≥ ${MIN_DISK_MIB}, got ${diskMiB}`);
  const tmp = `${path}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
  const started = performance.now();
  try {
    const fh = await open(tmp, "wx");
    await fh.close();
    await truncate(tmp, diskMiB * 1024 * 1024); // sparse: blocks are allocated as the guest writes
    await runTool(mke2fsBinary(), ["-t", "ext4", "-F", "-q", "-b", "4096", "-m", "0", "-L", AGENT_DISK_LABEL, tmp]);
    await fsyncPath(tmp);
    try {
      await link(tmp, path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    }
    await fsyncPath(stateDir);
  } finally {
    await rm(tmp, { force: true });
  }
  log.info("agent disk created", { path, diskMiB, ms: Math.round(performance.now() - started) });
  return path;
}

/** The disk's fingerprint now (size, mtime, generation). Throws when the disk file is missing. */
export async function diskFingerprint(path: string): Promise<DiskFingerprint> {
  const s = await stat(path, { bigint: true });
  return { bytes: Number(s.size), mtimeNs: s.mtimeNs.toString(), generation: await readGeneration(path) };
}

/**
 * Starts a new generation of the disk: call it before a VM may write to the disk (before a cold boot; on a restore
 * after the fingerprint matched and before the guest resumes). From then on no snapshot taken earlier pairs with it.
 */
export function beginDiskGeneration(path: string): Promise<string> {
  return writeGeneration(generationPath(path));
}

/** The disk's next generation, staged (snapshot-files.ts `stageGeneration`): a wake commits it just before `cont`. */
export function stageDiskGeneration(path: string): Promise<StagedGeneration> {
  return stageGeneration(generationPath(path));
}

/** Why a snapshot that recorded `recorded` cannot be restored over the disk as it is `now`; undefined when it can. */
export function diskChange(recorded: DiskFingerprint | undefined, now: DiskFingerprint | undefined): string | undefined {
  if (!recorded) return "disk changed since the snapshot (the snapshot recorded no disk fingerprint)";
  if (!now) return "disk changed since the snapshot (the disk is missing)";
  if (recorded.bytes !== now.bytes) return `disk changed since the snapshot (size ${recorded.bytes} → ${now.bytes} bytes)`;
  if (recorded.mtimeNs !== now.mtimeNs) return "disk changed since the snapshot (modified after it was taken)";
  if (recorded.generation !== now.generation) return "disk changed since the snapshot (the VM ran on the disk after it was taken)";
  return undefined;
}

async function readGeneration(path: string): Promise<string> {
  try {
    return (await readFile(generationPath(path), "utf8")).trim();
  } catch {
    return "";
  }
}

// Snapshot files of the qemu driver: the manifest that makes a snapshot complete, its checksum, and the compatibility rule.
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { open, readFile, readdir, rename, rm } from "node:fs/promises";
import { basename, dirname, join } from "node:path";

export const MANIFEST_VERSION = 1;

/** What the QEMU about to restore looks like; the snapshot must match it. */
export interface RestoreTarget {
  qemuVersion: string;
  accel: string;
  /** Host CPU model: under KVM the guest sees the host's CPU (`-cpu host`). */
  hostCpu: string;
  machineArgs: string[];
  memMiB: number;
  vcpus: number;
}

/**
 * `snapshot.json` names the one complete snapshot of a VM. It is replaced by rename only after its
 * data file is complete and synced, so a crash at any point leaves the old or the new snapshot.
 */
export interface SnapshotManifest extends RestoreTarget {
  version: number;
  /** Data file name inside the stateDir (`snapshot-<time>.bin`). */
  file: string;
  sha256: string;
  bytes: number;
  createdAt: string;
  snapshotMs: number;
}

/** Host-side network settings (forwarded port, egress) do not change the virtual hardware. */
function hardware(args: readonly string[]): string[] {
  return args.map((a) => a.replace(/,restrict=(on|off)/, "").replace(/,hostfwd=tcp:[^,]*/g, ""));
}

/** Why this snapshot cannot be restored into `target`, or undefined when it can. */
export function incompatibility(m: SnapshotManifest, target: RestoreTarget): string | undefined {
  if (m.version !== MANIFEST_VERSION) return `snapshot manifest version ${m.version}, driver writes ${MANIFEST_VERSION}`;
  if (m.qemuVersion !== target.qemuVersion) return `snapshot taken by "${m.qemuVersion}", this host runs "${target.qemuVersion}"`;
  if (m.accel !== target.accel) return `snapshot taken under ${m.accel}, this host uses ${target.accel}`;
  if (m.accel === "kvm" && m.hostCpu !== target.hostCpu) return `snapshot taken on a "${m.hostCpu}" CPU under KVM, this host has "${target.hostCpu}"`;
  if (m.memMiB !== target.memMiB) return `snapshot has ${m.memMiB} MiB of memory, the VM now has ${target.memMiB} MiB`;
  if (m.vcpus !== target.vcpus) return `snapshot has ${m.vcpus} vCPUs, the VM now has ${target.vcpus}`;
  const a = hardware(m.machineArgs).join(" ");
  const b = hardware(target.machineArgs).join(" ");
  if (a !== b) return "snapshot was taken with other virtual hardware (machine arguments differ)";
  return undefined;
}

export async function readManifest(path: string): Promise<SnapshotManifest | undefined> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw err;
  }
  const m = JSON.parse(text) as SnapshotManifest;
  if (typeof m.file !== "string" || m.file.includes("/") || typeof m.sha256 !== "string") throw new Error(`malformed snapshot manifest ${path}`);
  return m;
}

export async function sha256File(path: string, signal?: AbortSignal): Promise<{ sha256: string; bytes: number }> {
  const hash = createHash("sha256");
  let bytes = 0;
  const stream = createReadStream(path, { highWaterMark: 4 << 20, ...(signal ? { signal } : {}) });
  for await (const chunk of stream) {
    hash.update(chunk as Buffer);
    bytes += (chunk as Buffer).length;
  }
  return { sha256: hash.digest("hex"), bytes };
}

export async function fsyncPath(path: string): Promise<void> {
  const fh = await open(path, "r");
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** Writes the manifest under a temporary name, syncs it, renames it into place and syncs the directory. */
export async function commitManifest(manifest: SnapshotManifest, path: string, tmpPath: string): Promise<void> {
  const fh = await open(tmpPath, "w");
  try {
    await fh.writeFile(`${JSON.stringify(manifest, null, 2)}\n`);
    await fh.sync();
  } finally {
    await fh.close();
  }
  await rename(tmpPath, path);
  await fsyncPath(dirname(path));
}

/** Removes snapshot data files the manifest does not name (older snapshots, partial files). */
export async function removeUnreferencedSnapshots(stateDir: string, keep: string | undefined): Promise<string[]> {
  const removed: string[] = [];
  let names: string[];
  try {
    names = await readdir(stateDir);
  } catch {
    return removed;
  }
  for (const name of names) {
    if (!/^snapshot(-[\w.-]+\.bin|\.tmp|\.tmp\.done|\.json\.tmp)$/.test(name)) continue;
    if (keep && name === basename(keep)) continue;
    await rm(join(stateDir, name), { force: true });
    removed.push(name);
  }
  return removed;
}

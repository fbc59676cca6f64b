// Snapshot files of one Firecracker VM: generation-named state + memory files and one manifest as the commit point.
//
// Firecracker writes `snap-<gen>.state.tmp` / `snap-<gen>.mem.tmp`; they are fsynced, checksummed and renamed,
// then `snapshot.json` (the manifest) is written to a temporary name and renamed over the old one. Until that
// rename the old manifest names the old, intact files; after it, the new ones. A crash at any point leaves one
// complete snapshot (or none), never a mix. Files no manifest names are removed afterwards (and by reap).
import { rename, rm, stat } from "node:fs/promises";
import { basename, join } from "node:path";
import type { DiskFingerprint } from "../common/agent-disk.ts";
import { commitManifest, fsyncPath, readManifest as readManifestFile, removeFiles, sha256File } from "../common/snapshot-files.ts";
import { MANIFEST_FILE } from "../common/state-dir.ts";
import type { Drive } from "./api.ts";
import { describeCpu, type CpuIdentity, type FirecrackerHostFacts } from "./host.ts";

export interface SnapshotFile {
  /** File name inside the VM's snapshot directory. */
  file: string;
  bytes: number;
  sha256: string;
}

/** What a memory snapshot depends on of the machine that took it: a snapshot (or checkpoint) loads only where it matches. */
export interface MachineIdentity {
  firecrackerVersion: string;
  snapshotFormat: string;
  cpu: CpuIdentity;
  hostKernel: string;
  vcpus: number;
  memMiB: number;
}

export interface SnapshotManifest extends MachineIdentity {
  format: 1;
  generation: number;
  createdAt: string;
  type: "Full" | "Diff";
  /** Host tap device the guest's eth0 was attached to (a different one needs `network_overrides`). */
  tap: string | undefined;
  state: SnapshotFile;
  mem: SnapshotFile;
  /** A built image's VM: absent for the built-in image (whose snapshots have no drives). */
  image?: SnapshotImage;
  /**
   * The guest's own address (the kernel `ip=` it booted with, held in its memory: a restore cannot change it). Absent
   * in manifests written before it was recorded.
   */
  guestIp?: string;
  /** The vsock UDS path as the Firecracker process saw it (a restore elsewhere needs `vsock_override`). */
  vsock?: string;
  /** Made from this checkpoint by restoreCheckpoint: the wake gives the guest a fresh identity (checkpoint.ts). */
  clonedFrom?: string;
}

/**
 * What a built image's snapshot pairs with: Firecracker restores the drives from the snapshot itself, opening the
 * same `path_on_host`s, and the guest's memory is valid only over the disk as it was when the snapshot was taken.
 */
export interface SnapshotImage {
  digest: string;
  /** The PUT /drives bodies the VM was booted with, paths as the Firecracker process saw them. */
  drives: Drive[];
  disk: DiskFingerprint;
}

export function generationFiles(dir: string, generation: number): { state: string; mem: string; stateTmp: string; memTmp: string } {
  const state = join(dir, `snap-${generation}.state`);
  const mem = join(dir, `snap-${generation}.mem`);
  return { state, mem, stateTmp: `${state}.tmp`, memTmp: `${mem}.tmp` };
}

/** The committed manifest, undefined when there is none; a manifest that does not parse is reported as such. */
export function readManifest(dir: string): Promise<{ manifest?: SnapshotManifest; problem?: string }> {
  return readManifestFile<SnapshotManifest>(
    join(dir, MANIFEST_FILE),
    (m) => m.format === 1 && typeof m.generation === "number" && !!m.state?.file && !!m.mem?.file,
  );
}

/** Why this snapshot cannot be restored on this host for this spec (undefined when it can). */
export function incompatibility(
  m: Pick<SnapshotManifest, "firecrackerVersion" | "snapshotFormat" | "cpu" | "hostKernel" | "vcpus" | "memMiB"> & { image?: { digest: string } | undefined },
  host: FirecrackerHostFacts,
  spec: { vcpus: number; memMiB: number; rootImage?: { digest: string } | undefined },
): string | undefined {
  if (m.firecrackerVersion !== host.firecrackerVersion)
    return `snapshot made by firecracker ${m.firecrackerVersion}, this host runs ${host.firecrackerVersion}`;
  if (m.snapshotFormat !== host.snapshotFormat) return `snapshot data format ${m.snapshotFormat}, this firecracker reads ${host.snapshotFormat}`;
  const a = describeCpu(m.cpu);
  const b = describeCpu(host.cpu);
  if (a !== b) return `snapshot made on CPU ${a}, this host has ${b}`;
  if (m.hostKernel !== host.hostKernel) return `snapshot made on host kernel ${m.hostKernel}, this host runs ${host.hostKernel}`;
  if (m.vcpus !== spec.vcpus || m.memMiB !== spec.memMiB)
    return `snapshot has ${m.vcpus} vCPU / ${m.memMiB} MiB, the agent now asks for ${spec.vcpus} vCPU / ${spec.memMiB} MiB`;
  const had = m.image?.digest;
  const wants = spec.rootImage?.digest;
  if (had !== wants)
    return `snapshot runs ${had ? `image ${had}` : "the built-in image"}, the agent now runs ${wants ? `image ${wants}` : "the built-in image"}`;
  return undefined;
}

/** Why the files do not match the manifest (missing, wrong size, wrong checksum), or undefined when they do. */
export async function verifyFiles(dir: string, m: Pick<SnapshotManifest, "state" | "mem">, opts: { checksums: boolean }): Promise<string | undefined> {
  for (const [what, f] of [
    ["state", m.state],
    ["memory", m.mem],
  ] as const) {
    const path = join(dir, f.file);
    let size: number;
    try {
      size = (await stat(path)).size;
    } catch {
      return `snapshot ${what} file ${f.file} is missing`;
    }
    if (size !== f.bytes) return `snapshot ${what} file ${f.file} has ${size} bytes, the manifest says ${f.bytes} (corrupt)`;
    if (opts.checksums && (await sha256File(path)).sha256 !== f.sha256) return `snapshot ${what} file ${f.file} checksum mismatch (corrupt)`;
  }
  return undefined;
}

export interface CommitInput {
  dir: string;
  generation: number;
  type: "Full" | "Diff";
  host: FirecrackerHostFacts;
  vcpus: number;
  memMiB: number;
  tap: string | undefined;
  image?: SnapshotImage;
  guestIp?: string;
  vsock?: string;
  clonedFrom?: string;
  /** The files' checksums when already known (a checkpoint's, verified before it was copied): not read again. */
  known?: { state: SnapshotFile; mem: SnapshotFile };
}

/** Makes the temporary files of `generation` the current snapshot (see the file comment for the order). */
export async function commitSnapshot(input: CommitInput): Promise<SnapshotManifest> {
  const f = generationFiles(input.dir, input.generation);
  await fsyncPath(f.stateTmp);
  await fsyncPath(f.memTmp);
  const [state, mem] = input.known
    ? [
        { ...input.known.state, file: basename(f.state) },
        { ...input.known.mem, file: basename(f.mem) },
      ]
    : await Promise.all([describeFile(f.stateTmp, f.state), describeFile(f.memTmp, f.mem)]);
  await rename(f.stateTmp, f.state);
  await rename(f.memTmp, f.mem);
  const manifest: SnapshotManifest = {
    format: 1,
    generation: input.generation,
    createdAt: new Date().toISOString(),
    type: input.type,
    firecrackerVersion: input.host.firecrackerVersion,
    snapshotFormat: input.host.snapshotFormat,
    cpu: input.host.cpu,
    hostKernel: input.host.hostKernel,
    vcpus: input.vcpus,
    memMiB: input.memMiB,
    tap: input.tap,
    state,
    mem,
    ...(input.image ? { image: input.image } : {}),
    ...(input.guestIp ? { guestIp: input.guestIp } : {}),
    ...(input.vsock ? { vsock: input.vsock } : {}),
    ...(input.clonedFrom ? { clonedFrom: input.clonedFrom } : {}),
  };
  await commitManifest(join(input.dir, MANIFEST_FILE), manifest);
  return manifest;
}

/** Removes temporary files and generations the manifest does not name. */
export async function removeStaleSnapshotFiles(dir: string): Promise<string[]> {
  const { manifest } = await readManifest(dir);
  const keep = new Set([MANIFEST_FILE, manifest?.state.file, manifest?.mem.file]);
  return removeFiles(dir, (name) => {
    const partial = name.endsWith(".tmp") && (name.startsWith("snap-") || name.startsWith(MANIFEST_FILE));
    const unreferenced = /^snap-\d+\.(state|mem)$/.test(name) && !keep.has(name);
    return partial || unreferenced;
  });
}

/** Removes one generation's temporary files (a cancelled or failed snapshot). */
export async function discardGeneration(dir: string, generation: number): Promise<void> {
  const f = generationFiles(dir, generation);
  await Promise.all([rm(f.stateTmp, { force: true }), rm(f.memTmp, { force: true })]);
}

async function describeFile(tmpPath: string, finalPath: string): Promise<SnapshotFile> {
  const { sha256, bytes } = await sha256File(tmpPath);
  return { file: basename(finalPath), bytes, sha256 };
}

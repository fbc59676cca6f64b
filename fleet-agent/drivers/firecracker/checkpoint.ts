// A firecracker checkpoint: an immutable directory with one VM's Firecracker snapshot (state and memory files), a
// built image's disk, and the manifest that says what it can be restored into. Restore and fork both turn it into a
// VM's snapshot (checkpoint-restore.ts), whose wake then gives the guest a fresh identity.
//
// Its files: `checkpoint.json` (below), `state` (Firecracker's microVM state), `mem` (all guest memory: a Full
// snapshot, or a hibernated VM's memory file, which after a Diff is complete too: hibernation writes the diff onto a
// copy of its base), `disk.ext4` (a built image's disk as the paused guest left it). The directory is written under a
// temporary name and renamed into place: a crash leaves it whole or absent.
//
// What a Firecracker snapshot holds that a restore elsewhere must match or override: the guest's IPv4 address (the
// kernel `ip=` it booted with, applied once by init.sh: only the slot of that address can carry it), the vsock UDS
// path (overridden on load: `vsock_override`), the tap (overridden: `network_overrides`), and each drive's
// `path_on_host` (no override exists: Firecracker reopens the paths the state names, so a built image's checkpoint
// restores only where those paths are the same, i.e. into its own agent, or under the jailer, where they are chroot
// paths and equal for every VM).
import { join } from "node:path";
import type { CopyKind } from "../common/cow-copy.ts";
import { readManifest } from "../common/snapshot-files.ts";
import type { Drive } from "./api.ts";
import type { FirecrackerHostFacts } from "./host.ts";
import type { VmNet } from "./net.ts";
import { incompatibility, type MachineIdentity, type SnapshotFile } from "./snapshot.ts";

export const CHECKPOINT_FORMAT = 1;
export const CHECKPOINT_FILE = "checkpoint.json";
export const CHECKPOINT_STATE = "state";
export const CHECKPOINT_MEM = "mem";
export const CHECKPOINT_DISK = "disk.ext4";

export interface CheckpointManifest extends MachineIdentity {
  format: typeof CHECKPOINT_FORMAT;
  driver: "firecracker";
  /** The VM's image (a built-in name or a built image's digest): a checkpoint restores only into an agent of it. */
  image: string;
  /** The source VM's network slot: its guest's address is in the memory (see the file comment). */
  net: VmNet;
  /** The vsock UDS path the state names (as the source's Firecracker process saw it). */
  vsock: string;
  /** Files in the checkpoint directory, with their sizes and checksums. */
  state: SnapshotFile;
  mem: SnapshotFile;
  /** A built image's VM: its disk, the image digest and the drives as the source's Firecracker was given them. */
  disk?: { file: string; bytes: number; digest: string; drives: Drive[] };
  /** Bytes of every file of the checkpoint (their sizes). */
  totalBytes: number;
  copy: CopyKind;
  /** `running`: a Full snapshot of the paused VM; `hibernated`: a copy of its snapshot of that generation. */
  takenOf: "running" | "hibernated";
  sourceGeneration?: number;
  createdAt: string;
  sourceVmId: string;
  sourceAgentId: string;
}

export function checkpointFiles(dir: string) {
  return { manifest: join(dir, CHECKPOINT_FILE), state: join(dir, CHECKPOINT_STATE), mem: join(dir, CHECKPOINT_MEM), disk: join(dir, CHECKPOINT_DISK) };
}

export function readCheckpoint(dir: string): Promise<{ manifest?: CheckpointManifest; problem?: string }> {
  return readManifest<CheckpointManifest>(
    checkpointFiles(dir).manifest,
    (m) => m.driver === "firecracker" && typeof m.image === "string" && !!m.state?.sha256 && !!m.mem?.sha256 && typeof m.net?.guestIp === "string",
  );
}

/** Why this checkpoint cannot become the snapshot of `spec`'s VM on this host; undefined when it can. */
export function checkpointMismatch(
  c: CheckpointManifest,
  host: FirecrackerHostFacts,
  spec: { image: string; vcpus: number; memMiB: number; rootImage?: { digest: string } | undefined },
): string | undefined {
  if (c.format !== CHECKPOINT_FORMAT) return `checkpoint format ${c.format}, this driver reads ${CHECKPOINT_FORMAT}`;
  if (c.image !== spec.image) return `checkpoint is of image ${c.image}, the agent runs ${spec.image}`;
  if (!c.disk !== !spec.rootImage)
    return c.disk ? "checkpoint has a built image's disk, the agent runs the built-in image" : "checkpoint has no disk, the agent runs a built image";
  const { firecrackerVersion, snapshotFormat, cpu, hostKernel, vcpus, memMiB } = c;
  return incompatibility(
    { firecrackerVersion, snapshotFormat, cpu, hostKernel, vcpus, memMiB, ...(c.disk ? { image: { digest: c.disk.digest } } : {}) },
    host,
    spec,
  );
}

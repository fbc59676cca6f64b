// A qemu checkpoint: an immutable directory with one VM's device state (and its RAM file, and a built image's disk),
// and the manifest that says what it can be restored into. Restore and fork both turn it into a VM's snapshot
// (checkpointing.ts `materialize`, behind the driver's `restoreCheckpoint`); a template is one taken of a freshly booted VM of an image.
//
// Its files: `checkpoint.json` (below), `state.bin` (what `migrate` wrote: device state, plus all guest RAM when the
// driver streams memory), `ram` (file-backed RAM), `disk.ext4` (a built image's disk). The directory is written
// under a temporary name and renamed into place: a crash leaves it whole or absent.
import { join } from "node:path";
import type { CopyKind } from "../common/cow-copy.ts";
import { readManifest } from "../common/snapshot-files.ts";
import type { MemoryMode, VmPaths } from "./args.ts";
import { hardware, incompatibility, MANIFEST_VERSION, type RestoreTarget } from "./snapshot.ts";

export const CHECKPOINT_VERSION = 1;
export const CHECKPOINT_FILE = "checkpoint.json";
export const CHECKPOINT_STATE = "state.bin";
export const CHECKPOINT_RAM = "ram";
export const CHECKPOINT_DISK = "disk.ext4";

export interface CheckpointManifest {
  version: number;
  memory: MemoryMode;
  /** The VM's image (a built-in name or a built image's digest): a checkpoint restores only into an agent of it. */
  image: string;
  sha256: string;
  /** Bytes of `state.bin`. */
  bytes: number;
  /** Bytes of every file of the checkpoint (their sizes). */
  totalBytes: number;
  qemuVersion: string;
  accel: string;
  hostCpu: string;
  memMiB: number;
  vcpus: number;
  /** The machine arguments with the VM's own paths replaced (`portableHardware`): equal for any VM of the same hardware. */
  hardware: string[];
  disk: boolean;
  copy: CopyKind;
  createdAt: string;
  sourceVmId: string;
  sourceAgentId: string;
}

export function checkpointFiles(dir: string) {
  return { manifest: join(dir, CHECKPOINT_FILE), state: join(dir, CHECKPOINT_STATE), ram: join(dir, CHECKPOINT_RAM), disk: join(dir, CHECKPOINT_DISK) };
}

/**
 * Machine arguments as another VM of the same hardware would have them: hardware() drops the host-side network
 * settings, and the VM's own stateDir and socket directory (its console, sockets, RAM file and disk live there)
 * become placeholders. QEMU's migration carries no paths, so two VMs that differ only there restore each other's state.
 */
export function portableHardware(args: readonly string[], paths: Pick<VmPaths, "socketDir" | "ram">, stateDir: string): string[] {
  const dirs = [paths.socketDir, stateDir].filter((d, i, all) => all.indexOf(d) === i).sort((a, b) => b.length - a.length);
  return hardware(args).map((a) => {
    let out = a;
    for (const d of dirs) {
      const mark = d === stateDir ? "$STATE" : "$SOCKETS";
      out = out.split(d.replace(/,/g, ",,")).join(mark).split(d).join(mark);
    }
    return out;
  });
}

/** Why this checkpoint cannot become the snapshot of a VM like `target`; undefined when it can. */
export function checkpointMismatch(c: CheckpointManifest, target: RestoreTarget & { image: string }, targetHardware: string[]): string | undefined {
  if (c.version !== CHECKPOINT_VERSION) return `checkpoint version ${c.version}, this driver reads ${CHECKPOINT_VERSION}`;
  if (c.image !== target.image) return `checkpoint is of image ${c.image}, the agent runs ${target.image}`;
  return incompatibility({ ...c, version: MANIFEST_VERSION, machineArgs: c.hardware }, { ...target, machineArgs: targetHardware });
}

export function readCheckpoint(dir: string): Promise<{ manifest?: CheckpointManifest; problem?: string }> {
  return readManifest<CheckpointManifest>(
    checkpointFiles(dir).manifest,
    (m) => typeof m.sha256 === "string" && Array.isArray(m.hardware) && typeof m.image === "string",
  );
}

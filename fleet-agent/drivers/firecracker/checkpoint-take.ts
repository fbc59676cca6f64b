// Taking a checkpoint of a Firecracker VM (checkpoint.ts): a running one paused for a Full snapshot (and a copy of a
// built image's disk), then resumed with its clock fixed; a hibernated one copied from its snapshot.
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, rename, rm, stat } from "node:fs/promises";
import { join, resolve } from "node:path";
import { AppError } from "../../../lib/errors.ts";
import type { Logger } from "../../../lib/log.ts";
import { agentDiskPath, diskChange, diskFingerprint, type DiskFingerprint } from "../common/agent-disk.ts";
import { cowCopy, type CopyKind } from "../common/cow-copy.ts";
import { fsyncPath, publishDirectory, sha256File } from "../common/snapshot-files.ts";
import { ensureSnapshotSpace, saysNoSpace, snapshotBytesNeeded, SnapshotNoSpace } from "../common/snapshot-space.ts";
import type { CheckpointInfo, RunningVm, VmSpec } from "../driver.ts";
import { FirecrackerApiError, type Drive } from "./api.ts";
import { CHECKPOINT_DISK, CHECKPOINT_FORMAT, CHECKPOINT_MEM, CHECKPOINT_STATE, checkpointFiles, type CheckpointManifest } from "./checkpoint.ts";
import { fixClockAfterPause, syncGuest } from "./guest.ts";
import type { FirecrackerHostFacts } from "./host.ts";
import { pausedDisk } from "./image-files.ts";
import { recordedNet } from "./net.ts";
import type { FirecrackerDriverOptions } from "./options.ts";
import { incompatibility, readManifest, verifyFiles } from "./snapshot.ts";
import type { FirecrackerProcesses } from "./supervisor.ts";

export interface TakeCheckpointDeps {
  opts: Pick<FirecrackerDriverOptions, "syncTimeoutMs" | "restoreTimeoutMs" | "clockTargetMs">;
  log: Logger;
  agentPort: number;
  vms: Pick<FirecrackerProcesses, "paths" | "owned" | "has">;
  ready(): Promise<FirecrackerHostFacts>;
}

/**
 * An immutable copy of the VM (checkpoint.ts). A running one is paused for a Full snapshot into temporary files of
 * its snapshot directory (where the Firecracker process may write, jailed or not) and, with a built image, for a
 * copy of its disk (a reflink where the filesystem has them); it then runs on with its clock fixed. The files are
 * checksummed and moved into the checkpoint after the resume. A hibernated one is copied from its snapshot, once
 * its files still pair (checksums, the disk's fingerprint): AppError `conflict` otherwise.
 */
export async function takeCheckpoint(deps: TakeCheckpointDeps, spec: VmSpec, vm: RunningVm | undefined, dir: string): Promise<CheckpointInfo> {
  const { vms } = deps;
  const started = performance.now();
  if (existsSync(dir)) throw new Error(`checkpoint directory ${dir} exists`);
  const host = await deps.ready();
  const paths = vms.paths(spec);
  const tmp = `${dir}.tmp-${randomBytes(4).toString("hex")}`;
  const out = checkpointFiles(tmp);
  await mkdir(tmp, { recursive: true });
  try {
    const copies: CopyKind[] = [];
    let pausedMs = 0;
    let taken: Pick<CheckpointManifest, "net" | "vsock" | "takenOf" | "sourceGeneration"> & {
      state: { sha256: string; bytes: number };
      mem: { sha256: string; bytes: number };
      drives?: Drive[];
    };
    if (vm) {
      const live = vms.owned(vm);
      const neededBytes = snapshotBytesNeeded(spec.memMiB);
      const freeBefore = await ensureSnapshotSpace(paths.snapDir, neededBytes);
      if (spec.rootImage) await syncGuest(live, deps);
      live.agent?.close(); // vsock idle during the snapshot (Firecracker resets its connections anyway)
      live.agent = undefined;
      // Named like a partial snapshot: a crash leaves files removeStaleSnapshotFiles (and reap) take away.
      const tag = join(paths.snapDir, `snap-ckpt-${randomBytes(4).toString("hex")}`);
      const written = { state: `${tag}.state.tmp`, mem: `${tag}.mem.tmp` };
      const pausedAt = performance.now();
      await live.api.pause();
      try {
        // Any snapshot resets the dirty page bitmap: the next hibernation must be Full.
        live.diffBase = undefined;
        await live.api.createSnapshot({ snapshot_type: "Full", snapshot_path: paths.vm(written.state), mem_file_path: paths.vm(written.mem) });
        // The memory just written is valid over the disk as the paused guest leaves it now.
        if (spec.rootImage) {
          await pausedDisk(spec);
          copies.push(await cowCopy(agentDiskPath(resolve(spec.stateDir)), out.disk));
        }
      } catch (err) {
        await Promise.all([rm(written.state, { force: true }), rm(written.mem, { force: true })]);
        const why = err instanceof FirecrackerApiError ? err.faultMessage : (err as Error).message;
        if (saysNoSpace(why)) throw new SnapshotNoSpace({ dir: paths.snapDir, neededBytes, freeBytes: freeBefore ?? 0, said: why }, { cause: err });
        throw err;
      } finally {
        await live.api.resume().catch((resumeErr: unknown) => {
          // Never left paused for the host to believe it runs: ended, and reported as a crash through onExit.
          deps.log.error("could not resume the VM after a checkpoint; killing it", { vmId: spec.vmId, err: resumeErr });
          live.proc.signal("SIGKILL");
        });
        pausedMs = performance.now() - pausedAt;
      }
      await fixClockAfterPause(live, deps);
      copies.push("copy"); // Firecracker wrote every byte of guest memory
      for (const [from, to] of [
        [written.state, out.state],
        [written.mem, out.mem],
      ] as const) {
        const moved = await moveFile(from, to);
        if (moved) copies.push(moved);
      }
      const [state, mem] = await Promise.all([sha256File(out.state), sha256File(out.mem)]);
      await fsyncPath(out.state);
      await fsyncPath(out.mem);
      taken = { net: live.net, vsock: paths.vm(paths.vsock), takenOf: "running", state, mem, ...(live.drives ? { drives: live.drives } : {}) };
    } else {
      if (vms.has(spec.vmId)) throw new Error(`VM ${spec.vmId} is running: checkpoint it with its RunningVm`);
      const noState = (why: string) => new AppError("conflict", `agent ${spec.agentId} has no state to checkpoint: ${why}`);
      const { manifest, problem } = await readManifest(paths.snapDir);
      if (!manifest) throw noState(problem ?? "it has no snapshot");
      const bad = incompatibility(manifest, host, spec) ?? (await verifyFiles(paths.snapDir, manifest, { checksums: true }));
      if (bad) throw noState(bad);
      if (manifest.image) {
        const changed = diskChange(
          manifest.image.disk,
          await diskFingerprint(agentDiskPath(resolve(spec.stateDir))).catch((): DiskFingerprint | undefined => undefined),
        );
        if (changed) throw noState(changed);
      }
      const net = await recordedNet(spec.stateDir);
      if (!net) throw noState("its network slot is not recorded");
      if (manifest.guestIp && manifest.guestIp !== net.guestIp)
        throw noState(`its snapshot's guest has address ${manifest.guestIp}, not its slot's ${net.guestIp}`);
      copies.push(await cowCopy(join(paths.snapDir, manifest.state.file), out.state));
      copies.push(await cowCopy(join(paths.snapDir, manifest.mem.file), out.mem));
      if (manifest.image) copies.push(await cowCopy(agentDiskPath(resolve(spec.stateDir)), out.disk));
      taken = {
        net,
        vsock: manifest.vsock ?? paths.vm(paths.vsock),
        takenOf: "hibernated",
        sourceGeneration: manifest.generation,
        state: manifest.state,
        mem: manifest.mem,
        ...(manifest.image ? { drives: manifest.image.drives } : {}),
      };
    }
    const diskBytes = spec.rootImage ? (await stat(out.disk)).size : 0;
    const totalBytes = taken.state.bytes + taken.mem.bytes + diskBytes;
    const copy: CopyKind = copies.includes("copy") ? "copy" : "reflink";
    const manifest: CheckpointManifest = {
      format: CHECKPOINT_FORMAT,
      driver: "firecracker",
      image: spec.image,
      firecrackerVersion: host.firecrackerVersion,
      snapshotFormat: host.snapshotFormat,
      cpu: host.cpu,
      hostKernel: host.hostKernel,
      vcpus: spec.vcpus,
      memMiB: spec.memMiB,
      net: taken.net,
      vsock: taken.vsock,
      state: { file: CHECKPOINT_STATE, bytes: taken.state.bytes, sha256: taken.state.sha256 },
      mem: { file: CHECKPOINT_MEM, bytes: taken.mem.bytes, sha256: taken.mem.sha256 },
      ...(spec.rootImage ? { disk: { file: CHECKPOINT_DISK, bytes: diskBytes, digest: spec.rootImage.digest, drives: taken.drives ?? [] } } : {}),
      totalBytes,
      copy,
      takenOf: taken.takenOf,
      ...(taken.sourceGeneration !== undefined ? { sourceGeneration: taken.sourceGeneration } : {}),
      createdAt: new Date().toISOString(),
      sourceVmId: spec.vmId,
      sourceAgentId: spec.agentId,
    };
    await publishDirectory(tmp, out.manifest, manifest, dir);
    const ms = performance.now() - started;
    deps.log.info("checkpoint taken", {
      vmId: spec.vmId,
      dir,
      takenOf: taken.takenOf,
      bytes: totalBytes,
      copy,
      pausedMs: Math.round(pausedMs * 10) / 10,
      ms: Math.round(ms),
    });
    return { bytes: totalBytes, pausedMs, ms, copy };
  } catch (err) {
    await rm(tmp, { recursive: true, force: true });
    throw err;
  }
}

/** Renames `from` to `to`; across filesystems (a checkpoint directory elsewhere) copies it and removes `from`. */
async function moveFile(from: string, to: string): Promise<CopyKind | undefined> {
  try {
    await rename(from, to);
    return undefined;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EXDEV") throw err;
    const kind = await cowCopy(from, to);
    await rm(from, { force: true });
    return kind;
  }
}

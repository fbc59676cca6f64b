// Hibernation of a Firecracker VM: paused, its snapshot written to temporary files (Full, or Diff onto a copy of the
// memory it was restored from), a built image's disk fingerprinted, the manifest committed, the process ended.
import { constants } from "node:fs";
import { chown, copyFile } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "../../../lib/log.ts";
import { ensureSnapshotSpace, saysNoSpace, snapshotBytesNeeded, SnapshotNoSpace } from "../common/snapshot-space.ts";
import type { RunningVm, SnapshotResult } from "../driver.ts";
import { FirecrackerApiError } from "./api.ts";
import { syncGuest } from "./guest.ts";
import type { FirecrackerHostFacts } from "./host.ts";
import { pausedDisk } from "./image-files.ts";
import type { FirecrackerDriverOptions } from "./options.ts";
import { commitSnapshot, discardGeneration, generationFiles, readManifest, removeStaleSnapshotFiles, type SnapshotImage } from "./snapshot.ts";
import type { FirecrackerProcesses } from "./supervisor.ts";

export interface HibernateDeps {
  opts: Pick<FirecrackerDriverOptions, "diffSnapshots" | "jailer" | "syncTimeoutMs">;
  log: Logger;
  agentPort: number;
  vms: Pick<FirecrackerProcesses, "owned" | "kill">;
  ready(): Promise<FirecrackerHostFacts>;
}

/** VmDriver.hibernate: the snapshot committed and the process ended, or (aborted, failed) the VM running as before. */
export async function hibernate(deps: HibernateDeps, vm: RunningVm, signal?: AbortSignal): Promise<SnapshotResult> {
  const { opts, vms } = deps;
  const started = performance.now();
  const live = vms.owned(vm);
  const cancelled = (): SnapshotResult => ({ completed: false, snapshotMs: performance.now() - started, bytes: 0 });
  if (signal?.aborted) return cancelled();
  const host = await deps.ready();
  const { api, paths } = live;
  // The memory file is all of guest memory: one that would not fit is refused before the guest is paused.
  const neededBytes = snapshotBytesNeeded(vm.spec.memMiB);
  const freeBefore = await ensureSnapshotSpace(paths.snapDir, neededBytes);
  if (vm.spec.rootImage) {
    // What the agent wrote reaches its disk before the memory that holds it is frozen (a cold boot finds it there).
    await syncGuest(live, deps);
    if (signal?.aborted) return cancelled();
  }
  // Vsock must be idle during a snapshot; the guest agent is reconnected after the restore.
  live.agent?.close();
  live.agent = undefined;
  await api.pause();
  if (signal?.aborted) {
    await api.resume();
    return cancelled();
  }
  await removeStaleSnapshotFiles(paths.snapDir);
  const { manifest: previous } = await readManifest(paths.snapDir);
  const generation = (previous?.generation ?? 0) + 1;
  const files = generationFiles(paths.snapDir, generation);
  let type: "Full" | "Diff" = "Full";
  if (opts.diffSnapshots && previous && live.diffBase === previous.generation) {
    // A diff writes only dirtied pages: it goes onto a copy of the memory this process was restored from.
    await copyFile(join(paths.snapDir, previous.mem.file), files.memTmp, constants.COPYFILE_FICLONE);
    if (opts.jailer) await chown(files.memTmp, opts.jailer.uid, opts.jailer.gid);
    type = "Diff";
  }
  try {
    await api.createSnapshot({ snapshot_type: type, snapshot_path: paths.vm(files.stateTmp), mem_file_path: paths.vm(files.memTmp) });
  } catch (err) {
    live.diffBase = undefined; // the dirty bitmap may have been reset: the next snapshot must be Full
    await discardGeneration(paths.snapDir, generation);
    await api.resume().catch((resumeErr: unknown) => {
      // Never left paused for the host to believe it runs: ended, and reported as a crash through onExit.
      deps.log.error("could not resume the VM after a failed snapshot; killing it", { vmId: vm.spec.vmId, err: resumeErr });
      live.proc.signal("SIGKILL");
    });
    const why = err instanceof FirecrackerApiError ? err.faultMessage : (err as Error).message;
    if (saysNoSpace(why)) throw new SnapshotNoSpace({ dir: paths.snapDir, neededBytes, freeBytes: freeBefore ?? 0, said: why }, { cause: err });
    throw err;
  }
  if (signal?.aborted) {
    // A request arrived while the snapshot was written: resuming is cheaper for it than a restore.
    live.diffBase = undefined;
    await discardGeneration(paths.snapDir, generation);
    await api.resume();
    return cancelled();
  }
  let image: SnapshotImage | undefined;
  if (vm.spec.rootImage) {
    try {
      image = { digest: vm.spec.rootImage.digest, drives: live.drives ?? [], disk: await pausedDisk(vm.spec) };
    } catch (err) {
      // The disk cannot be synced or read: no snapshot pairs with it; the VM goes on running.
      live.diffBase = undefined;
      await discardGeneration(paths.snapDir, generation);
      await api.resume().catch(() => live.proc.signal("SIGKILL"));
      throw err;
    }
  }
  const manifest = await commitSnapshot({
    dir: paths.snapDir,
    generation,
    type,
    host,
    vcpus: vm.spec.vcpus,
    memMiB: vm.spec.memMiB,
    tap: live.net.tap,
    guestIp: live.net.guestIp,
    vsock: paths.vm(paths.vsock),
    ...(image ? { image } : {}),
  });
  await vms.kill(live);
  await removeStaleSnapshotFiles(paths.snapDir);
  const bytes = manifest.state.bytes + manifest.mem.bytes;
  deps.log.info("firecracker vm hibernated", { vmId: vm.spec.vmId, generation, type, bytes, snapshotMs: Math.round(performance.now() - started) });
  return { completed: true, snapshotMs: performance.now() - started, bytes };
}

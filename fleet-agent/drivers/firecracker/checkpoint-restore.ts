// Restoring a checkpoint into a Firecracker VM's stateDir (checkpoint.ts): its files become the VM's snapshot, which the
// next wake loads and gives a fresh identity. Restoring an agent to its own checkpoint and forking one are both this.
import { randomBytes } from "node:crypto";
import { chown, mkdir, rename, rm, stat } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import { AppError } from "../../../lib/errors.ts";
import type { Logger } from "../../../lib/log.ts";
import { agentDiskPath, beginDiskGeneration, diskFingerprint } from "../common/agent-disk.ts";
import { cowCopy } from "../common/cow-copy.ts";
import { killLeftover } from "../common/proc.ts";
import { fsyncPath } from "../common/snapshot-files.ts";
import { MANIFEST_FILE } from "../common/state-dir.ts";
import type { VmSpec } from "../driver.ts";
import { checkpointFiles, checkpointMismatch, readCheckpoint } from "./checkpoint.ts";
import type { FirecrackerHostFacts } from "./host.ts";
import { preferNet } from "./net.ts";
import type { FirecrackerDriverOptions } from "./options.ts";
import { commitSnapshot, generationFiles, removeStaleSnapshotFiles, verifyFiles, type SnapshotImage } from "./snapshot.ts";
import type { FirecrackerProcesses } from "./supervisor.ts";

export interface RestoreCheckpointDeps {
  opts: Pick<FirecrackerDriverOptions, "jailer" | "restoreCheckpointStep">;
  log: Logger;
  vms: Pick<FirecrackerProcesses, "paths" | "has">;
  ready(): Promise<FirecrackerHostFacts>;
}

/**
 * Makes the stateDir a hibernated VM whose snapshot is the checkpoint (checkpoint.ts): the old manifest is removed
 * first (from then on a crash leaves no snapshot: the next wake boots cold, over the disk as it is), the files are
 * copied in under temporary names (reflinks where they can be), a built image's disk replaced by the checkpoint's
 * (a new generation), and the manifest that names them and says `clonedFrom` is the commit point. A new agent (a
 * fork) asks for the checkpoint's network slot: its guest's address is in the memory (net.ts `preferNet`).
 */
export async function restoreCheckpoint(deps: RestoreCheckpointDeps, spec: VmSpec, dir: string): Promise<void> {
  const { opts } = deps;
  if (deps.vms.has(spec.vmId)) throw new Error(`VM ${spec.vmId} is running: stop it before restoring a checkpoint into it`);
  const host = await deps.ready();
  const name = basename(dir);
  const { manifest: c, problem } = await readCheckpoint(dir);
  if (!c) throw new AppError("conflict", `checkpoint ${name} cannot be used: ${problem ?? "no manifest"}`);
  const from = checkpointFiles(dir);
  const diskBytes = c.disk
    ? await stat(from.disk).then(
        (st) => st.size,
        () => -1,
      )
    : 0;
  const bad =
    checkpointMismatch(c, host, spec) ??
    (await verifyFiles(dir, c, { checksums: true })) ??
    (c.disk && diskBytes !== c.disk.bytes ? `its disk has ${diskBytes < 0 ? "gone" : `${diskBytes} bytes, the manifest says ${c.disk.bytes}`}` : undefined);
  if (bad) throw new AppError("conflict", `checkpoint ${name} does not fit agent ${spec.agentId}: ${bad}`);
  const step = async (what: string) => opts.restoreCheckpointStep?.(what);
  const paths = deps.vms.paths(spec);
  await killLeftover(paths.pidFile);
  await mkdir(paths.snapDir, { recursive: true });
  await rm(join(paths.snapDir, MANIFEST_FILE), { force: true });
  await fsyncPath(paths.snapDir);
  await step("manifest removed");
  await removeStaleSnapshotFiles(paths.snapDir); // no manifest: every earlier generation goes
  const generation = 1;
  const f = generationFiles(paths.snapDir, generation);
  const owned = async (path: string) => opts.jailer && (await chown(path, opts.jailer.uid, opts.jailer.gid));
  await cowCopy(from.state, f.stateTmp);
  await owned(f.stateTmp);
  await step("state copied");
  await cowCopy(from.mem, f.memTmp);
  await owned(f.memTmp);
  await step("memory copied");
  let image: SnapshotImage | undefined;
  if (c.disk) {
    const disk = agentDiskPath(resolve(spec.stateDir));
    const tmp = `${disk}.tmp-${randomBytes(4).toString("hex")}`;
    await cowCopy(from.disk, tmp);
    await rename(tmp, disk);
    await fsyncPath(dirname(disk));
    await step("disk copied");
    await beginDiskGeneration(disk);
    image = { digest: c.disk.digest, drives: c.disk.drives, disk: await diskFingerprint(disk) };
  }
  await preferNet(spec.stateDir, c.net);
  await step("network slot recorded");
  await commitSnapshot({
    dir: paths.snapDir,
    generation,
    type: "Full",
    host,
    vcpus: c.vcpus,
    memMiB: c.memMiB,
    tap: c.net.tap,
    guestIp: c.net.guestIp,
    vsock: c.vsock,
    clonedFrom: name,
    known: { state: c.state, mem: c.mem },
    ...(image ? { image } : {}),
  });
  await step("committed");
  deps.log.info("checkpoint restored into a VM", { vmId: spec.vmId, checkpoint: name });
}

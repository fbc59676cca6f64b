// Checkpoints on the qemu driver (their files and manifest: checkpoint.ts): one taken from a running VM (paused while
// its state is written and its files copied) or a hibernated one (from its snapshot), and a stateDir made a
// hibernated VM whose snapshot is a checkpoint: restoring an agent to one, forking one, cloning a template.
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync } from "node:fs";
import { mkdir, rename, rm, stat } from "node:fs/promises";
import { basename, join } from "node:path";
import { AppError } from "../../../lib/errors.ts";
import type { Logger } from "../../../lib/log.ts";
import { beginDiskGeneration, diskFingerprint } from "../common/agent-disk.ts";
import { cowCopy, type CopyKind } from "../common/cow-copy.ts";
import { commitManifest, fsyncPath, publishDirectory, sha256File } from "../common/snapshot-files.ts";
import type { CheckpointInfo, RunningVm, VmSpec } from "../driver.ts";
import { machineArgs, ramIdOf, snapshotAttempt, vmPaths, type MemoryMode } from "./args.ts";
import { CHECKPOINT_VERSION, checkpointFiles, checkpointMismatch, portableHardware, readCheckpoint, type CheckpointManifest } from "./checkpoint.ts";
import { copyTemplateRam, migrateSplitting, migrateToFile, resumeAfterSnapshot } from "./migration.ts";
import { beginRamGeneration, ramFingerprint, syncRamFile } from "./ram-file.ts";
import { snapshotStale } from "./restore.ts";
import { MANIFEST_VERSION, readManifest, removeUnreferencedSnapshots, snapshotMemory, type SnapshotManifest } from "./snapshot.ts";
import type { QemuSupervisor } from "./supervisor.ts";
import { syncGuest, type QemuHost } from "./vm.ts";

export interface CheckpointDeps {
  host: QemuHost;
  log: Logger;
  sup: Pick<QemuSupervisor, "settled" | "mustBeRunning" | "running" | "discardWaiting">;
  /** QemuDriverOptions.syncTimeoutMs: how long the guest's flush before a checkpoint may take. */
  syncTimeoutMs: number | undefined;
}

/**
 * An immutable copy of the VM (checkpoint.ts): a running one is stopped while its state is written and its RAM file
 * and disk are copied (reflinks where the filesystem has them: then the pause is the migration's few ms), then runs
 * on with its clock fixed; a hibernated one is copied from its snapshot, which must still pair with its files.
 */
export async function takeCheckpoint(d: CheckpointDeps, spec: VmSpec, vm: RunningVm | undefined, dir: string): Promise<CheckpointInfo> {
  const started = performance.now();
  await d.sup.settled(spec.vmId);
  if (existsSync(dir)) throw new Error(`checkpoint directory ${dir} exists`);
  const tmp = `${dir}.tmp-${randomBytes(4).toString("hex")}`;
  const out = checkpointFiles(tmp);
  await mkdir(tmp, { recursive: true });
  try {
    const paths = vmPaths(spec.stateDir);
    const copies: CopyKind[] = [];
    let pausedMs = 0;
    let machine: string[];
    let sha: { sha256: string; bytes: number };
    // Where the checkpoint keeps RAM: as the running VM holds it, or as the sleeping VM's snapshot does.
    let memory: MemoryMode;
    if (vm) {
      const vp = d.sup.mustBeRunning(vm);
      memory = vp.memory;
      if (spec.rootImage) await syncGuest(vp, d.log, d.syncTimeoutMs);
      const cloneRam = vp.templateRam ? await copyTemplateRam(vp, out.ram) : undefined;
      if (cloneRam) copies.push(cloneRam.copy);
      const pausedAt = performance.now();
      await vp.qmp!.execute("stop");
      try {
        if (cloneRam) await migrateSplitting(vp, out.state, out.ram, d.log);
        else await migrateToFile(vp, { data: out.state, done: `${out.state}.done` });
        if (memory === "file" && !vp.templateRam) {
          await syncRamFile(paths);
          copies.push(await cowCopy(paths.ram, out.ram));
        }
        // The migration's end flushed the drives: the disk is what this state pairs with until the guest runs.
        if (spec.rootImage) copies.push(await cowCopy(paths.disk, out.disk));
      } finally {
        // `cont` after a completed migration takes the drives back; a failure here ends the VM as a crash.
        await resumeAfterSnapshot(vp, false, d.log);
        pausedMs = performance.now() - pausedAt;
      }
      await rm(`${out.state}.done`, { force: true });
      sha = await sha256File(out.state);
      await fsyncPath(out.state);
      machine = vp.machineArgs;
    } else {
      if (d.sup.running.has(spec.vmId)) throw new Error(`VM ${spec.vmId} is running: checkpoint it with its RunningVm`);
      const { manifest, problem } = await readManifest(paths.manifest);
      const why = manifest ? await snapshotStale(d.host, spec, paths, manifest) : (problem ?? "it has no snapshot");
      if (why || !manifest) throw new AppError("conflict", `agent ${spec.agentId} has no state to checkpoint: ${why}`);
      memory = snapshotMemory(manifest);
      copies.push(await cowCopy(join(spec.stateDir, manifest.file), out.state));
      // A clone not yet run holds its RAM in the template's file: the checkpoint gets a copy of its own.
      if (memory === "file") copies.push(await cowCopy(manifest.templateRam?.path ?? paths.ram, out.ram));
      if (spec.rootImage) copies.push(await cowCopy(paths.disk, out.disk));
      sha = { sha256: manifest.sha256, bytes: manifest.bytes };
      machine = manifest.machineArgs;
    }
    const files = [out.state, ...(memory === "file" ? [out.ram] : []), ...(spec.rootImage ? [out.disk] : [])];
    const totalBytes = (await Promise.all(files.map((f) => stat(f).then((st) => st.size)))).reduce((a, b) => a + b, 0);
    const copy: CopyKind = copies.includes("copy") ? "copy" : "reflink";
    const manifest: CheckpointManifest = {
      version: CHECKPOINT_VERSION,
      memory,
      image: spec.image,
      sha256: sha.sha256,
      bytes: sha.bytes,
      totalBytes,
      qemuVersion: d.host.qemuVersion,
      accel: d.host.accel,
      hostCpu: d.host.hostCpu,
      memMiB: spec.memMiB,
      vcpus: spec.vcpus,
      hardware: portableHardware(machine, paths, spec.stateDir),
      disk: spec.rootImage !== undefined,
      copy,
      createdAt: new Date().toISOString(),
      sourceVmId: spec.vmId,
      sourceAgentId: spec.agentId,
    };
    await publishDirectory(tmp, out.manifest, manifest, dir);
    const ms = performance.now() - started;
    d.log.info("checkpoint taken", { vmId: spec.vmId, dir, bytes: totalBytes, copy, pausedMs: Math.round(pausedMs * 10) / 10, ms: Math.round(ms) });
    return { bytes: totalBytes, pausedMs, ms, copy };
  } catch (err) {
    await rm(tmp, { recursive: true, force: true });
    throw err;
  }
}

/**
 * restoreCheckpoint's work. `shareRam` (a template's clone): the RAM file is not copied; the snapshot names the
 * checkpoint's, which the wake maps privately (ram-file.ts `ramPlan`).
 */
export async function materialize(d: CheckpointDeps, spec: VmSpec, dir: string, opts: { shareRam: boolean }): Promise<void> {
  if (d.sup.running.has(spec.vmId)) throw new Error(`VM ${spec.vmId} is running: stop it before restoring a checkpoint into it`);
  await d.sup.settled(spec.vmId);
  await d.sup.discardWaiting(spec.vmId);
  const { manifest: c, problem } = await readCheckpoint(dir);
  if (!c) throw new AppError("conflict", `checkpoint ${basename(dir)} cannot be used: ${problem ?? "no manifest"}`);
  mkdirSync(spec.stateDir, { recursive: true });
  const paths = vmPaths(spec.stateDir);
  // The snapshot keeps RAM as the checkpoint does; its wake converts it to the host's mode (ram-file.ts `ramPlan`).
  const args = machineArgs({ spec, paths, accel: d.host.accel, hostPort: 0, memory: c.memory, ramId: ramIdOf(c.hardware), egressRelay: d.host.egressRelay });
  const target = {
    qemuVersion: d.host.qemuVersion,
    accel: d.host.accel,
    hostCpu: d.host.hostCpu,
    memMiB: spec.memMiB,
    vcpus: spec.vcpus,
    machineArgs: args,
    image: spec.image,
  };
  const bad = checkpointMismatch(c, target, portableHardware(args, paths, spec.stateDir));
  if (bad) throw new AppError("conflict", `checkpoint ${basename(dir)} does not fit agent ${spec.agentId}: ${bad}`);
  const from = checkpointFiles(dir);
  await rm(paths.manifest, { force: true });
  await fsyncPath(spec.stateDir);
  const file = `snapshot-${Date.now()}.bin`;
  const stateTmp = snapshotAttempt(spec.stateDir, `restore-${randomBytes(4).toString("hex")}`).data;
  await cowCopy(from.state, stateTmp);
  await rename(stateTmp, join(spec.stateDir, file));
  const shared = opts.shareRam && c.memory === "file" ? await ramFingerprint({ ram: from.ram, ramGeneration: `${from.ram}.gen` }) : undefined;
  if (c.memory === "file" && !shared) {
    const tmp = `${paths.ram}.tmp-${randomBytes(4).toString("hex")}`;
    await cowCopy(from.ram, tmp);
    await rename(tmp, paths.ram);
    await beginRamGeneration(paths);
  }
  if (c.disk) {
    const tmp = `${paths.disk}.tmp-${randomBytes(4).toString("hex")}`;
    await cowCopy(from.disk, tmp);
    await rename(tmp, paths.disk);
    await beginDiskGeneration(paths.disk);
  }
  const disk = c.disk ? await diskFingerprint(paths.disk) : undefined;
  const ram = c.memory === "file" && !shared ? await ramFingerprint(paths) : undefined;
  const manifest: SnapshotManifest = {
    version: MANIFEST_VERSION,
    file,
    sha256: c.sha256,
    bytes: c.bytes,
    qemuVersion: c.qemuVersion,
    accel: c.accel,
    hostCpu: c.hostCpu,
    machineArgs: args,
    memMiB: c.memMiB,
    vcpus: c.vcpus,
    createdAt: new Date().toISOString(),
    snapshotMs: 0,
    ...(disk ? { disk } : {}),
    ...(ram ? { ram } : {}),
    ...(shared ? { templateRam: { path: from.ram, ...shared } } : {}),
    clonedFrom: basename(dir),
  };
  await commitManifest(paths.manifest, manifest);
  await removeUnreferencedSnapshots(spec.stateDir, file);
  d.log.info("checkpoint restored into a VM", { vmId: spec.vmId, checkpoint: basename(dir) });
}

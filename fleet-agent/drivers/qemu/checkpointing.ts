// Checkpoints on the qemu driver (their files and manifest: checkpoint.ts): one taken from a running VM (paused while
// its state is written and its files copied) or a hibernated one (from its snapshot), and a stateDir made a
// hibernated VM whose snapshot is a checkpoint: restoring an agent to one, forking one, cloning a template.
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync } from "node:fs";
import { link, mkdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { basename, join } from "node:path";
import { AppError } from "../../../lib/errors.ts";
import type { Logger } from "../../../lib/log.ts";
import { beginDiskGeneration, diskFingerprint } from "../common/agent-disk.ts";
import { cowCopy, type CopyKind } from "../common/cow-copy.ts";
import { commitManifest, fsyncPath, publishDirectory, sha256File } from "../common/snapshot-files.ts";
import type { CheckpointInfo, RunningVm, VmSpec } from "../driver.ts";
import { CHECKPOINT_RAM_FILE, machineArgs, ramIdOf, snapshotAttempt, vmPaths, type MemoryMode } from "./args.ts";
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
 * How a file-backed checkpoint's RAM reaches the VM: `template` (a template's clone) names the template's file in place;
 * `link` (a restore or a fork) names a hard link to the checkpoint's file in the stateDir (CHECKPOINT_RAM_FILE), which
 * outlives the checkpoint's deletion; either way the wake maps it privately (ram-plan.ts) and nothing is copied until
 * the VM's first hibernation writes a RAM file of its own. `copy`: the VM gets a copy now.
 */
export type RamSharing = "template" | "link" | "copy";

/**
 * restoreCheckpoint's work. Unless `shareRam` is `copy`, the RAM file is not copied: the snapshot names the
 * checkpoint's (or a link to it), which the wake maps privately (ram-plan.ts).
 */
export async function materialize(d: CheckpointDeps, spec: VmSpec, dir: string, opts: { shareRam: RamSharing }): Promise<SnapshotManifest> {
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
  const sharedPath = c.memory === "file" ? await sharedRamPath(opts.shareRam, from.ram, spec.stateDir) : undefined;
  const shared = sharedPath ? await ramFingerprint({ ram: sharedPath, ramGeneration: `${sharedPath}.gen` }) : undefined;
  // The VM's own RAM file of before pairs with no snapshot any more (the manifest is gone): not kept while unused.
  if (sharedPath) await Promise.all([rm(paths.ram, { force: true }), rm(paths.ramGeneration, { force: true })]);
  else await rm(join(spec.stateDir, CHECKPOINT_RAM_FILE), { force: true });
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
    ...(shared && sharedPath ? { templateRam: { path: sharedPath, ...shared } } : {}),
    clonedFrom: basename(dir),
  };
  await commitManifest(paths.manifest, manifest);
  await removeUnreferencedSnapshots(spec.stateDir, file);
  d.log.info("checkpoint restored into a VM", { vmId: spec.vmId, checkpoint: basename(dir) });
  return manifest;
}

/**
 * Where the VM maps a checkpoint's RAM from without a copy (`RamSharing`); undefined: it gets a copy of its own (asked
 * for, or the link is impossible: the checkpoint on another filesystem).
 */
async function sharedRamPath(how: RamSharing, checkpointRam: string, stateDir: string): Promise<string | undefined> {
  if (how === "template") return checkpointRam;
  if (how === "copy") return undefined;
  const path = join(stateDir, CHECKPOINT_RAM_FILE);
  const tmp = `${path}.tmp-${randomBytes(4).toString("hex")}`;
  try {
    await link(checkpointRam, tmp);
  } catch (err) {
    if (["EXDEV", "EPERM", "EMLINK", "ENOTSUP", "EOPNOTSUPP"].includes((err as NodeJS.ErrnoException).code ?? "")) return undefined;
    throw err;
  }
  // The generation beside it, as the fingerprint reads it (a checkpoint's file has none: a restored one keeps none).
  await rm(`${path}.gen`, { force: true });
  const gen = await readFile(`${checkpointRam}.gen`).catch(() => undefined);
  if (gen !== undefined) await writeFile(`${path}.gen`, gen);
  await rename(tmp, path);
  await fsyncPath(stateDir);
  return path;
}

// A hibernation on the qemu driver: the guest flushed and stopped, its state migrated to a file (streamed RAM, a
// file-backed VM's device state over a socket, a clone's RAM split out of the template's), the manifest committed;
// then its QEMU ends or is kept paused (supervisor.ts), and a file-backed RAM file's pages are written back after the
// answer (`ramPending` until they are durable), after which its zero ranges become holes again (ram-space.ts).
import { randomBytes } from "node:crypto";
import { rename, rm, stat } from "node:fs/promises";
import { basename, join } from "node:path";
import type { Logger } from "../../../lib/log.ts";
import { diskFingerprint } from "../common/agent-disk.ts";
import { commitManifest, fsyncPath, sha256File } from "../common/snapshot-files.ts";
import { ensureSnapshotSpace, freeBytes, saysNoSpace, SNAPSHOT_MARGIN_BYTES, snapshotBytesNeeded, SnapshotNoSpace } from "../common/snapshot-space.ts";
import { withTail } from "../common/vm-process.ts";
import type { RunningVm, SnapshotResult, VmSpec } from "../driver.ts";
import { CHECKPOINT_RAM_FILE, RAM_ID, snapshotAttempt, type MemoryMode, type VmPaths } from "./args.ts";
import { copyTemplateRam, migrateSplitting, migrateToFile, resumeAfterSnapshot, setIgnoreShared, socketMigration } from "./migration.ts";
import type { QemuDriverOptions } from "./options.ts";
import { Phases } from "./phases.ts";
import { beginRamGeneration, markRamDurable, ramFingerprint, syncRamFile } from "./ram-file.ts";
import { ramPlan } from "./ram-plan.ts";
import { MANIFEST_VERSION, readManifest, removeUnreferencedSnapshots, type SnapshotManifest } from "./snapshot.ts";
import type { RamSpace } from "./ram-space.ts";
import type { QemuSupervisor } from "./supervisor.ts";
import { syncGuest, type QemuHost, type QemuVm } from "./vm.ts";

export interface HibernateDeps {
  host: QemuHost;
  log: Logger;
  sup: Pick<QemuSupervisor, "mustBeRunning" | "running" | "waiting" | "settle">;
  opts: Pick<QemuDriverOptions, "snapshotBytesNeeded" | "syncTimeoutMs" | "prestart">;
  /** Where a committed snapshot's RAM file is made sparse again, once its pages are durable (ram-space.ts). */
  space: Pick<RamSpace, "dig" | "ticket">;
}

/** Hibernations of the driver's VMs, and the RAM write-backs they leave running after their answer. */
export class QemuHibernation {
  /** A committed snapshot's RAM pages still being written back, by vmId (`trackRamSync`). */
  private readonly ramSyncs = new Map<string, Promise<void>>();
  private readonly d: HibernateDeps;

  constructor(deps: HibernateDeps) {
    this.d = deps;
  }

  /** The VM's RAM write-back still running, if any (a destroy waits for it). */
  async ramWriteBack(vmId: string): Promise<void> {
    await this.ramSyncs.get(vmId);
  }

  /** Every RAM write-back still running (host shutdown waits for them: RAM files become durable before the host goes). */
  allRamWriteBacks(): Promise<void>[] {
    return [...this.ramSyncs.values()];
  }

  async hibernate(vm: RunningVm, signal?: AbortSignal): Promise<SnapshotResult> {
    const started = performance.now();
    const phases = new Phases(started);
    const vp = this.d.sup.mustBeRunning(vm);
    const qmp = vp.qmp!;
    const { paths, spec } = vp;
    const notDone = (): SnapshotResult => ({ completed: false, snapshotMs: performance.now() - started, bytes: 0 });
    if (signal?.aborted) return notDone();
    // The previous hibernation's RAM write-back (long done unless the VM woke at once): one at a time per VM.
    await this.ramSyncs.get(spec.vmId);
    // What the snapshot keeps RAM in: the host's mode, so a VM woken from a snapshot of the other mode converts here
    // (ram-file.ts `ramPlan`); except a RAM backend of an older id, which only a file-backed QEMU of that id loads.
    const out: MemoryMode = vp.memory === "file" && (this.d.host.memory === "file" || vp.ramId !== RAM_ID) ? "file" : "stream";
    const ownRam = out === "file" && !vp.templateRam;
    // A snapshot that would not fit is refused before the guest is paused; the previous one stays as it is. Into the
    // VM's own RAM file, whose blocks are reserved already, it is the device state: the margin is room enough.
    const neededBytes = this.d.opts.snapshotBytesNeeded?.(spec) ?? (ownRam ? SNAPSHOT_MARGIN_BYTES : snapshotBytesNeeded(spec.memMiB));
    const freeBefore = await ensureSnapshotSpace(spec.stateDir, neededBytes);
    phases.mark("space");
    if (spec.rootImage) {
      await syncGuest(vp, this.d.log, this.d.opts.syncTimeoutMs);
      phases.mark("guestSync");
      if (signal?.aborted) return notDone();
    }
    const attemptId = `${Date.now()}-${randomBytes(4).toString("hex")}`;
    const outputMark = vp.proc.outputMark();

    let manifest: SnapshotManifest;
    // The data file once it has its final name (removed if the snapshot then fails: no manifest names it).
    let dataPath: string | undefined;
    // A template's clone gets a RAM file of its own: a copy of the template's (made before the pause: it never
    // changes), into which the migration's pages that differ from it are written (ram-stream.ts).
    const cloneRam = vp.templateRam && out === "file" ? await copyTemplateRam(vp) : undefined;
    // File-backed RAM into a streamed snapshot: the shared file's pages go into the data file for this migration.
    const streamShared = vp.memory === "file" && out === "stream";
    if (streamShared) await setIgnoreShared(vp, false);
    // The VM's own RAM file: the device state goes over a socket straight into its final file (named per attempt, so
    // no earlier attempt's file is in the way), both prepared while the guest still runs. Otherwise QEMU's writer
    // fills an attempt file, renamed once complete.
    const attempt = ownRam ? { data: join(spec.stateDir, `snapshot-${attemptId}.bin`), done: "" } : snapshotAttempt(spec.stateDir, attemptId);
    const toSocket = ownRam ? await socketMigration(vp, attempt.data) : undefined; // closes what it opened if it fails
    if (toSocket) dataPath = attempt.data;
    phases.mark("prepare");
    try {
      await qmp.execute("stop");
    } catch (err) {
      await toSocket?.close();
      if (dataPath) await rm(dataPath, { force: true });
      throw err;
    }
    phases.mark("stop");
    // File-backed RAM: the stopped guest dirties nothing more, so its pages are written back while the device state is
    // written; the manifest does not wait for them (ram-file.ts: `ramPending`, and what a power loss then costs).
    const ramSyncStart = performance.now();
    let ramSyncMs: number | undefined;
    let ramSyncError: Error | undefined;
    const ramSynced = ownRam ? syncRamFile(paths) : undefined;
    ramSynced?.then(
      () => void (ramSyncMs = performance.now() - ramSyncStart),
      (err: Error) => void (ramSyncError = err),
    );
    try {
      let sha256: string;
      let bytes: number;
      let stateDurable: Promise<void> | undefined;
      if (toSocket) {
        ({ sha256, bytes, durable: stateDurable } = await toSocket.run(signal, phases));
      } else if (cloneRam) {
        ({ sha256, bytes } = await migrateSplitting(vp, attempt.data, cloneRam.file, this.d.log, signal));
        await rename(cloneRam.file, paths.ram);
        await beginRamGeneration(paths);
      } else {
        await migrateToFile(vp, attempt, signal, phases);
        [{ sha256, bytes }] = await Promise.all([sha256File(attempt.data, signal), fsyncPath(attempt.data)]);
        phases.mark("stateChecksumSync");
      }
      signal?.throwIfAborted();
      // The migration's end flushed the drives and stopped QEMU writing them: the disk is now what this memory pairs with.
      const disk = spec.rootImage ? await diskFingerprint(paths.disk) : undefined;
      if (disk) phases.mark("diskFingerprint");
      // The RAM file as this device state pairs with it: the stopped guest writes it no more (its mtime stays), so it
      // is fingerprinted now, while its pages may still be on their way to the disk.
      if (ramSyncError) throw ramSyncError;
      const ram = out === "file" ? await ramFingerprint(paths) : undefined;
      if (out === "file" && !ram) throw new Error("RAM file vanished during the snapshot");
      const createdAt = new Date();
      let file: string;
      if (toSocket) file = basename(attempt.data);
      else {
        file = `snapshot-${createdAt.getTime()}.bin`;
        dataPath = join(spec.stateDir, file);
        await rename(attempt.data, dataPath);
        await rm(attempt.done, { force: true });
        phases.mark("rename");
      }
      const ramPending = ramSynced && ramSyncMs === undefined ? { bootId: this.d.host.bootId } : undefined;
      manifest = {
        version: MANIFEST_VERSION,
        file,
        sha256,
        bytes,
        qemuVersion: this.d.host.qemuVersion,
        accel: this.d.host.accel,
        hostCpu: this.d.host.hostCpu,
        machineArgs: vp.machineArgs,
        memMiB: spec.memMiB,
        vcpus: spec.vcpus,
        createdAt: createdAt.toISOString(),
        snapshotMs: Math.round(performance.now() - started),
        ...(disk ? { disk } : {}),
        ...(ram ? { ram } : {}),
        ...(ramPending ? { ramPending } : {}),
      };
      signal?.throwIfAborted();
      // The point of no return: from here the new snapshot is the VM. The state's fsync runs beside the manifest's.
      await commitManifest(paths.manifest, manifest, stateDurable);
      phases.mark("manifest");
      await toSocket?.close();
    } catch (err) {
      await toSocket?.close();
      await ramSynced?.catch(() => undefined);
      if (cloneRam) await rm(cloneRam.file, { force: true });
      const aborted = signal?.aborted === true;
      // Measured before the partial file is removed: how far the write got, and what QEMU and its writer said.
      const failure = aborted ? undefined : await this.snapshotError(vp, err as Error, { neededBytes, freeBefore, data: attempt.data, outputMark });
      if (dataPath) await rm(dataPath, { force: true }); // renamed but never named by the manifest
      if (streamShared) await setIgnoreShared(vp, true).catch(() => undefined); // the VM runs on file-backed; a checkpoint skips the file again
      await resumeAfterSnapshot(vp, aborted, this.d.log);
      if (!failure) {
        this.d.log.info("hibernate cancelled; VM resumed", { vmId: spec.vmId });
        return notDone();
      }
      this.d.log.error("snapshot failed; VM resumed, previous snapshot kept", {
        vmId: spec.vmId,
        err: failure.message,
        qemuLogError: vp.proc.logWriteError?.message,
      });
      throw failure;
    }
    // The snapshot is committed. The stateDir is final when the hibernation answers (older snapshots removed); the
    // stopped QEMU's exit and the egress listener's end are not on the caller's path: whatever starts a QEMU for this
    // VM, or stops or destroys it, waits for them first (`settled`).
    this.d.sup.running.delete(spec.vmId);
    const committed = manifest;
    await removeUnreferencedSnapshots(spec.stateDir, committed.file);
    // A restored checkpoint's RAM, linked in (checkpointing.ts `materialize`): the VM has a file of its own now.
    if (!committed.templateRam) await Promise.all([CHECKPOINT_RAM_FILE, `${CHECKPOINT_RAM_FILE}.gen`].map((f) => rm(join(spec.stateDir, f), { force: true })));
    // Converted to a streamed snapshot: the RAM file pairs with nothing now (the QEMU that maps it is ending).
    if (streamShared) await Promise.all([paths.ram, paths.ramGeneration, `${paths.ram}.synced`].map((f) => rm(f, { force: true })));
    phases.mark("cleanup");
    // The RAM file made sparse again once durable, unless its QEMU is kept (its wake is a `cont` with no time to reserve
    // the file again: it stays reserved, and is dug when the kept QEMU ends, supervisor.ts `endKept`).
    const digTicket = this.d.space.ticket(spec.vmId);
    if (this.d.opts.prestart === "paused" && ownRam) {
      // This QEMU, stopped, is the snapshot in memory: a wake of the same snapshot only runs it on (`restore`).
      vp.pausedAt = `${committed.file}:${committed.sha256}`;
      vp.digTicket = digTicket; // before it is kept: keeping it may end it at once (over the budget)
      // The run the host watched is over; the next wake's run registers its own listener (one per wake, not all of them).
      vp.proc.dropCrashListeners();
      this.d.sup.waiting.set(spec.vmId, vp);
    } else {
      // The next QEMU of the VM needs its port and sockets, which this one holds until it exits; a wake takes the
      // pre-started one (when configured) once it is waiting.
      const next = ramPlan(this.d.host.memory, committed);
      this.d.sup.settle(spec, vp, next.prestartable ? next : undefined);
    }
    const dig = committed.ram !== undefined && vp.pausedAt === undefined ? digTicket : undefined;
    if (committed.ramPending) this.trackRamSync(spec, paths, committed, ramSynced!, started, dig);
    else if (dig !== undefined) this.d.space.dig(spec.vmId, paths.ram, dig);
    const snapshotMs = performance.now() - started;
    this.d.log.info("hibernated", {
      vmId: spec.vmId,
      bytes: committed.bytes,
      snapshotMs: Math.round(snapshotMs),
      ramPending: committed.ramPending !== undefined,
      ...(ramSyncMs !== undefined ? { ramSyncMs: Math.round(ramSyncMs * 10) / 10 } : {}),
      phases: phases.ms,
    });
    return { completed: true, snapshotMs, bytes: committed.bytes };
  }

  /**
   * The write-back of a committed snapshot's RAM pages, after the hibernation answered: `ram.synced` names the
   * snapshot once they are durable (then the file's holes are dug, with `dig` the ticket for it); if they cannot be made so, the
   * manifest goes (the next wake boots cold).
   */
  private trackRamSync(spec: VmSpec, paths: VmPaths, manifest: SnapshotManifest, synced: Promise<void>, started: number, dig: number | undefined): void {
    const done = (async () => {
      const err = await synced.then(
        () => undefined,
        (e: Error) => e,
      );
      if (!err) {
        await markRamDurable(paths, manifest.file, manifest.ram!.generation);
        this.d.log.info("RAM file durable", { vmId: spec.vmId, file: manifest.file, durableMs: Math.round((performance.now() - started) * 10) / 10 });
        if (dig !== undefined) this.d.space.dig(spec.vmId, paths.ram, dig);
        return;
      }
      const now = await readManifest(paths.manifest);
      if (now.manifest?.file === manifest.file) {
        await rm(paths.manifest, { force: true });
        await fsyncPath(spec.stateDir);
      }
      this.d.log.error("the RAM file of a snapshot could not be made durable: snapshot dropped, the next wake boots cold", { vmId: spec.vmId, err });
    })().catch((err: unknown) => this.d.log.warn("recording the RAM file's durability failed", { vmId: spec.vmId, err }));
    this.ramSyncs.set(spec.vmId, done);
    void done.then(() => {
      if (this.ramSyncs.get(spec.vmId) === done) this.ramSyncs.delete(spec.vmId);
    });
  }

  /**
   * Why a snapshot failed, as the host records it. On a full disk QEMU only says "Unable to write to command: Broken
   * pipe" (its writer, cat, died); cat's own words reach us through the relayed stderr, and statfs shows the disk full:
   * then a SnapshotNoSpace with the bytes needed, free when it began, and written when the disk filled.
   */
  private async snapshotError(
    vp: QemuVm,
    err: Error,
    f: { neededBytes: number; freeBefore: number | undefined; data: string; outputMark: number },
  ): Promise<Error> {
    const said = vp.proc.recentOutput(f.outputMark);
    const written = await stat(f.data).then(
      (s) => s.size,
      () => 0,
    );
    const freeNow = await freeBytes(vp.spec.stateDir);
    if (saysNoSpace(said) || saysNoSpace(err.message) || (written > 0 && freeNow !== undefined && freeNow < 1 << 20)) {
      return new SnapshotNoSpace(
        {
          dir: vp.spec.stateDir,
          neededBytes: Math.max(f.neededBytes, snapshotBytesNeeded(vp.spec.memMiB)),
          freeBytes: f.freeBefore ?? written,
          writtenBytes: written,
          said: [err.message, said].filter(Boolean).join("; qemu: "),
        },
        { cause: err },
      );
    }
    return withTail(err, said, "qemu");
  }
}

// The qemu driver: one QEMU microvm per VM (KVM when usable, TCG otherwise); hibernate = QMP migrate to a file,
// wake = -incoming + cont + clock fix, or a cold boot when the snapshot cannot be used (common/restore-or-boot.ts).
// A built image's VM (`spec.rootImage`) also has the image, its persistent disk and a launch drive as virtio-blk
// drives; its snapshot records the disk's fingerprint and is restored only over that same disk.
// With `memory: "file"` guest RAM is `<stateDir>/ram` (ram-file.ts): a snapshot is the device state only, bound to
// that RAM file's generation, and a wake consumes it (a crash while awake boots cold).
// Checkpoints (checkpoint.ts) are immutable copies of a VM's state, RAM file and disk; restore and fork both make a
// stateDir's snapshot of one, and the wake then pushes a fresh identity. Templates (common/templates.ts) are checkpoints of a
// freshly booted VM per kind, which `boot` clones.
// Networking is QEMU's user network with `restrict=on` for every VM; one with `allowEgress` reaches out only through
// the host's egress proxy (fleet-agent/egress/), listening for it while its QEMU may run (args.ts `netdevArg`).
import { createHash, randomBytes } from "node:crypto";
import { closeSync, createWriteStream, existsSync, fsyncSync, mkdirSync, openSync, rmSync, statSync } from "node:fs";
import { mkdir, open, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { connect, createServer, type Socket } from "node:net";
import { basename, join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { AppError } from "../../../lib/errors.ts";
import { silentLogger, type Logger } from "../../../lib/log.ts";
import { beginDiskGeneration, DEFAULT_DISK_MIB, diskChange, diskFingerprint, ensureAgentDisk, type DiskFingerprint } from "../common/agent-disk.ts";
import { fixGuestClock, GuestAgentClient } from "../common/guest-agent.ts";
import { makeLaunchDrive } from "../common/launch-data.ts";
import { killLeftover, processAlive } from "../common/proc.ts";
import { freeLoopbackPort, pollUntil, waitForHttp } from "../common/readiness.ts";
import { RestoreFailed, restoreOrBoot, type ClockFix, type Restored } from "../common/restore-or-boot.ts";
import { commitManifest, fsyncPath, publishDirectory, sha256File } from "../common/snapshot-files.ts";
import { ensureSnapshotSpace, freeBytes, saysNoSpace, snapshotBytesNeeded, SnapshotNoSpace } from "../common/snapshot-space.ts";
import { capLog, VmProcess, VmProcesses, withTail } from "../common/vm-process.ts";
import type { BootResult, CheckpointInfo, DriverTemplate, RunningVm, SnapshotResult, VmDriver, VmExit, VmSpec, WakeResult } from "../driver.ts";
import { cowCopy, type CopyKind } from "../common/cow-copy.ts";
import { CHECKPOINT_VERSION, checkpointFiles, checkpointMismatch, portableHardware, readCheckpoint, type CheckpointManifest } from "./checkpoint.ts";
import { machineArgs, opt, qemuArgs, shellQuote, snapshotAttempt, vmPaths, type Accel, type MemoryMode, type VmPaths } from "./args.ts";
import { ensureListenBacklogShim } from "./backlog.ts";
import { detectAccel, hostCpuModel, hostTscKhz, qemuVersion } from "./host.ts";
import { ConsoleWatch, waitImageReady } from "../common/image-boot.ts";
import { defaultEgressConfig } from "../../egress/config.ts";
import { EgressProxy } from "../../egress/proxy.ts";
import { ensureEgressRelay } from "../../egress/relay.ts";
import { ExecStubs } from "../common/exec-stubs.ts";
import { Phases } from "./phases.ts";
import { WaitingPool, type EvictReason } from "./waiting.ts";
import { cacheInSmallPages, smallPagesTool } from "./small-pages.ts";
import { allocatedBytes, punchZeroPages } from "../common/zero-holes.ts";
import { contAfterMigration, QmpClient, type MigrationInfo } from "./qmp.ts";
import { VmTemplates } from "../common/templates.ts";
import { RamFileWriter, RamStreamSplitter } from "./ram-stream.ts";
import { egressProxyUrl } from "../../egress/guest-address.ts";
import { beginRamGeneration, currentBootId, freshRamFile, markRamDurable, ramChange, ramDurability, ramFingerprint, ramPlan, syncRamFile } from "./ram-file.ts";
import { forwardedAddresses, incompatibility, MANIFEST_VERSION, readManifest, removePartialDrives, removePartialSnapshots, removeUnreferencedSnapshots, type SnapshotManifest } from "./snapshot.ts";

export interface GuestImagePaths {
  kernel: string;
  initrd: string;
}

/** The guest image (kernel and initramfs) a built image's VM boots: the demo's, which also runs images (guest/init.sh). */
export const IMAGE_GUEST = "demo";

export interface QemuDriverOptions {
  /** Kernel and initramfs per image name (`demo`; a built image's VM asks for IMAGE_GUEST); a fixed pair serves every VM. */
  image: GuestImagePaths | ((name: string) => Promise<GuestImagePaths>);
  /** `auto` (default) picks KVM when /dev/kvm is usable by a hardware module, else TCG. */
  accel?: Accel | "auto";
  qemuBinary?: string;
  log?: Logger;
  /** Cold boot to a guest that answers HTTP (TCG on a busy 2-core machine needs a while). */
  bootTimeoutMs?: number;
  restoreTimeoutMs?: number;
  /**
   * Keep a QEMU waiting in `-incoming defer` for every hibernated VM so the wake path skips process
   * start-up. Costs one idle QEMU process per hibernated VM.
   * `paused` (file-backed RAM; otherwise as `true`): the hibernated QEMU itself waits, stopped, once its snapshot is
   * committed, and a wake whose snapshot is that one only renews the generations and runs `cont` — no load, and
   * under TCG its translated code stays warm. Costs more than a QEMU in `-incoming defer`: its translation cache
   * (up to TCG_TB_MIB) and QEMU's own memory stay resident; the guest's pages are the RAM file's clean page cache.
   */
  prestart?: boolean | "paused";
  /**
   * How long a kept QEMU (either kind of `prestart`) waits for its VM's wake, in ms after the hibernation; then it is
   * ended and the next wake restores from the files. 0: until the wake. Default 600 000 (10 min).
   */
  prestartKeepMs?: number;
  /** The most QEMUs kept waiting at once (the oldest is ended first). Default 16. */
  prestartMax?: number;
  /**
   * LD_PRELOAD shim that raises QEMU's listen backlog (see backlog.ts): `auto` (default) builds it
   * with gcc on first use, a path uses that file, false runs QEMU without it.
   */
  listenBacklogShim?: "auto" | string | false;
  /**
   * Bytes that must be free in the VM's stateDir before a snapshot is written (checked with statfs; less refuses it
   * with SnapshotNoSpace before the guest is paused). Default: guest memory plus SNAPSHOT_MARGIN_BYTES, the most a
   * snapshot can take; 0 turns the check off (a full disk is then still caught while the snapshot is written).
   */
  snapshotBytesNeeded?: (spec: VmSpec) => number;
  /** How long a hibernation waits for the guest to flush a built image's disk (SYNC) before it snapshots anyway. */
  syncTimeoutMs?: number;
  /**
   * Guest RAM: `stream` (default) streams all of it into each snapshot; `file` maps `<stateDir>/ram` shared, so a
   * hibernation writes the device state and syncs the file, and a wake consumes the snapshot (ram-file.ts).
   */
  memory?: MemoryMode;
  /**
   * The egress proxy agents with `allowEgress` reach out through (default: one with the default rules). The driver
   * listens for a VM on its socket before its QEMU starts and stops when the VM stops, hibernates or is destroyed;
   * the driver closes it with itself.
   */
  egress?: EgressProxy;
  /** The guestfwd relay binary (default: relay.c built with gcc on first use); false: no VM gets egress. */
  egressRelay?: string | false;
  /**
   * Templates (common/templates.ts): new VMs start as clones of a warm checkpoint of their kind, kept under `root`, instead
   * of booting cold. With file-backed memory a clone maps the template's RAM file privately (pages shared with every
   * other clone until written); with streamed memory it gets a copy of the template's state.
   */
  templates?: { root: string };
  /**
   * Start QEMU from waiting exec stubs (common/exec-stubs.ts) instead of forking the fleet-agent on the wake path
   * (default true; without gcc there are none and QEMU is forked as before).
   */
  execStubs?: boolean;
  /** Test seam: runs on a wake after the load and the RAM generation's renewal, just before `cont` (crash tests). */
  beforeCont?: (pid: number | undefined) => Promise<void>;
  /** Test seam: runs on a wake right after `cont`, before the guest's first answer is awaited (a starved guest). */
  afterCont?: (pid: number | undefined) => Promise<void>;
}

/** One QEMU process and the clients the driver holds on it. */
interface QemuVm {
  spec: VmSpec;
  paths: VmPaths;
  hostPort: number;
  machineArgs: string[];
  proc: VmProcess;
  qmp: QmpClient | undefined;
  agent: GuestAgentClient | undefined;
  agentOpen: boolean;
  /** A template's clone: its RAM is the template's file mapped privately; its first snapshot splits it out (ram-stream.ts). */
  templateRam: string | undefined;
  /**
   * The template's RAM file held open while this QEMU runs: its first hibernation copies it and compares pages with
   * it, and the template may have been deleted (or rebuilt) since the clone started.
   */
  templateFd: number | undefined;
  /** Kept stopped after its hibernation (`prestart: "paused"`): `<file>:<sha256>` of the snapshot it holds in memory. */
  pausedAt?: string;
}

/** Snapshots up to this size (device state: tens of KB) are read whole and handed to QEMU over a socket on restore. */
const SOCKET_STATE_MAX_BYTES = 16 << 20;
/** query-migrate's interval when no MIGRATION event comes (events make it rarely matter). */
const MIGRATION_POLL_MS = 20;
const UNLIMITED_BANDWIDTH = 2 ** 40; // bytes/s; QEMU 7.2 caps migration at 128 MiB/s by default
const SYNC_TIMEOUT_MS = 10_000;
/** A stop (host shutdown, delete) waits less for the guest's flush: the disk's journal covers the rest. */
const STOP_SYNC_TIMEOUT_MS = 3000;

/** QemuDriverOptions.prestartKeepMs and prestartMax when not given. */
export const DEFAULT_PRESTART_KEEP_MS = 600_000;
export const DEFAULT_PRESTART_MAX = 16;

export class QemuDriver implements VmDriver {
  readonly name = "qemu" as const;
  readonly isolated = true;
  readonly accel: Accel;
  readonly accelReason: string;
  readonly qemuVersion: string;
  readonly memory: MemoryMode;
  private readonly binary: string;
  private readonly log: Logger;
  private readonly opts: QemuDriverOptions;
  private readonly tscKhz: number | undefined;
  private readonly preload: string | undefined;
  private readonly egress: EgressProxy;
  /** The guestfwd relay; undefined: VMs with `allowEgress` get no way out (logged once). */
  private readonly egressRelay: string | undefined;
  private readonly hostCpu = hostCpuModel();
  private readonly running = new Map<string, QemuVm>();
  /** QEMUs kept for hibernated VMs (pre-started in `-incoming defer`, or stopped after the hibernation), by vmId. */
  private readonly waiting: WaitingPool<QemuVm>;
  private smallPagesMissingSaid = false;
  /** A hibernation's work after its answer, by vmId: QEMU's exit, the egress listener, older files (`settled`). */
  private readonly settling = new Map<string, Promise<void>>();
  /** A committed snapshot's RAM pages still being written back, by vmId (`trackRamSync`). */
  private readonly ramSyncs = new Map<string, Promise<void>>();
  /** The host kernel's boot id: a snapshot whose RAM was not yet durable is trusted only within the boot it was taken in. */
  private readonly bootId = currentBootId();
  private readonly processes = new VmProcesses();
  /** Waiting exec stubs QEMU is started from (QemuDriverOptions.execStubs). */
  private readonly stubs: ExecStubs | undefined;
  /** Warm templates new VMs are cloned from (QemuDriverOptions.templates). */
  readonly templates: VmTemplates | undefined;

  constructor(opts: QemuDriverOptions) {
    this.opts = opts;
    this.waiting = new WaitingPool<QemuVm>({ keepMs: opts.prestartKeepMs ?? DEFAULT_PRESTART_KEEP_MS, max: opts.prestartMax ?? DEFAULT_PRESTART_MAX }, (id, vp, why) => this.endKept(id, vp, why));
    this.binary = opts.qemuBinary ?? "qemu-system-x86_64";
    this.memory = opts.memory ?? "stream";
    this.log = (opts.log ?? silentLogger).child({ driver: "qemu" });
    const choice = opts.accel && opts.accel !== "auto" ? { accel: opts.accel, reason: "configured" } : detectAccel();
    this.accel = choice.accel;
    this.accelReason = choice.reason;
    this.qemuVersion = qemuVersion(this.binary);
    this.tscKhz = hostTscKhz();
    const shim = opts.listenBacklogShim ?? "auto";
    if (shim === "auto") {
      const built = ensureListenBacklogShim();
      if ("path" in built) this.preload = built.path;
      else this.log.warn("QEMU runs without the listen-backlog shim: bursts of connections to a VM will stall", { why: built.error });
    } else if (shim) this.preload = shim;
    this.egress = opts.egress ?? new EgressProxy(defaultEgressConfig, { log: this.log });
    if (opts.egressRelay === undefined) {
      const relay = ensureEgressRelay();
      if ("path" in relay) this.egressRelay = relay.path;
      else this.log.warn("no egress relay: agents that allow egress get none", { why: relay.error });
    } else if (opts.egressRelay) this.egressRelay = opts.egressRelay;
    if (opts.execStubs ?? true) {
      this.stubs = new ExecStubs({ log: this.log });
      this.stubs.fill();
    }
    if (opts.templates) {
      this.templates = new VmTemplates({
        root: opts.templates.root,
        log: this.log.child({ part: "templates" }),
        boot: async (spec) => (await this.bootInternal(spec, performance.now())).vm,
        checkpoint: (spec, vm, dir) => this.checkpoint(spec, vm, dir),
        destroy: (spec) => this.destroy(spec),
        environment: async (spec) => {
          const image = await this.imageFor(spec);
          const [k, i] = await Promise.all([stat(image.kernel), stat(image.initrd)]);
          return JSON.stringify([this.qemuVersion, this.accel, this.hostCpu, this.memory, image.kernel, k.size, k.mtimeMs, image.initrd, i.size, i.mtimeMs]);
        },
      });
    }
    this.log.info("qemu driver ready", { accel: this.accel, why: this.accelReason, qemu: this.qemuVersion, memory: this.memory, tscKhz: this.tscKhz, preload: this.preload });
  }

  /** A clone of the template of its kind when one is ready (its wake gives it its identity), else a cold boot. */
  async boot(spec: VmSpec): Promise<BootResult> {
    const started = performance.now();
    await this.settled(spec.vmId);
    const template = await this.templates?.take(spec).catch((err: unknown) => void this.log.warn("no template", { vmId: spec.vmId, err }));
    if (template) {
      try {
        await this.materialize(spec, template.dir, { shareRam: this.memory === "file" });
        const woke = await this.wake(spec);
        const bootMs = performance.now() - started;
        this.log.info("cloned from a template", { vmId: spec.vmId, template: template.key, mode: woke.mode, fallbackReason: woke.fallbackReason, bootMs: Math.round(bootMs) });
        return { vm: woke.vm, bootMs, ...(woke.mode === "restore" ? { template: template.key } : {}) };
      } catch (err) {
        this.log.warn("clone from a template failed; booting cold", { vmId: spec.vmId, template: template.key, err });
        await this.reap(spec);
      }
    }
    const { vm } = await this.bootInternal(spec, started);
    return { vm, bootMs: performance.now() - started };
  }

  async hibernate(vm: RunningVm, signal?: AbortSignal): Promise<SnapshotResult> {
    const started = performance.now();
    const phases = new Phases(started);
    const vp = this.mustBeRunning(vm);
    const qmp = vp.qmp!;
    const { paths, spec } = vp;
    const notDone = (): SnapshotResult => ({ completed: false, snapshotMs: performance.now() - started, bytes: 0 });
    if (signal?.aborted) return notDone();
    // The previous hibernation's RAM write-back (long done unless the VM woke at once): one at a time per VM.
    await this.ramSyncs.get(spec.vmId);
    // A snapshot that would not fit is refused before the guest is paused; the previous one stays as it is.
    const neededBytes = this.opts.snapshotBytesNeeded?.(spec) ?? snapshotBytesNeeded(spec.memMiB);
    const freeBefore = await ensureSnapshotSpace(spec.stateDir, neededBytes);
    phases.mark("space");
    if (spec.rootImage) {
      await this.syncGuest(vp);
      phases.mark("guestSync");
      if (signal?.aborted) return notDone();
    }
    const attemptId = `${Date.now()}-${randomBytes(4).toString("hex")}`;
    const outputMark = vp.proc.outputMark();
    const ownRam = this.memory === "file" && !vp.templateRam;

    let manifest: SnapshotManifest;
    // The data file once it has its final name (removed if the snapshot then fails: no manifest names it).
    let dataPath: string | undefined;
    // A template's clone gets a RAM file of its own: a copy of the template's (made before the pause: it never
    // changes), into which the migration's pages that differ from it are written (ram-stream.ts).
    const cloneRam = vp.templateRam ? await this.copyTemplateRam(vp) : undefined;
    // The VM's own RAM file: the device state goes over a socket straight into its final file (named per attempt, so
    // no earlier attempt's file is in the way), both prepared while the guest still runs. Otherwise QEMU's writer
    // fills an attempt file, renamed once complete.
    const attempt = ownRam ? { data: join(spec.stateDir, `snapshot-${attemptId}.bin`), done: "" } : snapshotAttempt(spec.stateDir, attemptId);
    const toSocket = ownRam ? await this.socketMigration(vp, attempt.data) : undefined; // closes what it opened if it fails
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
        ({ sha256, bytes } = await this.migrateSplitting(vp, attempt.data, cloneRam.file, signal));
        await rename(cloneRam.file, paths.ram);
        await beginRamGeneration(paths);
      } else {
        await this.migrateToFile(vp, attempt, signal, phases);
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
      const ram = this.memory === "file" ? await ramFingerprint(paths) : undefined;
      if (this.memory === "file" && !ram) throw new Error("RAM file vanished during the snapshot");
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
      const ramPending = ramSynced && ramSyncMs === undefined ? { bootId: this.bootId } : undefined;
      manifest = {
        version: MANIFEST_VERSION,
        file,
        sha256,
        bytes,
        qemuVersion: this.qemuVersion,
        accel: this.accel,
        hostCpu: this.hostCpu,
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
      await this.resumeAfterSnapshot(vp, aborted);
      if (!failure) {
        this.log.info("hibernate cancelled; VM resumed", { vmId: spec.vmId });
        return notDone();
      }
      this.log.error("snapshot failed; VM resumed, previous snapshot kept", { vmId: spec.vmId, err: failure.message, qemuLogError: vp.proc.logWriteError?.message });
      throw failure;
    }
    // The snapshot is committed. The stateDir is final when the hibernation answers (older snapshots removed); the
    // stopped QEMU's exit and the egress listener's end are not on the caller's path: whatever starts a QEMU for this
    // VM, or stops or destroys it, waits for them first (`settled`).
    this.running.delete(spec.vmId);
    const committed = manifest;
    await removeUnreferencedSnapshots(spec.stateDir, committed.file);
    phases.mark("cleanup");
    if (this.opts.prestart === "paused" && ownRam) {
      // This QEMU, stopped, is the snapshot in memory: a wake of the same snapshot only runs it on (`restore`).
      vp.pausedAt = `${committed.file}:${committed.sha256}`;
      // The run the host watched is over; the next wake's run registers its own listener (one per wake, not all of them).
      vp.proc.dropCrashListeners();
      this.waiting.set(spec.vmId, vp);
    } else {
      // The next QEMU of the VM needs its port and sockets, which this one holds until it exits; a wake takes the
      // pre-started one (when configured) once it is waiting.
      this.settle(spec, vp);
    }
    if (committed.ramPending) this.trackRamSync(spec, paths, committed, ramSynced!, started);
    const snapshotMs = performance.now() - started;
    this.log.info("hibernated", { vmId: spec.vmId, bytes: committed.bytes, snapshotMs: Math.round(snapshotMs), ramPending: committed.ramPending !== undefined, ...(ramSyncMs !== undefined ? { ramSyncMs: Math.round(ramSyncMs * 10) / 10 } : {}), phases: phases.ms });
    return { completed: true, snapshotMs, bytes: committed.bytes };
  }

  /** After a committed hibernation: QEMU quits and the egress listener ends, off the caller's path; then the prestart. */
  private settle(spec: VmSpec, vp: QemuVm): void {
    const settling = (async () => {
      await this.quit(vp);
      await this.egress.release(spec.vmId);
    })()
      .catch((err: unknown) => this.log.warn("cleanup after a hibernation failed", { vmId: spec.vmId, err }))
      .then(() => (this.opts.prestart ? this.prestart(spec).catch((err: unknown) => this.log.warn("prestart failed", { vmId: spec.vmId, err })) : undefined));
    this.trackSettling(spec.vmId, settling);
  }

  /** Work on a VM's QEMU that whatever starts a QEMU for the VM next waits for (`settled`), forgotten once done. */
  private trackSettling(vmId: string, work: Promise<void>): void {
    this.settling.set(vmId, work);
    void work.then(() => {
      if (this.settling.get(vmId) === work) this.settling.delete(vmId);
    });
  }

  /**
   * The write-back of a committed snapshot's RAM pages, after the hibernation answered: `ram.synced` names the
   * snapshot once they are durable; if they cannot be made so, the manifest goes (the next wake boots cold).
   */
  private trackRamSync(spec: VmSpec, paths: VmPaths, manifest: SnapshotManifest, synced: Promise<void>, started: number): void {
    const done = (async () => {
      const err = await synced.then(() => undefined, (e: Error) => e);
      if (!err) {
        await markRamDurable(paths, manifest.file, manifest.ram!.generation);
        this.log.info("RAM file durable", { vmId: spec.vmId, file: manifest.file, durableMs: Math.round((performance.now() - started) * 10) / 10 });
        return;
      }
      const now = await readManifest(paths.manifest);
      if (now.manifest?.file === manifest.file) {
        await rm(paths.manifest, { force: true });
        await fsyncPath(spec.stateDir);
      }
      this.log.error("the RAM file of a snapshot could not be made durable: snapshot dropped, the next wake boots cold", { vmId: spec.vmId, err });
    })().catch((err: unknown) => this.log.warn("recording the RAM file's durability failed", { vmId: spec.vmId, err }));
    this.ramSyncs.set(spec.vmId, done);
    void done.then(() => {
      if (this.ramSyncs.get(spec.vmId) === done) this.ramSyncs.delete(spec.vmId);
    });
  }

  /** Waits for a hibernation's background work on this VM (QEMU's exit, cleanup) before anything else uses it. */
  private async settled(vmId: string): Promise<void> {
    await this.settling.get(vmId);
  }

  async wake(spec: VmSpec): Promise<WakeResult> {
    const started = performance.now();
    if (this.running.has(spec.vmId)) throw new Error(`VM ${spec.vmId} is already running`);
    await this.settled(spec.vmId);
    return restoreOrBoot({
      spec,
      log: this.log,
      started,
      restore: (undo) => this.restore(spec, undo, started),
      boot: () => this.bootInternal(spec, started),
    });
  }

  async stop(vm: RunningVm): Promise<void> {
    await this.settled(vm.spec.vmId);
    const vp = this.running.get(vm.spec.vmId);
    if (vp) await this.quitRunning(vp);
    await this.discardWaiting(vm.spec.vmId);
    await this.egress.release(vm.spec.vmId);
  }

  async destroy(spec: VmSpec): Promise<void> {
    await this.settled(spec.vmId);
    await this.ramSyncs.get(spec.vmId);
    const vp = this.running.get(spec.vmId);
    if (vp) await this.quit(vp);
    await this.discardWaiting(spec.vmId);
    await this.egress.release(spec.vmId);
    await this.reap(spec);
    const paths = vmPaths(spec.stateDir);
    if (paths.socketDir !== spec.stateDir) await rm(paths.socketDir, { recursive: true, force: true });
    await rm(spec.stateDir, { recursive: true, force: true });
  }

  /**
   * An immutable copy of the VM (checkpoint.ts): a running one is stopped while its state is written and its RAM file
   * and disk are copied (reflinks where the filesystem has them: then the pause is the migration's few ms), then runs
   * on with its clock fixed; a hibernated one is copied from its snapshot, which must still pair with its files.
   */
  async checkpoint(spec: VmSpec, vm: RunningVm | undefined, dir: string): Promise<CheckpointInfo> {
    const started = performance.now();
    await this.settled(spec.vmId);
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
      if (vm) {
        const vp = this.mustBeRunning(vm);
        if (spec.rootImage) await this.syncGuest(vp);
        const cloneRam = vp.templateRam ? await this.copyTemplateRam(vp, out.ram) : undefined;
        if (cloneRam) copies.push(cloneRam.copy);
        const pausedAt = performance.now();
        await vp.qmp!.execute("stop");
        try {
          if (cloneRam) await this.migrateSplitting(vp, out.state, out.ram);
          else await this.migrateToFile(vp, { data: out.state, done: `${out.state}.done` });
          if (this.memory === "file" && !vp.templateRam) {
            await syncRamFile(paths);
            copies.push(await cowCopy(paths.ram, out.ram));
          }
          // The migration's end flushed the drives: the disk is what this state pairs with until the guest runs.
          if (spec.rootImage) copies.push(await cowCopy(paths.disk, out.disk));
        } finally {
          // `cont` after a completed migration takes the drives back; a failure here ends the VM as a crash.
          await this.resumeAfterSnapshot(vp, false);
          pausedMs = performance.now() - pausedAt;
        }
        await rm(`${out.state}.done`, { force: true });
        sha = await sha256File(out.state);
        await fsyncPath(out.state);
        machine = vp.machineArgs;
      } else {
        if (this.running.has(spec.vmId)) throw new Error(`VM ${spec.vmId} is running: checkpoint it with its RunningVm`);
        const { manifest, problem } = await readManifest(paths.manifest);
        const why = manifest ? await this.snapshotStale(spec, paths, manifest) : (problem ?? "it has no snapshot");
        if (why || !manifest) throw new AppError("conflict", `agent ${spec.agentId} has no state to checkpoint: ${why}`);
        copies.push(await cowCopy(join(spec.stateDir, manifest.file), out.state));
        // A clone not yet run holds its RAM in the template's file: the checkpoint gets a copy of its own.
        if (this.memory === "file") copies.push(await cowCopy(manifest.templateRam?.path ?? paths.ram, out.ram));
        if (spec.rootImage) copies.push(await cowCopy(paths.disk, out.disk));
        sha = { sha256: manifest.sha256, bytes: manifest.bytes };
        machine = manifest.machineArgs;
      }
      const files = [out.state, ...(this.memory === "file" ? [out.ram] : []), ...(spec.rootImage ? [out.disk] : [])];
      const totalBytes = (await Promise.all(files.map((f) => stat(f).then((st) => st.size)))).reduce((a, b) => a + b, 0);
      const copy: CopyKind = copies.includes("copy") ? "copy" : "reflink";
      const manifest: CheckpointManifest = {
        version: CHECKPOINT_VERSION,
        memory: this.memory,
        image: spec.image,
        sha256: sha.sha256,
        bytes: sha.bytes,
        totalBytes,
        qemuVersion: this.qemuVersion,
        accel: this.accel,
        hostCpu: this.hostCpu,
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
      this.log.info("checkpoint taken", { vmId: spec.vmId, dir, bytes: totalBytes, copy, pausedMs: Math.round(pausedMs * 10) / 10, ms: Math.round(ms) });
      return { bytes: totalBytes, pausedMs, ms, copy };
    } catch (err) {
      await rm(tmp, { recursive: true, force: true });
      throw err;
    }
  }

  /**
   * Makes the stateDir a hibernated VM whose snapshot is the checkpoint: its state, RAM file and disk copied in (each
   * under a temporary name, then renamed), new generations for the RAM file and the disk, and a manifest that binds
   * them and says `clonedFrom`, so the wake gives the guest a fresh identity. The old snapshot is gone first: a crash
   * part way leaves no snapshot (a cold boot) rather than one over the wrong files.
   */
  restoreCheckpoint(spec: VmSpec, dir: string): Promise<void> {
    return this.materialize(spec, dir, { shareRam: false });
  }

  /**
   * restoreCheckpoint's work. `shareRam` (a template's clone): the RAM file is not copied; the snapshot names the
   * checkpoint's, which the wake maps privately (ram-file.ts `ramPlan`).
   */
  private async materialize(spec: VmSpec, dir: string, opts: { shareRam: boolean }): Promise<void> {
    if (this.running.has(spec.vmId)) throw new Error(`VM ${spec.vmId} is running: stop it before restoring a checkpoint into it`);
    await this.settled(spec.vmId);
    await this.discardWaiting(spec.vmId);
    const { manifest: c, problem } = await readCheckpoint(dir);
    if (!c) throw new AppError("conflict", `checkpoint ${basename(dir)} cannot be used: ${problem ?? "no manifest"}`);
    mkdirSync(spec.stateDir, { recursive: true });
    const paths = vmPaths(spec.stateDir);
    const args = machineArgs({ spec, paths, accel: this.accel, hostPort: 0, memory: this.memory, egressRelay: this.egressRelay });
    const target = { qemuVersion: this.qemuVersion, accel: this.accel, hostCpu: this.hostCpu, memMiB: spec.memMiB, vcpus: spec.vcpus, machineArgs: args, image: spec.image, memory: this.memory };
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
    this.log.info("checkpoint restored into a VM", { vmId: spec.vmId, checkpoint: basename(dir) });
  }

  async guestCheckpointRequests(vm: RunningVm): Promise<string[]> {
    return this.mustBeRunning(vm).agent!.checkpointRequests();
  }

  /** The templates of QemuDriverOptions.templates (none when they are off); the host drops their paths before the API sees them. */
  async listTemplates(): Promise<DriverTemplate[]> {
    return (await this.templates?.list()) ?? [];
  }

  async cpuSeconds(vm: RunningVm): Promise<number> {
    return this.running.get(vm.spec.vmId)?.proc.cpuSeconds() ?? 0; // not running here: nothing is using CPU for it
  }

  async guestLeases(vm: RunningVm): Promise<number> {
    const vp = this.mustBeRunning(vm);
    return vp.agent!.leases();
  }

  /** The guest agent connection of a running VM (diagnostics and tests; the driver owns it). */
  guestAgent(vm: RunningVm): GuestAgentClient {
    return this.mustBeRunning(vm).agent!;
  }

  onExit(vm: RunningVm, listener: (exit: VmExit) => void): void {
    this.processes.onExit(vm, listener);
  }

  /** Host shutdown: pre-started QEMUs are killed, VMs still running are stopped (their snapshots stay). */
  async close(): Promise<void> {
    // Hibernations finish their work first: QEMUs exit, and RAM files become durable before the host goes.
    await Promise.all([...this.settling.values(), ...this.ramSyncs.values()]);
    await Promise.all([...this.waiting.keys()].map((id) => this.discardWaiting(id)));
    await Promise.all([...this.running.values()].map((vp) => this.quitRunning(vp)));
    this.stubs?.close();
    await this.egress.close();
  }

  /** The guest console (QEMU appends it): the kernel's few lines, the init's, and a built image's workload's stdout and stderr. */
  logPath(spec: VmSpec): string {
    return vmPaths(spec.stateDir).console;
  }

  /**
   * Kills a QEMU a previous fleet-agent left running for this VM (its pid file, checked against
   * /proc/<pid>/cmdline) and removes partial snapshot and drive files; the complete snapshot and the disk stay.
   */
  async reap(spec: VmSpec): Promise<void> {
    await this.settled(spec.vmId);
    if (this.running.has(spec.vmId) || this.waiting.has(spec.vmId)) return; // ours and alive
    const paths = vmPaths(spec.stateDir);
    // QEMU writes its pid file itself (the pid alone): its QMP socket path on the command line is the VM's marker.
    const killed = await killLeftover(paths.pid, opt(paths.qmp));
    if (killed) this.log.warn("killed a QEMU left running by a previous fleet-agent", { vmId: spec.vmId, pid: killed });
    const { manifest, problem } = await readManifest(paths.manifest);
    if (!problem) await removeUnreferencedSnapshots(spec.stateDir, manifest?.file);
    else await removePartialSnapshots(spec.stateDir);
    await removePartialDrives(spec.stateDir);
    for (const p of [paths.qmp, paths.agent, paths.pid]) await rm(p, { force: true });
  }

  // ---- internals ----

  private mustBeRunning(vm: RunningVm): QemuVm {
    const vp = this.running.get(vm.spec.vmId);
    if (!vp || vp.proc.exit) throw new Error(`VM ${vm.spec.vmId} is not running`);
    return vp;
  }

  private async imageFor(spec: VmSpec): Promise<GuestImagePaths> {
    const image = this.opts.image;
    return typeof image === "function" ? image(spec.rootImage ? IMAGE_GUEST : spec.image) : image;
  }

  private async readPort(paths: VmPaths): Promise<number | undefined> {
    try {
      const port = (JSON.parse(await readFile(paths.port, "utf8")) as { port?: unknown }).port;
      return typeof port === "number" && Number.isInteger(port) && port > 0 ? port : undefined;
    } catch {
      return undefined;
    }
  }

  /** The VM's forwarded host port: chosen once, kept in the stateDir so it survives hibernation. */
  private async hostPort(paths: VmPaths, fresh = false): Promise<number> {
    const existing = fresh ? undefined : await this.readPort(paths);
    if (existing) return existing;
    const port = await freeLoopbackPort();
    await writeFile(paths.port, `${JSON.stringify({ port })}\n`);
    return port;
  }

  private async bootInternal(spec: VmSpec, started: number): Promise<{ vm: RunningVm; clock: ClockFix }> {
    await this.settled(spec.vmId);
    if (this.running.has(spec.vmId)) throw new Error(`VM ${spec.vmId} is already running`);
    await this.discardWaiting(spec.vmId);
    const image = await this.imageFor(spec);
    const deadline = started + (this.opts.bootTimeoutMs ?? 120_000);
    if (spec.rootImage) return this.bootImage(spec, image, started, deadline);
    const vp = await this.launch(spec, image, false);
    try {
      await this.waitAgent(vp, deadline, "guest agent did not answer before the boot deadline");
      const holes = await this.holesAfterBoot(vp);
      // The RTC gives the guest whole seconds at boot; set it to the millisecond like after a restore.
      const clock = await fixGuestClock(vp.agent!, { sameNetwork: true }); // a fresh guest: no neighbour to forget
      await waitForHttp(this.runningVm(vp).endpoint, { deadline, gaveUp: () => vp.proc.exitedWhy("QEMU") });
      await holes.recached;
      this.running.set(spec.vmId, vp);
      this.log.info("booted", { vmId: spec.vmId, pid: vp.proc.pid, port: vp.hostPort, bootMs: Math.round(performance.now() - started), ...holes.done });
      return { vm: this.runningVm(vp), clock };
    } catch (err) {
      await vp.proc.kill();
      throw withTail(err as Error, await vp.proc.finalOutput(), "qemu");
    }
  }

  /**
   * A built image's cold boot: its disk (created on the first boot) starts a new generation, then QEMU with the three
   * drives; ready when the agent answers on its port. Every failure is `boot_failed` with the reason and the console's
   * tail: an entrypoint that exits (the init says so on the console, and powers off) fails it at once, one that never
   * answers at the boot deadline.
   */
  private async bootImage(spec: VmSpec, image: GuestImagePaths, started: number, deadline: number): Promise<{ vm: RunningVm; clock: ClockFix }> {
    const config = spec.rootImage!.config;
    const paths = vmPaths(spec.stateDir);
    mkdirSync(spec.stateDir, { recursive: true });
    capLog(paths.console);
    const consoleWatch = new ConsoleWatch(paths.console);
    let vp: QemuVm | undefined;
    try {
      const disk = await ensureAgentDisk(spec.stateDir, spec.diskMiB ?? DEFAULT_DISK_MIB, this.log.child({ vmId: spec.vmId }));
      await beginDiskGeneration(disk);
      vp = await this.launch(spec, image, false);
      const launched = vp;
      const gaveUp = () => {
        const said = consoleWatch.failure();
        if (said) return `the image's ${said}`;
        return launched.proc.exitedWhy("QEMU");
      };
      await this.waitAgent(vp, deadline, "guest agent did not answer before the boot deadline", gaveUp);
      const holes = await this.holesAfterBoot(vp);
      const clock = await fixGuestClock(vp.agent!, { sameNetwork: true }); // a fresh guest: no neighbour to forget
      await waitImageReady(this.runningVm(vp).endpoint, config, { deadline, gaveUp });
      await holes.recached;
      this.running.set(spec.vmId, vp);
      this.log.info("booted", { vmId: spec.vmId, image: spec.rootImage!.digest, pid: vp.proc.pid, port: vp.hostPort, bootMs: Math.round(performance.now() - started), ...holes.done });
      return { vm: this.runningVm(vp), clock };
    } catch (err) {
      if (vp) await vp.proc.kill();
      const qemuSaid = vp ? await vp.proc.finalOutput() : "";
      const reason = withTail(err as Error, qemuSaid, "qemu").message;
      const tail = consoleWatch.tail();
      throw new AppError("boot_failed", `agent ${spec.agentId} did not boot: ${reason}${tail ? ` (console: ${tail})` : ""}`, { cause: err });
    }
  }

  /**
   * File-backed RAM, once a cold-booted guest's kernel is up (its agent answered): the kernel zeroed all of its memory
   * at boot (init_on_free=1 frees every page through the zeroing path), which wrote the whole RAM file out, 256 MiB of
   * disk for a 256 MiB guest, and left it all dirty for the first hibernation to write back (measured: 255 MiB, 140 ms).
   * The guest is stopped while the zero pages become holes (zero-holes.ts: safe only while nothing writes the file),
   * then runs on; the clock fix that follows covers the pause. The file then takes what the guest holds (~57 MiB for
   * the demo) until its next cold boot. The holes' pages left the page cache: `recached` caches them again in 4 KiB
   * pages (see smallPages) while the guest runs on, which only the page cache sees; the caller awaits it before the VM
   * is ready. A filesystem that cannot punch holes keeps the file as it was (logged). What it did goes in `booted`.
   */
  private async holesAfterBoot(vp: QemuVm): Promise<{ done?: { holesMs: number; ramAllocatedMiB: [number, number] }; recached?: Promise<void> }> {
    if (this.memory !== "file") return {};
    const t0 = performance.now();
    const before = await allocatedBytes(vp.paths.ram);
    await vp.qmp!.execute("stop");
    try {
      await punchZeroPages(vp.paths.ram);
    } catch (err) {
      this.log.warn("RAM file kept without holes for its zero pages", { vmId: vp.spec.vmId, err: (err as Error).message });
      return {};
    } finally {
      await vp.qmp!.execute("cont");
    }
    const mib = (bytes: number) => Math.round(bytes / 2 ** 20);
    const done = { holesMs: Math.round(performance.now() - t0), ramAllocatedMiB: [mib(before), mib(await allocatedBytes(vp.paths.ram))] as [number, number] };
    return { done, recached: this.smallPages(vp.spec, vp.paths.ram) };
  }

  /** Asks the guest to flush its disks before a snapshot; a failure is logged, not fatal (QEMU flushes its own side). */
  private async syncGuest(vp: QemuVm, timeoutMs = this.opts.syncTimeoutMs ?? SYNC_TIMEOUT_MS): Promise<void> {
    const t0 = performance.now();
    try {
      await vp.agent!.sync(timeoutMs);
      this.log.debug("guest synced", { vmId: vp.spec.vmId, ms: Math.round(performance.now() - t0) });
    } catch (err) {
      this.log.warn("guest sync failed; going on without it", { vmId: vp.spec.vmId, err });
    }
  }

  /**
   * The snapshot, if usable, loaded into a QEMU waiting in `-incoming defer` (pre-started or new), then `cont`;
   * RestoreFailed when a cold boot is the way out. Device state (file-backed RAM) is verified before QEMU gets it;
   * all of guest RAM (streamed) while QEMU loads the file. The guest runs only if the checksum matches. A QEMU kept
   * stopped after its hibernation (`prestart: "paused"`) that holds this very snapshot loads nothing: it runs on.
   * Phases (qemu/phases.ts) go into the "restored" log line.
   */
  private async restore(spec: VmSpec, undo: (step: () => Promise<unknown>) => void, started = performance.now()): Promise<Restored> {
    const phases = new Phases(started);
    const paths = vmPaths(spec.stateDir);
    const [{ manifest, problem }, hostPort] = await Promise.all([readManifest(paths.manifest), this.readPort(paths)]);
    if (!manifest) throw new RestoreFailed(problem ?? "no snapshot");
    const targetArgs = machineArgs({ spec, paths, accel: this.accel, hostPort: hostPort ?? 0, memory: this.memory, egressRelay: this.egressRelay });
    const bad = incompatibility(manifest, { qemuVersion: this.qemuVersion, accel: this.accel, hostCpu: this.hostCpu, memMiB: spec.memMiB, vcpus: spec.vcpus, machineArgs: targetArgs });
    if (bad) throw new RestoreFailed(bad);
    const file = join(spec.stateDir, manifest.file);
    if (!existsSync(file)) throw new RestoreFailed(`snapshot file ${manifest.file} is missing`);
    const stale = await this.snapshotStale(spec, paths, manifest);
    if (stale) throw new RestoreFailed(stale);
    const plan = ramPlan(this.memory, manifest);
    const mismatch = (r: { sha256: string; bytes: number }) =>
      r.sha256 === manifest.sha256 && r.bytes === manifest.bytes ? undefined : `snapshot checksum mismatch (${r.bytes} bytes, sha256 ${r.sha256.slice(0, 12)}…, manifest says ${manifest.sha256.slice(0, 12)}…)`;
    // Device state only (file-backed RAM): read and verified before QEMU sees it, then handed over a socket
    // (`sendIncoming`). All of guest RAM (streamed): QEMU reads the file itself while it is checksummed beside it.
    let state: Buffer | undefined;
    let verify: Promise<string | undefined> = Promise.resolve(undefined);
    if (this.memory === "file" && manifest.bytes <= SOCKET_STATE_MAX_BYTES) {
      state = await readFile(file).catch((err: Error) => {
        throw new RestoreFailed(`snapshot unreadable: ${err.message}`, { cause: err });
      });
      const badData = mismatch({ sha256: createHash("sha256").update(state).digest("hex"), bytes: state.length });
      if (badData) throw new RestoreFailed(badData);
    } else {
      verify = sha256File(file).then(mismatch, (err: Error) => `snapshot unreadable: ${err.message}`);
      undo(() => verify);
    }
    // From here the guest will write to its disk and RAM file again: no snapshot taken before pairs with them. The new
    // generations are written while QEMU starts and loads (a restore that fails from here boots cold anyway), and are
    // durable before `cont`.
    const generations = Promise.all([
      spec.rootImage ? beginDiskGeneration(paths.disk) : undefined,
      this.memory === "file" && !plan.templateRam ? beginRamGeneration(paths) : undefined,
    ]);
    generations.catch(() => undefined); // awaited before `cont`
    undo(() => generations); // a cold boot after a failure here starts a generation of its own: not at the same time
    phases.mark("checks");
    // A pre-started QEMU maps the VM's own RAM file with shared pages skipped: only that plan can use it.
    let vp = plan.prestartable ? this.takeWaiting(spec) : (await this.discardWaiting(spec.vmId), undefined);
    if (!vp) await this.settled(spec.vmId); // a kept one just ended (`endKept`) still holds the VM's port and sockets
    // One that died while it waited (killed, out of memory) is of no use: the files restore into a new QEMU. Its exit
    // event may not have arrived yet, so the process itself is asked.
    if (vp && (vp.proc.exit || vp.proc.pid === undefined || !processAlive(vp.proc.pid))) {
      await vp.proc.kill().catch(() => undefined);
      vp = undefined;
    }
    // A QEMU kept stopped after its hibernation holds exactly one snapshot: this one, or it is of no use.
    const paused = vp?.pausedAt !== undefined && vp.pausedAt === `${manifest.file}:${manifest.sha256}`;
    if (vp?.pausedAt !== undefined && !paused) {
      await vp.proc.kill();
      vp = undefined;
    }
    if (!vp) {
      const image = await this.imageFor(spec);
      try {
        vp = await this.launch(spec, image, true, plan.templateRam, phases);
      } catch (err) {
        throw new RestoreFailed(`QEMU did not start for the restore: ${(err as Error).message}`, { cause: err });
      }
    } else phases.mark("prestarted");
    const launched = vp;
    undo(() => launched.proc.kill());
    const deadline = performance.now() + (this.opts.restoreTimeoutMs ?? 60_000);
    try {
      const agentReady = this.openAgent(vp);
      if (!paused) {
        if (state) await this.sendIncoming(vp, state);
        else await vp.qmp!.execute("migrate-incoming", { uri: `exec:cat ${shellQuote(file)}` });
        phases.mark("incomingCmd");
        const info = await this.waitMigration(vp, { timeoutMs: deadline - performance.now() });
        phases.mark("load");
        if (info.status !== "completed") throw new RestoreFailed(`restore ${info.status}: ${info["error-desc"] ?? "no detail"}`);
        const badData = await verify;
        if (badData) throw new RestoreFailed(badData);
      }
      await agentReady;
      phases.mark("verifyAgentSocket");
      await generations;
      phases.mark("generations");
      await this.opts.beforeCont?.(vp.proc.pid);
      // A paused one's `cont` after its completed migration also takes its drives back (as after a checkpoint).
      await vp.qmp!.execute("cont");
      vp.pausedAt = undefined;
      phases.mark(paused ? "contPaused" : "cont");
      await this.opts.afterCont?.(vp.proc.pid);
    } catch (err) {
      // Damaged data can make QEMU itself fail the load (or exit): the checksum then says what was wrong.
      const badData = await verify;
      if (badData) throw new RestoreFailed(badData, { cause: err });
      if (err instanceof RestoreFailed) throw err;
      throw new RestoreFailed(withTail(err as Error, await vp.proc.finalOutput(), "qemu").message, { cause: err });
    }
    this.running.set(spec.vmId, vp);
    const clonedFrom = manifest.clonedFrom;
    // The guest's first answer may take what the restore has left of its deadline: once it runs (`cont`), its disk and
    // RAM have moved on from the snapshot, so giving up means a cold boot, which on a host busy enough to starve the
    // guest takes far longer still (a wait of 10 s here once sent clones of a full host into 90-124 s cold boots).
    const answerWithinMs = Math.max(100, deadline - performance.now());
    return {
      vm: this.runningVm(vp),
      // The guest's first answer is the clock fix's first request (one round trip fewer on the wake's path); a clone
      // is first pinged, then given its identity before anything else reaches it.
      ...(clonedFrom ? {} : { firstAnswerWithinMs: answerWithinMs }),
      // The guest's neighbour check at the clock fix matters only when an address it could not resolve may now answer.
      sameNetwork: paused || forwardedAddresses(manifest.machineArgs).join(" ") === forwardedAddresses(targetArgs).join(" "),
      guestAgent: async () => {
        if (!clonedFrom) return launched.agent!;
        const agent = await this.waitAgent(launched, performance.now() + answerWithinMs, "guest agent did not answer after the restore");
        phases.mark("agentPing");
        // A copy of another moment's memory: its RNG state, hostname and id are the checkpoint's until told otherwise.
        await agent.identity({ agentId: spec.agentId, hostname: guestHostname(spec.agentId), entropy: randomBytes(32), clonedFrom });
        phases.mark("identity");
        return agent;
      },
      // The phases object is still filled in by guestAgent above: the "restored" line is written after it.
      detail: { ...(clonedFrom ? { clonedFrom } : {}), phases: phases.ms },
    };
  }

  /** Why the snapshot no longer pairs with the VM's disk or RAM file (something ran on them since); undefined when it does. */
  private async snapshotStale(spec: VmSpec, paths: VmPaths, manifest: SnapshotManifest): Promise<string | undefined> {
    // The memory is valid only over the disk it was taken with (common/agent-disk.ts).
    if (spec.rootImage) {
      const now = await diskFingerprint(paths.disk).catch((): DiskFingerprint | undefined => undefined);
      const changed = diskChange(manifest.disk, now);
      if (changed) return changed;
    }
    if (this.memory !== "file") return undefined;
    // A template's clone: the template's RAM file must be the one it was made from (templates are never rewritten).
    if (manifest.templateRam) {
      const { path, ...recorded } = manifest.templateRam;
      return ramChange(recorded, await ramFingerprint({ ram: path, ramGeneration: `${path}.gen` }), spec.memMiB);
    }
    if (!manifest.ram) return undefined; // RAM streamed into the data file (a clone's snapshot): nothing else to pair with
    // The device state is valid only over the RAM file it was taken with (ram-file.ts says what is checked and why),
    // and only if that file's pages survived: a reboot during their write-back may have torn them.
    return ramChange(manifest.ram, await ramFingerprint(paths), spec.memMiB) ?? (await ramDurability(paths, manifest, this.bootId));
  }

  private runningVm(vp: QemuVm): RunningVm {
    return { spec: vp.spec, endpoint: { host: "127.0.0.1", port: vp.hostPort }, pid: vp.proc.pid };
  }

  /** Starts QEMU and connects QMP; retries once on a new port when the stored one is taken. */
  /** `templateRam`: a template's RAM file to map privately instead of the VM's own (ram-file.ts `ramPlan`). */
  private async launch(spec: VmSpec, image: GuestImagePaths, incoming: boolean, templateRam?: string, phases?: Phases): Promise<QemuVm> {
    mkdirSync(spec.stateDir, { recursive: true });
    const paths = vmPaths(spec.stateDir);
    mkdirSync(paths.socketDir, { recursive: true, mode: 0o700 });
    capLog(paths.console); // QEMU appends the guest console itself; its own log is capped when opened
    // A built image's QEMU needs its launch drive at every start (the same devices for a boot and a restore).
    const egress = spec.allowEgress && this.egressRelay !== undefined;
    if (spec.allowEgress && !egress) this.log.warn("agent allows egress but there is no relay: it gets none", { vmId: spec.vmId });
    if (spec.rootImage) await makeLaunchDrive(spec.stateDir, spec.rootImage.config, { agentId: spec.agentId, port: spec.rootImage.config.port, ...(egress ? { egressProxy: egressProxyUrl } : {}) });
    // The proxy listens before QEMU starts: the guest may connect as soon as it runs (a restored one at once).
    if (egress) await this.egress.listen(spec.vmId, paths.egress);
    // A cold boot on file-backed RAM starts a fresh RAM file (and generation): no snapshot pairs with it any more.
    if (this.memory === "file" && !incoming) {
      await freshRamFile(paths, spec.memMiB);
      await this.smallPages(spec, paths.ram);
    }
    let hostPort = await this.hostPort(paths);
    for (let attempt = 0; ; attempt++) {
      phases?.mark("launchPrepare");
      const vp = this.spawnQemu(spec, paths, image, hostPort, incoming, templateRam);
      phases?.mark("spawn");
      try {
        vp.qmp = await QmpClient.connect(paths.qmp, { timeoutMs: 15_000, alive: () => !vp.proc.exit });
        phases?.mark("qmpConnect");
        // Sent together (QEMU answers in order). `events`: MIGRATION status events, which waitMigration waits on. Both
        // sides, file-backed RAM: the shared RAM file is not migrated, only the device state (`x-ignore-shared`).
        const capabilities = [{ capability: "events", state: true }, ...(this.memory === "file" ? [{ capability: "x-ignore-shared", state: true }] : [])];
        await Promise.all([vp.qmp.execute("migrate-set-parameters", { "max-bandwidth": UNLIMITED_BANDWIDTH }), vp.qmp.execute("migrate-set-capabilities", { capabilities })]);
        phases?.mark("qmpSetup");
        return vp;
      } catch (err) {
        await vp.proc.kill();
        const said = await vp.proc.finalOutput();
        if (attempt === 0 && /host forwarding rule|Could not set up host forwarding/i.test(said)) {
          this.log.warn("forwarded port taken; choosing another", { vmId: spec.vmId, port: hostPort });
          hostPort = await this.hostPort(paths, true);
          continue;
        }
        throw withTail(err as Error, said, "qemu");
      }
    }
  }

  private spawnQemu(spec: VmSpec, paths: VmPaths, image: GuestImagePaths, hostPort: number, incoming: boolean, templateRam: string | undefined): QemuVm {
    // Stale unix sockets from a previous QEMU would make clients connect to nothing.
    for (const p of [paths.qmp, paths.agent]) rmSync(p, { force: true });
    const launch = { spec, paths, accel: this.accel, hostPort, kernel: image.kernel, initrd: image.initrd, tscKhz: this.tscKhz, incoming, memory: this.memory, egressRelay: this.egressRelay, templateRam };
    const templateFd = templateRam ? openSync(templateRam, "r") : undefined;
    const env = { ...process.env };
    if (this.preload) env.LD_PRELOAD = [this.preload, env.LD_PRELOAD].filter(Boolean).join(" ");
    // QEMU's stderr is relayed through us (see `relayStderr`): its log shares the disk a snapshot may have filled.
    const proc = VmProcess.spawn({ vmId: spec.vmId, command: this.binary, args: qemuArgs(launch), log: paths.qemuLog, output: "stderr", relayStderr: true, env, stubs: this.stubs });
    const vp: QemuVm = { spec, paths, hostPort, machineArgs: machineArgs(launch), proc, qmp: undefined, agent: undefined, agentOpen: false, templateRam, templateFd };
    proc.onEnd((exit) => this.onProcessEnd(vp, exit));
    this.processes.add(proc);
    return vp;
  }

  private onProcessEnd(vp: QemuVm, exit: VmExit): void {
    if (vp.templateFd !== undefined) closeSync(vp.templateFd);
    vp.templateFd = undefined;
    vp.qmp?.close();
    vp.agent?.close();
    const id = vp.spec.vmId;
    const wasRunning = this.running.get(id) === vp;
    if (wasRunning) this.running.delete(id);
    if (this.waiting.get(id) === vp) this.waiting.delete(id);
    if (vp.proc.spawnError) this.log.error("QEMU failed to start", { vmId: id, err: vp.proc.spawnError });
    else if (vp.proc.crashed && wasRunning) {
      void vp.proc.finalOutput().then((said) => this.log.error("QEMU exited unexpectedly", { vmId: id, pid: vp.proc.pid, code: exit.code, signal: exit.signal, log: said }));
    }
  }

  /** Ends a running VM that is not hibernated: a built image's guest flushes its disk first (briefly), then QEMU quits. */
  private async quitRunning(vp: QemuVm): Promise<void> {
    if (vp.spec.rootImage && vp.agentOpen && !vp.proc.exit) await this.syncGuest(vp, STOP_SYNC_TIMEOUT_MS);
    await this.quit(vp);
  }

  /** Asks QEMU to quit, then kills it if it does not; waits for the exit. */
  private async quit(vp: QemuVm): Promise<void> {
    await vp.proc.stop(() => vp.qmp?.execute("quit", undefined, 2000), 5000);
    for (const p of [vp.paths.qmp, vp.paths.agent]) rmSync(p, { force: true });
  }

  private takeWaiting(spec: VmSpec): QemuVm | undefined {
    const vp = this.waiting.get(spec.vmId);
    if (!vp) return undefined;
    this.waiting.delete(spec.vmId);
    return vp.proc.exit ? undefined : vp;
  }

  /**
   * A fresh RAM file cached in 4 KiB pages before QEMU maps it (small-pages.ts): what the guest then dirties is written
   * back page by page at each hibernation, not folio by folio. Restores find those pages still cached; after the host
   * dropped them (memory pressure, a reboot) the file is cached as the kernel likes until the next cold boot. Without
   * the helper (no gcc) or if it fails, the VM runs all the same.
   */
  private async smallPages(spec: VmSpec, ram: string): Promise<void> {
    const helper = smallPagesTool();
    if (!("path" in helper)) {
      if (!this.smallPagesMissingSaid) this.log.warn("RAM files keep the kernel's large page-cache folios: hibernations write back more", { why: helper.error });
      this.smallPagesMissingSaid = true;
      return;
    }
    await cacheInSmallPages(helper.path, ram).catch((err: unknown) => this.log.warn("could not cache the RAM file in small pages", { vmId: spec.vmId, err }));
  }

  /**
   * A kept QEMU past its time, or the oldest over the bound: ended. Its VM's snapshot is on disk (committed before it
   * was kept), so the next wake restores from the files; that wake waits for this exit first (`settled`), as the new
   * QEMU needs the port and sockets this one holds.
   */
  private endKept(vmId: string, vp: QemuVm, why: EvictReason): void {
    this.log.info("kept QEMU ended; the next wake restores from the files", { vmId, why, paused: vp.pausedAt !== undefined, pid: vp.proc.pid });
    const before = this.settling.get(vmId);
    const ending = (async () => {
      await before;
      await vp.proc.kill();
    })().catch((err: unknown) => this.log.warn("ending a kept QEMU failed", { vmId, err }));
    this.trackSettling(vmId, ending);
  }

  private async discardWaiting(vmId: string): Promise<void> {
    const vp = this.waiting.get(vmId);
    if (!vp) return;
    this.waiting.delete(vmId);
    await vp.proc.kill();
  }

  private async prestart(spec: VmSpec): Promise<void> {
    if (this.running.has(spec.vmId) || this.waiting.has(spec.vmId)) return;
    const vp = await this.launch(spec, await this.imageFor(spec), true);
    if (this.running.has(spec.vmId) || this.waiting.has(spec.vmId)) return vp.proc.kill();
    this.waiting.set(spec.vmId, vp);
  }

  /** Opens the host end of the agent's virtio-serial port (a unix socket QEMU serves). */
  private openAgent(vp: QemuVm): Promise<void> {
    if (vp.agent && vp.agentOpen) return Promise.resolve();
    vp.agent?.close();
    return new Promise((resolve, reject) => {
      const socket = connect(vp.paths.agent);
      const agent = new GuestAgentClient(socket);
      vp.agent = agent;
      socket.once("connect", () => {
        if (vp.agent === agent) vp.agentOpen = true;
        resolve();
      });
      socket.once("error", reject);
      socket.once("close", () => {
        if (vp.agent === agent) vp.agentOpen = false;
      });
    });
  }

  /** Pings over the agent port (reconnecting when it closed) until the guest agent answers. */
  private waitAgent(vp: QemuVm, deadline: number, timeout: string, gaveUp: () => string | undefined = () => vp.proc.exitedWhy("QEMU")): Promise<GuestAgentClient> {
    return pollUntil(
      async (remaining) => {
        await this.openAgent(vp);
        await vp.agent!.ping(Math.max(100, Math.min(500, remaining)));
        return vp.agent!;
      },
      { deadline, gaveUp, timeout },
    );
  }

  /**
   * Writes the stopped VM's state (device state; with streamed memory all guest RAM too) into `to.data`. The marker
   * `to.done` is written only after cat has flushed and closed the file: QEMU may report "completed" while cat is
   * still writing.
   */
  private async migrateToFile(vp: QemuVm, to: { data: string; done: string }, signal?: AbortSignal, phases?: Phases): Promise<void> {
    await vp.qmp!.execute("migrate", { uri: `exec:cat > ${shellQuote(to.data)} && : > ${shellQuote(to.done)}` });
    phases?.mark("migrateCmd");
    const info = await this.waitMigration(vp, { signal, timeoutMs: 120_000 });
    phases?.mark("migrate");
    if (info.status !== "completed") throw new Error(`snapshot migration ${info.status}: ${info["error-desc"] ?? "no detail"}`);
    await this.waitForFile(to.done, 10_000, signal);
    phases?.mark("writerDone");
    signal?.throwIfAborted();
  }

  /**
   * File-backed RAM: the stopped VM's device state (tens of KB) over a unix socket into `dataPath`, hashed as it
   * arrives. Against `exec:cat > file` QEMU forks no shell, nothing polls for a marker, and the file is not read back
   * for its checksum. Prepared while the guest still runs (the socket listening, the file being created): `run` then only
   * asks QEMU to migrate; the state is written at its end and its fsync is `durable`, for the caller to await beside
   * the manifest's own write (the manifest is renamed into place only after both).
   */
  private async socketMigration(vp: QemuVm, dataPath: string): Promise<{
    run(signal?: AbortSignal, phases?: Phases): Promise<{ sha256: string; bytes: number; durable: Promise<void> }>;
    close(): Promise<void>;
  }> {
    const sock = join(vp.paths.socketDir, "mig.sock"); // no longer than agent.sock: it fits where that one does
    rmSync(sock, { force: true });
    // Opened alongside `stop` and the migration, awaited only to write what arrived: a thread-pool round trip (and any
    // journal commit a create queues behind) off the path before `stop`.
    const opened = open(dataPath, "wx");
    opened.catch(() => undefined);
    const hash = createHash("sha256");
    const chunks: Buffer[] = [];
    let bytes = 0;
    let conn: Socket | undefined;
    const server = createServer();
    const timeout = new AbortController();
    const received = new Promise<void>((resolve, reject) => {
      server.once("connection", (c) => {
        conn = c;
        server.close();
        c.on("data", (chunk: Buffer) => {
          hash.update(chunk);
          chunks.push(chunk);
          bytes += chunk.length;
        });
        c.once("end", resolve);
        c.once("error", reject);
      });
    });
    received.catch(() => undefined);
    let durable: Promise<void> | undefined;
    const close = async () => {
      timeout.abort();
      conn?.destroy();
      server.close();
      rmSync(sock, { force: true });
      await durable?.catch(() => undefined);
      await (await opened.catch(() => undefined))?.close();
    };
    try {
      await new Promise<void>((resolve, reject) => server.once("error", reject).listen(sock, resolve));
    } catch (err) {
      await close();
      throw err;
    }
    return {
      close,
      run: async (signal, phases) => {
        await vp.qmp!.execute("migrate", { uri: `unix:${sock}` });
        phases?.mark("migrateCmd");
        const info = await this.waitMigration(vp, { signal, timeoutMs: 120_000 });
        if (info.status !== "completed") throw new Error(`snapshot migration ${info.status}: ${info["error-desc"] ?? "no detail"}`);
        const late = sleep(10_000, undefined, { signal: timeout.signal }).then(() => Promise.reject(new Error("the migration stream did not end within 10 s of QEMU's completion")));
        late.catch(() => undefined);
        await Promise.race([received, late]);
        phases?.mark("migrate");
        signal?.throwIfAborted();
        const fh = await opened;
        await fh.writev(chunks);
        phases?.mark("stateWrite");
        durable = fh.sync();
        return { sha256: hash.digest("hex"), bytes, durable };
      },
    };
  }

  /**
   * A restore's device state (read and verified already) into the QEMU waiting in `-incoming defer`, over a unix
   * socket it listens on: no `exec:cat` for QEMU to fork.
   */
  private async sendIncoming(vp: QemuVm, data: Buffer): Promise<void> {
    const sock = join(vp.paths.socketDir, "mig.sock");
    rmSync(sock, { force: true });
    await vp.qmp!.execute("migrate-incoming", { uri: `unix:${sock}` });
    try {
      await new Promise<void>((resolve, reject) => {
        const c = connect(sock);
        c.on("error", reject); // after the send: QEMU closing early shows in the migration's status

        c.once("connect", () => c.end(data, () => resolve()));
      });
    } finally {
      rmSync(sock, { force: true });
    }
  }

  /** A copy of the template's RAM file the VM maps (a reflink where the filesystem can), at `to` or a temporary beside the VM's. */
  private async copyTemplateRam(vp: QemuVm, to?: string): Promise<{ file: string; copy: CopyKind }> {
    const file = to ?? `${vp.paths.ram}.tmp-${randomBytes(4).toString("hex")}`;
    return { file, copy: await cowCopy(`/proc/${process.pid}/fd/${vp.templateFd!}`, file) };
  }

  /**
   * Migrates the stopped VM over a unix socket into `dataPath` and `ramFile` (ram-stream.ts): device state to the
   * first, the guest RAM's pages that differ from the template's into the second (a copy of it). Both are synced.
   */
  private async migrateSplitting(vp: QemuVm, dataPath: string, ramFile: string, signal?: AbortSignal): Promise<{ sha256: string; bytes: number; pages: number }> {
    const sock = join(vp.paths.socketDir, "mig.sock"); // no longer than agent.sock: it fits where that one does
    rmSync(sock, { force: true });
    const hash = createHash("sha256");
    let bytes = 0;
    const out = createWriteStream(dataPath, { flags: "wx" });
    const baseFd = vp.templateFd!;
    const ramFd = openSync(ramFile, "r+");
    const writer = new RamFileWriter(baseFd, ramFd);
    let conn: Socket | undefined;
    const server = createServer();
    try {
      const received = new Promise<void>((resolve, reject) => {
        const splitter = new RamStreamSplitter(
          (chunk) => {
            hash.update(chunk);
            bytes += chunk.length;
            if (!out.write(chunk)) {
              conn?.pause();
              out.once("drain", () => conn?.resume());
            }
          },
          writer,
          { ramBlock: "mem", ignoreShared: true },
        );
        server.once("connection", (c) => {
          conn = c;
          server.close();
          c.on("data", (chunk: Buffer) => {
            try {
              splitter.push(chunk);
            } catch (err) {
              c.destroy();
              reject(err as Error);
            }
          });
          c.once("end", () => {
            try {
              splitter.end();
              out.end();
            } catch (err) {
              reject(err as Error);
            }
          });
          c.once("error", reject);
        });
        out.once("finish", resolve);
        out.once("error", reject);
      });
      received.catch(() => undefined);
      await new Promise<void>((resolve, reject) => server.once("error", reject).listen(sock, resolve));
      await vp.qmp!.execute("migrate", { uri: `unix:${sock}` });
      const info = await this.waitMigration(vp, { signal, timeoutMs: 120_000 });
      if (info.status !== "completed") throw new Error(`snapshot migration ${info.status}: ${info["error-desc"] ?? "no detail"}`);
      await Promise.race([received, sleep(10_000).then(() => Promise.reject(new Error("the migration stream did not end within 10 s of QEMU's completion")))]);
      signal?.throwIfAborted();
      fsyncSync(ramFd);
      await fsyncPath(dataPath);
      this.log.debug("clone's RAM split from its migration", { vmId: vp.spec.vmId, stateBytes: bytes, pagesWritten: writer.written });
      return { sha256: hash.digest("hex"), bytes, pages: writer.written };
    } finally {
      conn?.destroy();
      server.close();
      out.destroy();
      closeSync(ramFd);
      rmSync(sock, { force: true });
    }
  }

  /**
   * Waits until the migration leaves its active states; cancels it when `signal` aborts. Event-driven: QEMU announces
   * each status change (MIGRATION, the `events` capability set at launch), and that, QEMU's exit or the abort brings
   * the next query-migrate at once; without any, one runs every MIGRATION_POLL_MS all the same.
   */
  private async waitMigration(vp: QemuVm, opts: { signal?: AbortSignal | undefined; timeoutMs: number }): Promise<MigrationInfo> {
    const qmp = vp.qmp!;
    const deadline = performance.now() + opts.timeoutMs;
    let cancelled = false;
    let pending = false; // something happened since the last query
    let wakeUp: (() => void) | undefined;
    const nudge = () => {
      pending = true;
      wakeUp?.();
    };
    const off = qmp.onEvent((e) => {
      if (e.event === "MIGRATION") nudge();
    });
    opts.signal?.addEventListener("abort", nudge);
    void vp.proc.exited.then(nudge);
    try {
      for (;;) {
        pending = false;
        if (vp.proc.exit) throw new Error(`QEMU exited during the migration: ${(await vp.proc.finalOutput()) || "no message"}`);
        if (opts.signal?.aborted && !cancelled) {
          cancelled = true;
          await qmp.execute("migrate_cancel").catch(() => undefined);
        }
        const info = await qmp.execute("query-migrate");
        const s = info.status;
        if (s === "completed" || s === "failed" || s === "cancelled") {
          if (cancelled) opts.signal?.throwIfAborted();
          return info;
        }
        if (performance.now() > deadline) {
          await qmp.execute("migrate_cancel").catch(() => undefined);
          throw new Error(`migration still ${s ?? "pending"} after ${Math.round(opts.timeoutMs)} ms`);
        }
        if (pending) continue;
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, MIGRATION_POLL_MS);
          wakeUp = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        wakeUp = undefined;
      }
    } finally {
      off();
      opts.signal?.removeEventListener("abort", nudge);
      wakeUp = undefined;
    }
  }

  private async waitForFile(path: string, timeoutMs: number, signal?: AbortSignal): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      signal?.throwIfAborted();
      try {
        statSync(path);
        return;
      } catch {
        if (performance.now() > deadline) throw new Error(`snapshot writer did not finish within ${timeoutMs} ms`);
        await sleep(2);
      }
    }
  }

  /**
   * Why a snapshot failed, as the host records it. On a full disk QEMU only says "Unable to write to command: Broken
   * pipe" (its writer, cat, died); cat's own words reach us through the relayed stderr, and statfs shows the disk full:
   * then a SnapshotNoSpace with the bytes needed, free when it began, and written when the disk filled.
   */
  private async snapshotError(vp: QemuVm, err: Error, f: { neededBytes: number; freeBefore: number | undefined; data: string; outputMark: number }): Promise<Error> {
    const said = vp.proc.recentOutput(f.outputMark);
    const written = await stat(f.data).then((s) => s.size, () => 0);
    const freeNow = await freeBytes(vp.spec.stateDir);
    if (saysNoSpace(said) || saysNoSpace(err.message) || (written > 0 && freeNow !== undefined && freeNow < 1 << 20)) {
      return new SnapshotNoSpace(
        { dir: vp.spec.stateDir, neededBytes: Math.max(f.neededBytes, snapshotBytesNeeded(vp.spec.memMiB)), freeBytes: f.freeBefore ?? written, writtenBytes: written, said: [err.message, said].filter(Boolean).join("; qemu: ") },
        { cause: err },
      );
    }
    return withTail(err, said, "qemu");
  }

  /**
   * After a cancelled or failed snapshot, or a checkpoint: end any migration, run the guest again, fix its clock, drop
   * partial snapshot files.
   * A VM that cannot be run again is killed as a crash (its exit is reported), never left paused for the host to
   * believe it is running.
   */
  private async resumeAfterSnapshot(vp: QemuVm, aborted: boolean): Promise<void> {
    const qmp = vp.qmp!;
    try {
      const info = await qmp.execute("query-migrate");
      if (info.status && !["completed", "failed", "cancelled", "none"].includes(info.status)) {
        await qmp.execute("migrate_cancel");
        for (let i = 0; i < 1000; i++) {
          const s = (await qmp.execute("query-migrate")).status;
          if (s === "completed" || s === "failed" || s === "cancelled") break;
          await sleep(3);
        }
      }
      await contAfterMigration(qmp);
    } catch (err) {
      this.log.error("could not resume the VM after a failed snapshot; killing it", { vmId: vp.spec.vmId, aborted, err });
      vp.proc.signal("SIGKILL");
    }
    // The guest clock stood still while the VM was stopped.
    if (!vp.proc.exit) await fixGuestClock(vp.agent!, { sameNetwork: true }).catch((err: unknown) => this.log.warn("guest clock not fixed after a failed snapshot", { vmId: vp.spec.vmId, err }));
    await removePartialSnapshots(vp.spec.stateDir);
  }
}

/** A guest's hostname: its agent id as a DNS label (RFC 1123 has no `_`). */
export function guestHostname(agentId: string): string {
  return agentId.replace(/_/g, "-").toLowerCase().slice(0, 63);
}

/** The driver for this host, with the accelerator chosen by `detectAccel` unless configured. */
export function createQemuDriver(opts: QemuDriverOptions): QemuDriver {
  return new QemuDriver(opts);
}

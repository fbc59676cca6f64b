// The `firecracker` driver: one Firecracker process per running VM, hibernated as a Firecracker snapshot.
//
// boot:      spawn `firecracker --api-sock` → machine-config, boot-source, eth0 on the VM's tap, vsock →
//            InstanceStart → guest agent answers over vsock → workload answers HTTP.
// hibernate: close the vsock connection (Firecracker resets them on snapshot anyway) → PATCH /vm Paused →
//            (abort? resume, completed:false) → PUT /snapshot/create to temporary files → (abort? resume and
//            discard) → fsync, checksum, rename, commit the manifest → kill the process.
// wake:      manifest compatible (firecracker release, snapshot format, CPU, host kernel, size) and files
//            intact → new process → PUT /snapshot/load {resume_vm, clock_realtime} → guest agent → clock fix.
//            Anything else → cold boot with `fallbackReason` (the rule is common/restore-or-boot.ts). A refused
//            load ends the Firecracker process (documented behaviour); the driver expects that and boots cold.
// A built image's VM (`spec.rootImage`) also gets three drives (image-drives.ts): the image read-only, its
// persistent disk, the launch drive. Its hibernation asks the guest to SYNC first and records the disk's
// fingerprint in the manifest; a wake over a disk that changed since then boots cold, the disk as it is.
// checkpoint: (running) PATCH /vm Paused → PUT /snapshot/create Full to temporary files → a built image's disk copied
//            (reflink where it can) → Resumed → clock fix; the files moved into the checkpoint directory (checkpoint.ts),
//            its manifest written, the directory renamed into place. (Hibernated) the snapshot's files copied once
//            they pair (checksums, the disk's fingerprint).
// restoreCheckpoint: the old manifest removed → the checkpoint's files copied in under temporary names → the
//            manifest (`clonedFrom`) committed; the next wake loads it, with `vsock_override` / `network_overrides`
//            where this VM's paths differ, and pushes a fresh identity (IDENTITY over vsock) before it returns.
// templates: (common/templates.ts) per kind of VM one cold-booted VM checkpointed; `boot` restores it into the new
//            VM like a fork (restoreCheckpoint + wake: fresh identity) and boots cold when that fails. The guest's
//            address is in the template's memory, so a clone needs the template's network slot: the first clone takes
//            it and a new template is built (on a free slot) in the background; while none is usable, boots are cold.
import { randomBytes } from "node:crypto";
import { accessSync, constants, existsSync, readFileSync, rmSync } from "node:fs";
import { chown, copyFile, link, mkdir, rename, rm, stat } from "node:fs/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { basename, delimiter, dirname, join, relative, resolve } from "node:path";
import { AppError } from "../../../lib/errors.ts";
import { silentLogger, type Logger } from "../../../lib/log.ts";
import { agentDiskPath, beginDiskGeneration, DEFAULT_DISK_MIB, diskChange, diskFingerprint, ensureAgentDisk, type DiskFingerprint } from "../common/agent-disk.ts";
import { cowCopy, type CopyKind } from "../common/cow-copy.ts";
import { fixGuestClock, type GuestAgentClient } from "../common/guest-agent.ts";
import { guestHostname, LAUNCH_DRIVE_FILE, makeLaunchDrive } from "../common/launch-data.ts";
import { killLeftover, processAlive, readPidFile, writePidFile } from "../common/proc.ts";
import { pollUntil, waitForHttp } from "../common/readiness.ts";
import { RestoreFailed, restoreOrBoot, type Restored } from "../common/restore-or-boot.ts";
import { fsyncPath, publishDirectory, sha256File } from "../common/snapshot-files.ts";
import { VmTemplates } from "../common/templates.ts";
import { ensureSnapshotSpace, saysNoSpace, snapshotBytesNeeded, SnapshotNoSpace } from "../common/snapshot-space.ts";
import { checkSocketPath, MANIFEST_FILE, processFiles } from "../common/state-dir.ts";
import { VmProcess, VmProcesses, withLogTail } from "../common/vm-process.ts";
import type { BootResult, CheckpointInfo, DriverTemplate, RunningVm, SnapshotResult, VmDriver, VmExit, VmSpec, WakeResult } from "../driver.ts";
import { ConsoleWatch, waitImageReady } from "../common/image-boot.ts";
import { FirecrackerApiError, FirecrackerClient, type Drive, type SnapshotLoadParams } from "./api.ts";
import { CHECKPOINT_DISK, CHECKPOINT_FORMAT, CHECKPOINT_MEM, CHECKPOINT_STATE, checkpointFiles, checkpointMismatch, readCheckpoint, type CheckpointManifest } from "./checkpoint.ts";
import { checkFirecrackerHost, type FirecrackerHostFacts, type HostCheckOptions } from "./host.ts";
import { drivesChange, imageDrives, stageImageFiles, type ImageDriveFiles } from "./image-drives.ts";
import { claimNet, kernelIpArg, preferNet, recordedNet, releaseNet, runNetScript, slotOwner, type NetOptions, type VmNet } from "./net.ts";
import {
  commitSnapshot,
  discardGeneration,
  generationFiles,
  incompatibility,
  readManifest,
  removeStaleSnapshotFiles,
  verifyFiles,
  type SnapshotImage,
  type SnapshotManifest,
} from "./snapshot.ts";
import { waitForGuestAgent } from "./vsock.ts";

/** What the guest boots from. An initramfs (`initrd`) is the default; `rootfs` adds a read-only root drive. */
export interface FirecrackerImage {
  /** Uncompressed ELF vmlinux (Firecracker on x86_64 does not boot a bzImage). */
  kernel: string;
  initrd?: string;
  rootfs?: string;
  /** Extra kernel arguments this image needs. */
  bootArgs?: string;
}

export interface FirecrackerDriverOptions {
  /** Path of the firecracker binary (or a name on PATH). */
  binary?: string;
  /** Kernel and initramfs by image name; a built image's VM asks for IMAGE_GUEST (its init runs built images). */
  images: (image: string) => Promise<FirecrackerImage>;
  network: NetOptions;
  guestAgentPort?: number;
  workloadPort?: number;
  bootTimeoutMs?: number;
  /** How long a restored guest may take until its agent answers. */
  restoreTimeoutMs?: number;
  /** Diff snapshots (dirty page tracking): only pages written since the restore are written on hibernate. */
  diffSnapshots?: boolean;
  /** Hash both snapshot files before a restore (sha256: measured ≈145 ms per 256 MiB from the page cache). */
  verifyChecksums?: boolean;
  /** Send `clock_realtime: true` on load (the guest agent still sets and verifies the clock afterwards). */
  clockRealtime?: boolean;
  clockTargetMs?: number;
  extraBootArgs?: string;
  stopGraceMs?: number;
  /** How long a hibernation waits for the guest to flush a built image's disk (SYNC) before it snapshots anyway. */
  syncTimeoutMs?: number;
  /** Host check overrides (tests): /dev/kvm path, /proc/cpuinfo path, kernel release. */
  hostCheck?: Omit<HostCheckOptions, "binary">;
  /** Run each Firecracker under the jailer (chroot, own uid/gid, seccomp as shipped). */
  jailer?: JailerOptions;
  logger?: Logger;
  /** Tests: called after each step of restoreCheckpoint (a test kills the process there, as a crash would). */
  restoreCheckpointStep?: (step: string) => Promise<void> | void;
  /**
   * Warm templates (common/templates.ts), kept under `root`: a new VM starts as a clone of a checkpoint of a VM of its
   * kind booted earlier. A built image's VM only under the jailer (its drives' paths are the same in every chroot).
   */
  templates?: { root: string };
}

export interface JailerOptions {
  binary: string;
  uid: number;
  gid: number;
  /** Extra jailer arguments before `--`, e.g. ["--cgroup-version", "2", "--netns", "/var/run/netns/x"]. */
  extraArgs?: string[];
}

/** Firecracker's own boot arguments for a serial console, reboot = exit, and no PCI probing. */
export const BASE_BOOT_ARGS = "console=ttyS0 reboot=k panic=1 pci=off";
export const GUEST_CID = 3;
/** The guest image (kernel and initramfs) a built image's VM boots: the demo's, whose init also runs images. */
export const IMAGE_GUEST = "demo";
const SYNC_TIMEOUT_MS = 10_000;
const LOAD_OPTIONAL_FIELDS = ["clock_realtime", "network_overrides", "track_dirty_pages"] as const;

/**
 * Where a VM's files are. `root` holds everything the Firecracker process touches: the stateDir itself, or
 * under the jailer the chroot `<stateDir>/jail/<exec-file>/<id>/root`. `vm()` gives a host path as the
 * Firecracker process sees it (inside the chroot: relative to `root`, from "/").
 */
export interface VmPaths {
  root: string;
  apiSock: string;
  vsock: string;
  snapDir: string;
  /** Outside the chroot: console log and the pid file (pid + a command-line marker unique to this VM). */
  log: string;
  pidFile: string;
  marker: string;
  vm(hostPath: string): string;
}

interface Live {
  vm: RunningVm;
  /** Firecracker's process: the child, or under a forking jailer the one it wrote into the chroot (polled). */
  proc: VmProcess;
  poller: NodeJS.Timeout | undefined;
  api: FirecrackerClient;
  paths: VmPaths;
  net: VmNet;
  agent: GuestAgentClient | undefined;
  /** Generation this process was restored from with dirty tracking on: the base a Diff snapshot applies to. */
  diffBase: number | undefined;
  /** A built image's VM: its drives as Firecracker was given them (recorded in its snapshots). */
  drives: Drive[] | undefined;
}

export class FirecrackerDriver implements VmDriver {
  readonly name = "firecracker" as const;
  readonly isolated = true;
  private readonly opts: FirecrackerDriverOptions;
  private readonly binary: string;
  private readonly log: Logger;
  private readonly live = new Map<string, Live>();
  private readonly processes = new VmProcesses();
  private host: FirecrackerHostFacts | undefined;
  /** Optional load fields this firecracker rejected as unknown: not sent again. */
  private readonly unsupportedLoadFields = new Set<string>();
  /** Warm templates new VMs are cloned from (FirecrackerDriverOptions.templates). */
  readonly templates: VmTemplates | undefined;

  constructor(opts: FirecrackerDriverOptions) {
    this.opts = opts;
    this.binary = opts.binary ?? "firecracker";
    this.log = (opts.logger ?? silentLogger).child({ driver: "firecracker" });
    if (opts.templates) {
      this.templates = new VmTemplates({
        root: opts.templates.root,
        log: this.log.child({ part: "templates" }),
        boot: async (spec) => (await this.coldBoot(spec, performance.now())).vm,
        checkpoint: (spec, vm, dir) => this.checkpoint(spec, vm, dir),
        destroy: (spec) => this.destroy(spec),
        environment: (spec) => this.templateEnvironment(spec),
      });
    }
  }

  /** The readiness check (cached once it passes): refuses with a FirecrackerHostError naming what is missing. */
  async ready(): Promise<FirecrackerHostFacts> {
    this.host ??= await checkFirecrackerHost({ binary: this.binary, ...this.opts.hostCheck, ...(this.opts.jailer ? { jailer: this.opts.jailer.binary } : {}) });
    return this.host;
  }

  /** The file layout of one VM (depends on whether the jailer is used). */
  paths(spec: VmSpec): VmPaths {
    return vmPaths(resolve(spec.stateDir), this.opts.jailer ? { execFile: basename(this.binary), id: firecrackerId(spec.vmId) } : undefined);
  }

  /** A clone of the template of its kind when one is usable (its wake gives it its identity), else a cold boot. */
  async boot(spec: VmSpec): Promise<BootResult> {
    const started = performance.now();
    await this.ready(); // a host that cannot run Firecracker refuses before any template is looked at
    const template = await this.usableTemplate(spec).catch((err: unknown) => void this.log.warn("no template", { vmId: spec.vmId, err }));
    if (template) {
      try {
        await this.restoreCheckpoint(spec, template.dir);
        const woke = await this.wake(spec); // a load that fails boots cold there (restore-or-boot.ts)
        const bootMs = performance.now() - started;
        this.log.info("cloned from a template", { vmId: spec.vmId, template: template.key, mode: woke.mode, fallbackReason: woke.fallbackReason, bootMs: Math.round(bootMs) });
        return { vm: woke.vm, bootMs, ...(woke.mode === "restore" ? { template: template.key } : {}) };
      } catch (err) {
        this.log.warn("clone from a template failed; booting cold", { vmId: spec.vmId, template: template.key, err });
        const live = this.live.get(spec.vmId);
        if (live) await this.kill(live);
        await this.reap(spec);
      } finally {
        // This VM holds the template's network slot now (restored or not): the next clone needs a template of its own.
        void this.templates!.renew(spec).catch((err: unknown) => this.log.warn("template renewal not started", { vmId: spec.vmId, err }));
      }
    }
    return this.coldBoot(spec, started);
  }

  /**
   * The ready template for VMs like `spec` whose network slot is free (its guest's address is in its memory), or
   * undefined: none yet (one is built in the background), none for a built image outside the jailer, or its slot
   * taken (a new one is built).
   */
  private async usableTemplate(spec: VmSpec): Promise<{ key: string; dir: string } | undefined> {
    if (!this.templates || (spec.rootImage && !this.opts.jailer)) return undefined;
    const template = await this.templates.take(spec);
    if (!template) return undefined;
    const { manifest: c, problem } = await readCheckpoint(template.dir);
    if (!c) throw new Error(`template ${template.key} is unreadable: ${problem ?? "no manifest"}`);
    const holder = await slotOwner(this.opts.network, c.net.slot);
    if (holder === undefined) return template;
    this.log.info("template's network slot is taken; booting cold, building a new template", { vmId: spec.vmId, template: template.key, slot: c.net.slot, holder });
    await this.templates.renew(spec);
    return undefined;
  }

  /** What a template depends on besides the spec: the Firecracker release and host facts, the guest's files, boot arguments. */
  private async templateEnvironment(spec: VmSpec): Promise<string> {
    const host = await this.ready();
    const image = await this.opts.images(spec.rootImage ? IMAGE_GUEST : spec.image);
    const files = await Promise.all(
      [image.kernel, image.initrd, image.rootfs].map(async (path) => {
        if (!path) return null;
        const st = await stat(path);
        return [path, st.size, st.mtimeMs];
      }),
    );
    const { firecrackerVersion, snapshotFormat, cpu, hostKernel } = host;
    return JSON.stringify([firecrackerVersion, snapshotFormat, cpu, hostKernel, files, image.bootArgs ?? null, this.opts.extraBootArgs ?? null, !!this.opts.jailer, !!this.opts.diffSnapshots]);
  }

  /** Boots the VM from its kernel (no template). */
  private async coldBoot(spec: VmSpec, started: number): Promise<BootResult> {
    await this.ready();
    const image = await this.opts.images(spec.rootImage ? IMAGE_GUEST : spec.image);
    if (spec.rootImage && image.rootfs) throw new Error(`guest image "${IMAGE_GUEST}" has a root drive: a built image needs the initramfs as the root (its init mounts the image)`);
    const net = await this.prepareNet(spec);
    // A built image's disk (made on its first boot) starts a new generation: no earlier snapshot pairs with it now.
    const files = spec.rootImage ? await this.prepareImageFiles(spec, "boot") : undefined;
    if (files) await beginDiskGeneration(files.disk);
    // The init's lines on the console (an entrypoint that exited, a drive that would not mount) end the wait at once.
    const consoleWatch = files ? new ConsoleWatch(this.paths(spec).log) : undefined;
    const live = await this.spawn(spec, net);
    const { api, paths } = live;
    try {
      await api.putMachineConfig({
        vcpu_count: spec.vcpus,
        mem_size_mib: spec.memMiB,
        smt: false,
        ...(this.opts.diffSnapshots ? { track_dirty_pages: true } : {}),
      });
      const bootArgs = [BASE_BOOT_ARGS, kernelIpArg(net), image.bootArgs, this.opts.extraBootArgs].filter(Boolean).join(" ");
      const kernel = await this.visible(paths, image.kernel, "vmlinux");
      const initrd = image.initrd ? await this.visible(paths, image.initrd, "initrd") : undefined;
      await api.putBootSource({ kernel_image_path: kernel, ...(initrd ? { initrd_path: initrd } : {}), boot_args: bootArgs });
      if (image.rootfs) await api.putDrive({ drive_id: "rootfs", is_root_device: true, path_on_host: await this.visible(paths, image.rootfs, "rootfs"), is_read_only: true });
      if (files) {
        live.drives = imageDrives(await this.stage(spec, paths, files));
        for (const drive of live.drives) await api.putDrive(drive);
      }
      await api.putNetworkInterface({ iface_id: "eth0", host_dev_name: net.tap, guest_mac: net.mac });
      await api.putVsock({ guest_cid: GUEST_CID, uds_path: paths.vm(paths.vsock) });
      await api.action("InstanceStart");
      const config = await api.vmConfig();
      const mc = config["machine-config"];
      if (mc && (mc.vcpu_count !== spec.vcpus || mc.mem_size_mib !== spec.memMiB)) {
        throw new Error(`firecracker reports ${mc.vcpu_count} vCPU / ${mc.mem_size_mib} MiB, asked for ${spec.vcpus} / ${spec.memMiB}`);
      }
      const deadline = started + (this.opts.bootTimeoutMs ?? 30_000);
      const gaveUp = () => {
        const said = consoleWatch?.failure();
        return said ? `the image's ${said}` : live.proc.exitedWhy("firecracker");
      };
      live.agent = await waitForGuestAgent(paths.vsock, this.agentPort, { deadlineMs: deadline - performance.now(), gaveUp });
      if (spec.rootImage) await waitImageReady(live.vm.endpoint, spec.rootImage.config, { deadline, gaveUp });
      else await waitForHttp(live.vm.endpoint, { deadline, gaveUp });
    } catch (err) {
      await this.kill(live);
      if (consoleWatch) {
        // What the init said is the reason, whichever wait noticed it first.
        const said = consoleWatch.failure();
        const reason = said ? `the image's ${said}` : (err as Error).message;
        const tail = consoleWatch.tail();
        throw new AppError("boot_failed", `agent ${spec.agentId} did not boot: ${reason}${tail ? ` (console: ${tail})` : ""}`, { cause: err });
      }
      throw withLogTail(new Error(`firecracker boot of ${spec.vmId} failed: ${(err as Error).message}`, { cause: err }), paths.log, "firecracker log");
    }
    this.log.info("firecracker vm booted", { vmId: spec.vmId, pid: live.vm.pid, ...(spec.rootImage ? { image: spec.rootImage.digest } : {}), bootMs: Math.round(performance.now() - started) });
    return { vm: live.vm, bootMs: performance.now() - started };
  }

  async hibernate(vm: RunningVm, signal?: AbortSignal): Promise<SnapshotResult> {
    const started = performance.now();
    const live = this.owned(vm);
    const cancelled = (): SnapshotResult => ({ completed: false, snapshotMs: performance.now() - started, bytes: 0 });
    if (signal?.aborted) return cancelled();
    const host = await this.ready();
    const { api, paths } = live;
    // The memory file is all of guest memory: one that would not fit is refused before the guest is paused.
    const neededBytes = snapshotBytesNeeded(vm.spec.memMiB);
    const freeBefore = await ensureSnapshotSpace(paths.snapDir, neededBytes);
    if (vm.spec.rootImage) {
      // What the agent wrote reaches its disk before the memory that holds it is frozen (a cold boot finds it there).
      await this.syncGuest(live);
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
    if (this.opts.diffSnapshots && previous && live.diffBase === previous.generation) {
      // A diff writes only dirtied pages: it goes onto a copy of the memory this process was restored from.
      await copyFile(join(paths.snapDir, previous.mem.file), files.memTmp, constants.COPYFILE_FICLONE);
      if (this.opts.jailer) await chown(files.memTmp, this.opts.jailer.uid, this.opts.jailer.gid);
      type = "Diff";
    }
    try {
      await api.createSnapshot({ snapshot_type: type, snapshot_path: paths.vm(files.stateTmp), mem_file_path: paths.vm(files.memTmp) });
    } catch (err) {
      live.diffBase = undefined; // the dirty bitmap may have been reset: the next snapshot must be Full
      await discardGeneration(paths.snapDir, generation);
      await api.resume().catch((resumeErr: unknown) => {
        // Never left paused for the host to believe it runs: ended, and reported as a crash through onExit.
        this.log.error("could not resume the VM after a failed snapshot; killing it", { vmId: vm.spec.vmId, err: resumeErr });
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
        image = { digest: vm.spec.rootImage.digest, drives: live.drives ?? [], disk: await this.pausedDisk(vm.spec) };
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
    await this.kill(live);
    await removeStaleSnapshotFiles(paths.snapDir);
    const bytes = manifest.state.bytes + manifest.mem.bytes;
    this.log.info("firecracker vm hibernated", { vmId: vm.spec.vmId, generation, type, bytes, snapshotMs: Math.round(performance.now() - started) });
    return { completed: true, snapshotMs: performance.now() - started, bytes };
  }

  async wake(spec: VmSpec): Promise<WakeResult> {
    const started = performance.now();
    const host = await this.ready();
    return restoreOrBoot({
      spec,
      log: this.log,
      started,
      clockTargetMs: this.opts.clockTargetMs ?? 50,
      restore: (undo) => this.restore(spec, host, undo),
      boot: () => this.coldBoot(spec, performance.now()),
    });
  }

  /** The snapshot, if usable, loaded into a new Firecracker; RestoreFailed when a cold boot is the way out. */
  private async restore(spec: VmSpec, host: FirecrackerHostFacts, undo: (step: () => Promise<void>) => void): Promise<Restored> {
    const paths = this.paths(spec);
    await removeStaleSnapshotFiles(paths.snapDir);
    const { manifest, problem } = await readManifest(paths.snapDir);
    if (!manifest) throw new RestoreFailed(problem ?? "no snapshot");
    const bad = incompatibility(manifest, host, spec) ?? (await verifyFiles(paths.snapDir, manifest, { checksums: this.opts.verifyChecksums ?? true }));
    if (bad) throw new RestoreFailed(bad);
    const drives = manifest.image ? await this.restorableDrives(spec, paths, manifest.image) : undefined;

    const net = await this.prepareNet(spec);
    // The guest's address is in its memory (init.sh applied the boot's `ip=` once): only its own slot carries it.
    if (manifest.guestIp && manifest.guestIp !== net.guestIp) {
      throw new RestoreFailed(`the snapshot's guest has address ${manifest.guestIp}, this VM's network slot gives ${net.guestIp} (a restored guest cannot be re-addressed)`);
    }
    const live = await this.spawn(spec, net);
    live.drives = drives;
    undo(() => this.kill(live));
    try {
      await this.load(live, manifest);
    } catch (err) {
      const why = err instanceof FirecrackerApiError ? err.faultMessage : (err as Error).message;
      throw new RestoreFailed(`firecracker refused the snapshot: ${why}`, { cause: err });
    }
    if (this.opts.diffSnapshots) live.diffBase = manifest.generation;
    const deadlineMs = this.opts.restoreTimeoutMs ?? 10_000;
    const clonedFrom = manifest.clonedFrom;
    return {
      vm: live.vm,
      detail: { generation: manifest.generation, ...(clonedFrom ? { clonedFrom } : {}) },
      guestAgent: async () => {
        const agent = await waitForGuestAgent(live.paths.vsock, this.agentPort, { deadlineMs, gaveUp: () => live.proc.exitedWhy("firecracker") });
        live.agent = agent;
        // A copy of another moment's memory: its RNG state, hostname and id are the checkpoint's until told otherwise.
        if (clonedFrom) await agent.identity({ agentId: spec.agentId, hostname: guestHostname(spec.agentId), entropy: randomBytes(32), clonedFrom });
        return agent;
      },
    };
  }

  /**
   * An immutable copy of the VM (checkpoint.ts). A running one is paused for a Full snapshot into temporary files of
   * its snapshot directory (where the Firecracker process may write, jailed or not) and, with a built image, for a
   * copy of its disk (a reflink where the filesystem has them); it then runs on with its clock fixed. The files are
   * checksummed and moved into the checkpoint after the resume. A hibernated one is copied from its snapshot, once
   * its files still pair (checksums, the disk's fingerprint): AppError `conflict` otherwise.
   */
  async checkpoint(spec: VmSpec, vm: RunningVm | undefined, dir: string): Promise<CheckpointInfo> {
    const started = performance.now();
    if (existsSync(dir)) throw new Error(`checkpoint directory ${dir} exists`);
    const host = await this.ready();
    const paths = this.paths(spec);
    const tmp = `${dir}.tmp-${randomBytes(4).toString("hex")}`;
    const out = checkpointFiles(tmp);
    await mkdir(tmp, { recursive: true });
    try {
      const copies: CopyKind[] = [];
      let pausedMs = 0;
      let taken: Pick<CheckpointManifest, "net" | "vsock" | "takenOf" | "sourceGeneration"> & { state: { sha256: string; bytes: number }; mem: { sha256: string; bytes: number }; drives?: Drive[] };
      if (vm) {
        const live = this.owned(vm);
        const neededBytes = snapshotBytesNeeded(spec.memMiB);
        const freeBefore = await ensureSnapshotSpace(paths.snapDir, neededBytes);
        if (spec.rootImage) await this.syncGuest(live);
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
            await this.pausedDisk(spec);
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
            this.log.error("could not resume the VM after a checkpoint; killing it", { vmId: spec.vmId, err: resumeErr });
            live.proc.signal("SIGKILL");
          });
          pausedMs = performance.now() - pausedAt;
        }
        await this.fixClockAfterPause(live);
        copies.push("copy"); // Firecracker wrote every byte of guest memory
        for (const [from, to] of [[written.state, out.state], [written.mem, out.mem]] as const) {
          const moved = await moveFile(from, to);
          if (moved) copies.push(moved);
        }
        const [state, mem] = await Promise.all([sha256File(out.state), sha256File(out.mem)]);
        await fsyncPath(out.state);
        await fsyncPath(out.mem);
        taken = { net: live.net, vsock: paths.vm(paths.vsock), takenOf: "running", state, mem, ...(live.drives ? { drives: live.drives } : {}) };
      } else {
        if (this.live.has(spec.vmId)) throw new Error(`VM ${spec.vmId} is running: checkpoint it with its RunningVm`);
        const noState = (why: string) => new AppError("conflict", `agent ${spec.agentId} has no state to checkpoint: ${why}`);
        const { manifest, problem } = await readManifest(paths.snapDir);
        if (!manifest) throw noState(problem ?? "it has no snapshot");
        const bad = incompatibility(manifest, host, spec) ?? (await verifyFiles(paths.snapDir, manifest, { checksums: true }));
        if (bad) throw noState(bad);
        if (manifest.image) {
          const changed = diskChange(manifest.image.disk, await diskFingerprint(agentDiskPath(resolve(spec.stateDir))).catch((): DiskFingerprint | undefined => undefined));
          if (changed) throw noState(changed);
        }
        const net = await recordedNet(spec.stateDir);
        if (!net) throw noState("its network slot is not recorded");
        if (manifest.guestIp && manifest.guestIp !== net.guestIp) throw noState(`its snapshot's guest has address ${manifest.guestIp}, not its slot's ${net.guestIp}`);
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
      this.log.info("checkpoint taken", { vmId: spec.vmId, dir, takenOf: taken.takenOf, bytes: totalBytes, copy, pausedMs: Math.round(pausedMs * 10) / 10, ms: Math.round(ms) });
      return { bytes: totalBytes, pausedMs, ms, copy };
    } catch (err) {
      await rm(tmp, { recursive: true, force: true });
      throw err;
    }
  }

  /**
   * Makes the stateDir a hibernated VM whose snapshot is the checkpoint (checkpoint.ts): the old manifest is removed
   * first (from then on a crash leaves no snapshot: the next wake boots cold, over the disk as it is), the files are
   * copied in under temporary names (reflinks where they can be), a built image's disk replaced by the checkpoint's
   * (a new generation), and the manifest that names them and says `clonedFrom` is the commit point. A new agent (a
   * fork) asks for the checkpoint's network slot: its guest's address is in the memory (net.ts `preferNet`).
   */
  async restoreCheckpoint(spec: VmSpec, dir: string): Promise<void> {
    if (this.live.has(spec.vmId)) throw new Error(`VM ${spec.vmId} is running: stop it before restoring a checkpoint into it`);
    const host = await this.ready();
    const name = basename(dir);
    const { manifest: c, problem } = await readCheckpoint(dir);
    if (!c) throw new AppError("conflict", `checkpoint ${name} cannot be used: ${problem ?? "no manifest"}`);
    const from = checkpointFiles(dir);
    const diskBytes = c.disk ? await stat(from.disk).then((st) => st.size, () => -1) : 0;
    const bad =
      checkpointMismatch(c, host, spec) ??
      (await verifyFiles(dir, c, { checksums: true })) ??
      (c.disk && diskBytes !== c.disk.bytes ? `its disk has ${diskBytes < 0 ? "gone" : `${diskBytes} bytes, the manifest says ${c.disk.bytes}`}` : undefined);
    if (bad) throw new AppError("conflict", `checkpoint ${name} does not fit agent ${spec.agentId}: ${bad}`);
    const step = async (what: string) => this.opts.restoreCheckpointStep?.(what);
    const paths = this.paths(spec);
    await killLeftover(paths.pidFile);
    await mkdir(paths.snapDir, { recursive: true });
    await rm(join(paths.snapDir, MANIFEST_FILE), { force: true });
    await fsyncPath(paths.snapDir);
    await step("manifest removed");
    await removeStaleSnapshotFiles(paths.snapDir); // no manifest: every earlier generation goes
    const generation = 1;
    const f = generationFiles(paths.snapDir, generation);
    const owned = async (path: string) => this.opts.jailer && (await chown(path, this.opts.jailer.uid, this.opts.jailer.gid));
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
    this.log.info("checkpoint restored into a VM", { vmId: spec.vmId, checkpoint: name });
  }

  /** The templates of FirecrackerDriverOptions.templates (none when they are off); the host drops their paths before the API sees them. */
  async listTemplates(): Promise<DriverTemplate[]> {
    return (await this.templates?.list()) ?? [];
  }

  async guestCheckpointRequests(vm: RunningVm): Promise<string[]> {
    return this.askAgent(this.owned(vm), (agent) => agent.checkpointRequests());
  }

  /** One request to the guest agent over its (re)opened vsock channel; a failed channel is reopened and asked once more. */
  private async askAgent<T>(live: Live, ask: (agent: GuestAgentClient) => Promise<T>): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      try {
        live.agent ??= await waitForGuestAgent(live.paths.vsock, this.agentPort, { deadlineMs: 2000, gaveUp: () => live.proc.exitedWhy("firecracker") });
        return await ask(live.agent);
      } catch (err) {
        live.agent?.close();
        live.agent = undefined;
        if (attempt >= 1) throw err;
      }
    }
  }

  /** After a pause the guest's clock is behind by it (as after a wake): reconnected and set; a failure is logged only. */
  private async fixClockAfterPause(live: Live): Promise<void> {
    try {
      live.agent = await waitForGuestAgent(live.paths.vsock, this.agentPort, { deadlineMs: this.opts.restoreTimeoutMs ?? 10_000, gaveUp: () => live.proc.exitedWhy("firecracker") });
      const clock = await fixGuestClock(live.agent, { targetMs: this.opts.clockTargetMs ?? 50, sameNetwork: true }); // the same process
      this.log.debug("guest clock fixed after a pause", { vmId: live.vm.spec.vmId, ...clock });
    } catch (err) {
      this.log.warn("could not fix the guest clock after a checkpoint", { vmId: live.vm.spec.vmId, err });
    }
  }

  async stop(vm: RunningVm): Promise<void> {
    const live = this.live.get(vm.spec.vmId);
    if (!live) return;
    live.agent?.close();
    live.agent = undefined;
    // Ctrl-Alt-Del makes the guest reboot, which with reboot=k ends Firecracker; a hung guest gets SIGKILL.
    await live.proc.stop(() => live.api.action("SendCtrlAltDel"), this.opts.stopGraceMs ?? 1000);
    await this.kill(live);
  }

  async destroy(spec: VmSpec): Promise<void> {
    const live = this.live.get(spec.vmId);
    if (live) await this.kill(live);
    await this.reap(spec);
    const net = await recordedNet(spec.stateDir);
    if (net && this.opts.network.setupScript) {
      await runNetScript(this.opts.network.setupScript, "down", net, { allowEgress: false, uplink: this.opts.network.uplink }).catch((err: Error) =>
        this.log.warn("tap removal failed", { vmId: spec.vmId, error: err.message }),
      );
    }
    await releaseNet(this.opts.network, spec.stateDir, spec.vmId);
    // The stateDir holds everything of the VM: snapshots, a built image's disk and launch drive, the jailer's chroot.
    await rm(spec.stateDir, { recursive: true, force: true });
  }

  async cpuSeconds(vm: RunningVm): Promise<number> {
    return this.live.get(vm.spec.vmId)?.proc.cpuSeconds() ?? 0; // not running here: nothing is using CPU for it
  }

  async guestLeases(vm: RunningVm): Promise<number> {
    return this.askAgent(this.owned(vm), (agent) => agent.leases());
  }

  onExit(vm: RunningVm, listener: (exit: VmExit) => void): void {
    this.processes.onExit(vm, listener);
  }

  logPath(spec: VmSpec): string {
    return processFiles(spec.stateDir, "firecracker").log;
  }

  async reap(spec: VmSpec): Promise<void> {
    if (this.live.has(spec.vmId)) return;
    const paths = this.paths(spec);
    await killLeftover(paths.pidFile);
    rmSync(paths.apiSock, { force: true });
    rmSync(paths.vsock, { force: true });
    await removeStaleSnapshotFiles(paths.snapDir);
  }

  /** Ends every VM this driver started (fleet-agent shutdown without hibernation). */
  async close(): Promise<void> {
    await Promise.all([...this.live.values()].map((l) => this.kill(l)));
  }

  private get agentPort(): number {
    return this.opts.guestAgentPort ?? 1024;
  }

  private owned(vm: RunningVm): Live {
    const live = this.live.get(vm.spec.vmId);
    if (!live) throw new Error(`no running firecracker process for ${vm.spec.vmId}`);
    return live;
  }

  private async prepareNet(spec: VmSpec): Promise<VmNet> {
    await mkdir(spec.stateDir, { recursive: true });
    const net = await claimNet(this.opts.network, spec.stateDir, spec.vmId);
    if (this.opts.network.setupScript) {
      await runNetScript(this.opts.network.setupScript, "up", net, { allowEgress: spec.allowEgress, uplink: this.opts.network.uplink });
    }
    return net;
  }

  private async spawn(spec: VmSpec, net: VmNet): Promise<Live> {
    if (this.live.has(spec.vmId)) throw new Error(`${spec.vmId} already runs (pid ${this.live.get(spec.vmId)!.proc.pid}): stop or hibernate it first`);
    const paths = this.paths(spec);
    checkSocketPath(paths.apiSock);
    checkSocketPath(paths.vsock);
    await killLeftover(paths.pidFile);
    const jailer = this.opts.jailer;
    if (jailer) {
      // The jailer makes /dev and /run in the chroot itself and refuses to find them there already.
      await rm(join(paths.root, "dev"), { recursive: true, force: true });
      await rm(join(paths.root, "run"), { recursive: true, force: true });
      await rm(join(paths.root, "firecracker.pid"), { force: true });
    }
    await mkdir(paths.snapDir, { recursive: true });
    if (jailer) await chown(paths.snapDir, jailer.uid, jailer.gid);
    // Firecracker refuses to bind over existing socket files.
    rmSync(paths.apiSock, { force: true });
    rmSync(paths.vsock, { force: true });
    const [command, args] = jailer
      ? [
          jailer.binary,
          [
            "--id", firecrackerId(spec.vmId),
            "--exec-file", resolveOnPath(this.binary),
            "--uid", String(jailer.uid),
            "--gid", String(jailer.gid),
            "--chroot-base-dir", resolve(spec.stateDir, "jail"),
            ...(jailer.extraArgs ?? []),
            "--", "--api-sock", paths.vm(paths.apiSock),
          ],
        ]
      : [this.binary, ["--api-sock", paths.apiSock, "--id", firecrackerId(spec.vmId)]];
    // A jailer may fork Firecracker and exit 0 at once: its exit is then not the VM's (watched below).
    const proc = VmProcess.spawn({ vmId: spec.vmId, command, args, log: paths.log, cwd: spec.stateDir, childIsVm: !jailer });
    const api = new FirecrackerClient(paths.apiSock);
    const live: Live = {
      vm: { spec, endpoint: { host: net.guestIp, port: spec.rootImage?.config.port ?? this.opts.workloadPort ?? 8080 }, pid: proc.pid },
      proc,
      api,
      paths,
      net,
      agent: undefined,
      diffBase: undefined,
      poller: undefined,
      drives: undefined,
    };
    proc.onEnd((exit) => {
      if (live.poller) clearInterval(live.poller);
      live.agent?.close();
      live.agent = undefined;
      void api.close();
      if (this.live.get(spec.vmId) === live) this.live.delete(spec.vmId);
      if (readPidFile(paths.pidFile)?.pid === proc.pid) rmSync(paths.pidFile, { force: true });
      if (proc.crashed) this.log.warn("firecracker process exited unexpectedly", { vmId: spec.vmId, ...exit });
    });
    // Until the jailer's child is known, only a failing jailer is an exit.
    let pidKnown = !jailer;
    let earlyExit: VmExit | undefined;
    if (jailer) {
      proc.child.once("exit", (code, sig) => {
        if (pidKnown ? proc.pid === proc.child.pid : code !== 0) proc.end({ code, signal: sig });
        else if (!pidKnown) earlyExit = { code, signal: sig };
      });
    }
    if (proc.pid === undefined) {
      await proc.exited;
      throw new Error(`cannot start ${command}: ${proc.spawnError?.message ?? "spawn failed"}`);
    }
    this.live.set(spec.vmId, live);
    try {
      await waitForApi(api, 5000, () => proc.exitedWhy("firecracker"));
      // The jailer may fork: Firecracker's own pid is then in <root>/firecracker.pid, and its exit is polled.
      const jailedPid = jailer ? Number(readFileSync(join(paths.root, "firecracker.pid"), "utf8").trim()) : undefined;
      pidKnown = true;
      if (jailedPid === proc.child.pid && earlyExit) proc.end(earlyExit);
      if (jailedPid && jailedPid !== proc.child.pid) {
        proc.adopt(jailedPid);
        live.vm.pid = jailedPid;
        live.poller = setInterval(() => processAlive(jailedPid, paths.marker) || proc.end({ code: null, signal: null }), 250);
        live.poller.unref();
      }
    } catch (err) {
      proc.stopping = true;
      pidKnown = true;
      if (earlyExit) proc.end(earlyExit); // the jailer is gone; what it may have forked is unknown
      await this.kill(live);
      throw withLogTail(new Error(`firecracker API did not come up: ${(err as Error).message}`, { cause: err }), paths.log, "firecracker log");
    }
    this.processes.add(proc);
    writePidFile(paths.pidFile, proc.pid!, paths.marker);
    return live;
  }

  /**
   * A built image's drive files on the host: its disk (created on the first boot) and the launch drive, made afresh
   * for a boot. A restore only needs the launch drive to be there (the guest read it at boot; Firecracker reopens it),
   * so the one from the boot is kept: making it costs 20–40 ms of every wake.
   */
  private async prepareImageFiles(spec: VmSpec, purpose: "boot" | "restore"): Promise<ImageDriveFiles> {
    const image = spec.rootImage!;
    const stateDir = resolve(spec.stateDir); // Firecracker runs in the stateDir: every path it is given is absolute
    const disk = await ensureAgentDisk(stateDir, spec.diskMiB ?? DEFAULT_DISK_MIB, this.log.child({ vmId: spec.vmId }));
    const kept = join(stateDir, LAUNCH_DRIVE_FILE);
    const launch = purpose === "restore" && existsSync(kept) ? kept : await makeLaunchDrive(stateDir, image.config, { agentId: spec.agentId, port: image.config.port });
    return { image: resolve(image.rootfs), disk, launch };
  }

  /** The drive files where the Firecracker process opens them (in the jailer's chroot, when jailed). */
  private stage(spec: VmSpec, paths: VmPaths, files: ImageDriveFiles): Promise<ImageDriveFiles> {
    const jailer = this.opts.jailer;
    return stageImageFiles(files, { root: paths.root, vm: paths.vm, imageDigest: spec.rootImage!.digest, ...(jailer ? { jailer: { uid: jailer.uid, gid: jailer.gid } } : {}) });
  }

  /**
   * A built image's snapshot is loadable only over the disk it was taken with, and with every drive file at the path
   * the snapshot names (Firecracker reopens them itself). RestoreFailed otherwise: a cold boot then uses the disk as
   * it is. Passing, the disk starts a new generation, since the restored guest writes to it from now on.
   */
  private async restorableDrives(spec: VmSpec, paths: VmPaths, recorded: SnapshotImage): Promise<Drive[]> {
    const disk = agentDiskPath(resolve(spec.stateDir));
    const changed = diskChange(recorded.disk, await diskFingerprint(disk).catch((): DiskFingerprint | undefined => undefined));
    if (changed) throw new RestoreFailed(changed);
    const rootfs = spec.rootImage!.rootfs;
    if (!existsSync(rootfs)) throw new RestoreFailed(`the image's root filesystem ${rootfs} is missing`);
    const drives = imageDrives(await this.stage(spec, paths, await this.prepareImageFiles(spec, "restore")));
    const moved = drivesChange(recorded.drives, drives);
    if (moved) throw new RestoreFailed(moved);
    await beginDiskGeneration(disk);
    return drives;
  }

  /** Asks the guest to flush its disks (SYNC); a failure is logged, not fatal: the snapshot still pairs memory and disk. */
  private async syncGuest(live: Live): Promise<void> {
    const t0 = performance.now();
    try {
      live.agent ??= await waitForGuestAgent(live.paths.vsock, this.agentPort, { deadlineMs: 2000, gaveUp: () => live.proc.exitedWhy("firecracker") });
      await live.agent.sync(this.opts.syncTimeoutMs ?? SYNC_TIMEOUT_MS);
      this.log.debug("guest synced", { vmId: live.vm.spec.vmId, ms: Math.round(performance.now() - t0) });
    } catch (err) {
      this.log.warn("guest sync before the snapshot failed; snapshotting anyway", { vmId: live.vm.spec.vmId, err });
    }
  }

  /** The disk as the paused guest left it: on stable storage before a manifest pairs memory with it, and its fingerprint. */
  private async pausedDisk(spec: VmSpec): Promise<DiskFingerprint> {
    const disk = agentDiskPath(resolve(spec.stateDir));
    await fsyncPath(disk);
    return diskFingerprint(disk);
  }

  /** A file the Firecracker process must open: under the jailer it is linked (or copied) into the chroot. */
  private async visible(paths: VmPaths, hostPath: string, name: string): Promise<string> {
    if (!this.opts.jailer) return hostPath;
    const inside = join(paths.root, name);
    await rm(inside, { force: true });
    await link(hostPath, inside).catch(() => copyFile(hostPath, inside));
    await chown(inside, this.opts.jailer.uid, this.opts.jailer.gid);
    return paths.vm(inside);
  }

  /** PUT /snapshot/load; an optional field this firecracker does not know is dropped and the load retried once. */
  private async load(live: Live, manifest: SnapshotManifest): Promise<void> {
    const at = (file: string) => live.paths.vm(join(live.paths.snapDir, file));
    const files = { state: at(manifest.state.file), mem: at(manifest.mem.file) };
    for (;;) {
      const body: SnapshotLoadParams = {
        snapshot_path: files.state,
        mem_backend: { backend_type: "File", backend_path: files.mem },
        resume_vm: true,
      };
      if (this.opts.diffSnapshots) body.track_dirty_pages = true;
      if (this.opts.clockRealtime ?? true) body.clock_realtime = true;
      if (manifest.tap && manifest.tap !== live.net.tap) body.network_overrides = [{ iface_id: "eth0", host_dev_name: live.net.tap }];
      // A checkpoint's state names its source's vsock socket: this VM's is bound instead (no retry without it).
      const vsock = live.paths.vm(live.paths.vsock);
      if (manifest.vsock && manifest.vsock !== vsock) body.vsock_override = { uds_path: vsock };
      for (const field of this.unsupportedLoadFields) delete (body as unknown as Record<string, unknown>)[field];
      try {
        await live.api.loadSnapshot(body);
        return;
      } catch (err) {
        const fault = err instanceof FirecrackerApiError ? err.faultMessage : "";
        const unknown = /unknown field/i.test(fault) ? LOAD_OPTIONAL_FIELDS.find((f) => f in body && fault.includes(f)) : undefined;
        if (!unknown) throw err;
        this.unsupportedLoadFields.add(unknown);
        this.log.warn("firecracker does not know a snapshot load field; retrying without it", { field: unknown });
        // A parse error leaves the process usable; if it ended anyway, the caller falls back to a cold boot.
        await sleep(50);
        if (live.proc.exit) throw err;
      }
    }
  }

  /** Ends the process (intentionally: no onExit) and waits for it. */
  private async kill(live: Live): Promise<void> {
    live.agent?.close();
    live.agent = undefined;
    await live.proc.kill();
    await live.api.close();
    rmSync(live.paths.apiSock, { force: true });
    rmSync(live.paths.vsock, { force: true });
  }
}

export function vmPaths(stateDir: string, jail?: { execFile: string; id: string }): VmPaths {
  const root = jail ? join(stateDir, "jail", jail.execFile, jail.id, "root") : stateDir;
  const apiSock = join(root, "fc.sock");
  const { pidFile, log } = processFiles(stateDir, "firecracker");
  return {
    root,
    apiSock,
    vsock: join(root, "vsock.sock"),
    snapDir: join(root, "snapshots"),
    log,
    pidFile,
    // Under the jailer every VM's socket is "/fc.sock": its --id is what is unique on the command line.
    marker: jail ? jail.id : apiSock,
    vm: jail ? (p) => `/${relative(root, p)}` : (p) => p,
  };
}

/** The jailer wants the firecracker binary as a path (and its file name must contain "firecracker"). */
function resolveOnPath(binary: string): string {
  if (binary.includes("/")) return resolve(binary);
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    const candidate = join(dir, binary);
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      /* not here */
    }
  }
  return binary;
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

/** Firecracker's `--id` allows alphanumerics and hyphens, up to 64 characters. */
export function firecrackerId(vmId: string): string {
  return vmId.replace(/[^A-Za-z0-9-]/g, "-").slice(0, 64);
}

/** Resolves once Firecracker's API socket answers. */
function waitForApi(api: FirecrackerClient, timeoutMs: number, gaveUp: () => string | undefined): Promise<void> {
  return pollUntil(() => api.describeInstance().then(() => true), { deadline: performance.now() + timeoutMs, gaveUp, timeout: `no answer within ${timeoutMs} ms` }).then(() => undefined);
}

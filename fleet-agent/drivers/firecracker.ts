// The `firecracker` driver: one Firecracker process per running VM, hibernated as a Firecracker snapshot.
//
// boot:      spawn `firecracker --api-sock` → machine-config, boot-source, eth0 on the VM's tap, vsock →
//            InstanceStart → guest agent answers over vsock → workload answers HTTP.
// hibernate: close the vsock connection (Firecracker resets them on snapshot anyway) → PATCH /vm Paused →
//            (abort? resume, completed:false) → PUT /snapshot/create to temporary files → (abort? resume and
//            discard) → fsync, checksum, rename, commit the manifest → kill the process.
// wake:      manifest compatible (firecracker release, snapshot format, CPU, host kernel, size) and files
//            intact → new process → PUT /snapshot/load {resume_vm, clock_realtime} → guest agent → clock fix.
//            Anything else → cold boot with `fallbackReason`. A refused load ends the Firecracker process
//            (documented behaviour); the driver expects that and boots cold.
import { spawn, type ChildProcess } from "node:child_process";
import { accessSync, constants, openSync, closeSync, readFileSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { chown, copyFile, link, mkdir, rm } from "node:fs/promises";
import { request } from "node:http";
import { basename, delimiter, join, relative, resolve } from "node:path";
import { silentLogger, type Logger } from "../../lib/log.ts";
import type { BootResult, RunningVm, SnapshotResult, VmDriver, VmExit, VmSpec, WakeResult } from "./driver.ts";
import { FirecrackerApiError, FirecrackerClient, type SnapshotLoadParams } from "./firecracker-api.ts";
import { checkFirecrackerHost, type FirecrackerHostFacts, type HostCheckOptions } from "./firecracker-host.ts";
import { claimNet, kernelIpArg, recordedNet, releaseNet, runNetScript, type NetOptions, type VmNet } from "./firecracker-net.ts";
import { processMatches, waitForProcessGone } from "./firecracker-proc.ts";
import { readCpuSeconds } from "./proc.ts";
import {
  commitSnapshot,
  discardGeneration,
  generationFiles,
  incompatibility,
  readManifest,
  removeStaleSnapshotFiles,
  verifyFiles,
  type SnapshotManifest,
} from "./firecracker-snapshot.ts";
import { fixGuestClock, type GuestAgentClient } from "./guest-agent.ts";
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
  /** Host check overrides (tests): /dev/kvm path, /proc/cpuinfo path, kernel release. */
  hostCheck?: Omit<HostCheckOptions, "binary">;
  /** Run each Firecracker under the jailer (chroot, own uid/gid, seccomp as shipped). */
  jailer?: JailerOptions;
  logger?: Logger;
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
  child: ChildProcess;
  /** Firecracker's pid: the child's, or under a forking jailer the one it wrote into the chroot. */
  pid: number | undefined;
  poller: NodeJS.Timeout | undefined;
  api: FirecrackerClient;
  paths: VmPaths;
  net: VmNet;
  agent: GuestAgentClient | undefined;
  /** Set before the driver ends the process itself: its exit is then no crash. */
  stopping: boolean;
  exit: VmExit | undefined;
  exited: Promise<VmExit>;
  exitListeners: ((e: VmExit) => void)[];
  /** Generation this process was restored from with dirty tracking on: the base a Diff snapshot applies to. */
  diffBase: number | undefined;
}

export class FirecrackerDriver implements VmDriver {
  readonly name = "firecracker" as const;
  readonly isolated = true;
  private readonly opts: FirecrackerDriverOptions;
  private readonly binary: string;
  private readonly log: Logger;
  private readonly live = new Map<string, Live>();
  private host: FirecrackerHostFacts | undefined;
  /** Optional load fields this firecracker rejected as unknown: not sent again. */
  private readonly unsupportedLoadFields = new Set<string>();

  constructor(opts: FirecrackerDriverOptions) {
    this.opts = opts;
    this.binary = opts.binary ?? "firecracker";
    this.log = opts.logger ?? silentLogger;
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

  async boot(spec: VmSpec): Promise<BootResult> {
    const started = performance.now();
    await this.ready();
    const image = await this.opts.images(spec.image);
    const net = await this.prepareNet(spec);
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
      await api.putNetworkInterface({ iface_id: "eth0", host_dev_name: net.tap, guest_mac: net.mac });
      await api.putVsock({ guest_cid: GUEST_CID, uds_path: paths.vm(paths.vsock) });
      await api.action("InstanceStart");
      const config = await api.vmConfig();
      const mc = config["machine-config"];
      if (mc && (mc.vcpu_count !== spec.vcpus || mc.mem_size_mib !== spec.memMiB)) {
        throw new Error(`firecracker reports ${mc.vcpu_count} vCPU / ${mc.mem_size_mib} MiB, asked for ${spec.vcpus} / ${spec.memMiB}`);
      }
      const deadline = started + (this.opts.bootTimeoutMs ?? 30_000);
      live.agent = await waitForGuestAgent(paths.vsock, this.agentPort, { deadlineMs: deadline - performance.now(), gaveUp: () => exitedWhy(live) });
      await waitForHttp(live.vm.endpoint, deadline, () => exitedWhy(live));
    } catch (err) {
      await this.kill(live);
      throw new Error(`firecracker boot of ${spec.vmId} failed: ${(err as Error).message}${logTail(paths.log)}`, { cause: err });
    }
    this.log.info("firecracker vm booted", { vmId: spec.vmId, pid: live.vm.pid, bootMs: Math.round(performance.now() - started) });
    return { vm: live.vm, bootMs: performance.now() - started };
  }

  async hibernate(vm: RunningVm, signal?: AbortSignal): Promise<SnapshotResult> {
    const started = performance.now();
    const live = this.owned(vm);
    const cancelled = (): SnapshotResult => ({ completed: false, snapshotMs: performance.now() - started, bytes: 0 });
    if (signal?.aborted) return cancelled();
    const host = await this.ready();
    const { api, paths } = live;
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
      await api.resume().catch(() => {});
      throw err;
    }
    if (signal?.aborted) {
      // A request arrived while the snapshot was written: resuming is cheaper for it than a restore.
      live.diffBase = undefined;
      await discardGeneration(paths.snapDir, generation);
      await api.resume();
      return cancelled();
    }
    const manifest = await commitSnapshot({
      dir: paths.snapDir,
      generation,
      type,
      host,
      vcpus: vm.spec.vcpus,
      memMiB: vm.spec.memMiB,
      tap: live.net.tap,
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
    const paths = this.paths(spec);
    const fallback = async (reason: string): Promise<WakeResult> => {
      this.log.warn("firecracker restore not possible, booting cold", { vmId: spec.vmId, reason });
      const booted = await this.boot(spec);
      return {
        vm: booted.vm,
        mode: "boot",
        timings: { restoreMs: performance.now() - started, clockFixMs: 0, skewBeforeMs: 0, skewAfterMs: 0 },
        fallbackReason: reason,
      };
    };
    await removeStaleSnapshotFiles(paths.snapDir);
    const { manifest, problem } = await readManifest(paths.snapDir);
    if (!manifest) return fallback(problem ?? "no snapshot");
    const bad = incompatibility(manifest, host, spec) ?? (await verifyFiles(paths.snapDir, manifest, { checksums: this.opts.verifyChecksums ?? true }));
    if (bad) return fallback(bad);

    const net = await this.prepareNet(spec);
    const live = await this.spawn(spec, net);
    try {
      await this.load(live, manifest);
    } catch (err) {
      await this.kill(live);
      const why = err instanceof FirecrackerApiError ? err.faultMessage : (err as Error).message;
      return fallback(`firecracker refused the snapshot: ${why}`);
    }
    let timings;
    try {
      const deadline = this.opts.restoreTimeoutMs ?? 10_000;
      live.agent = await waitForGuestAgent(live.paths.vsock, this.agentPort, { deadlineMs: deadline, gaveUp: () => exitedWhy(live) });
      const restoreMs = performance.now() - started;
      const fix = await fixGuestClock(live.agent, { targetMs: this.opts.clockTargetMs ?? 50 });
      timings = { restoreMs, clockFixMs: fix.clockFixMs, skewBeforeMs: fix.skewBeforeMs, skewAfterMs: fix.skewAfterMs };
    } catch (err) {
      await this.kill(live);
      return fallback(`restored guest did not answer: ${(err as Error).message}`);
    }
    if (this.opts.diffSnapshots) live.diffBase = manifest.generation;
    this.log.info("firecracker vm restored", { vmId: spec.vmId, generation: manifest.generation, ...roundAll(timings) });
    return { vm: live.vm, mode: "restore", timings };
  }

  async stop(vm: RunningVm): Promise<void> {
    const live = this.live.get(vm.spec.vmId);
    if (!live) return;
    live.stopping = true;
    live.agent?.close();
    live.agent = undefined;
    // Ctrl-Alt-Del makes the guest reboot, which with reboot=k ends Firecracker; a hung guest gets SIGKILL.
    await live.api.action("SendCtrlAltDel").catch(() => {});
    const grace = new Promise<void>((r) => setTimeout(r, this.opts.stopGraceMs ?? 1000).unref());
    await Promise.race([live.exited, grace]);
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
    await rm(spec.stateDir, { recursive: true, force: true });
  }

  async cpuSeconds(vm: RunningVm): Promise<number> {
    const pid = this.live.get(vm.spec.vmId)?.vm.pid ?? vm.pid;
    if (!pid) return 0;
    try {
      return readCpuSeconds(pid);
    } catch {
      return 0; // the process is gone
    }
  }

  async guestLeases(vm: RunningVm): Promise<number> {
    const live = this.owned(vm);
    for (let attempt = 0; ; attempt++) {
      try {
        live.agent ??= await waitForGuestAgent(live.paths.vsock, this.agentPort, { deadlineMs: 2000, gaveUp: () => exitedWhy(live) });
        return await live.agent.leases();
      } catch (err) {
        live.agent?.close();
        live.agent = undefined;
        if (attempt >= 1) throw err;
      }
    }
  }

  onExit(vm: RunningVm, listener: (exit: VmExit) => void): void {
    this.live.get(vm.spec.vmId)?.exitListeners.push(listener);
  }

  async reap(spec: VmSpec): Promise<void> {
    if (this.live.has(spec.vmId)) return;
    const paths = this.paths(spec);
    await killLeftover(paths);
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
    if (this.live.has(spec.vmId)) throw new Error(`${spec.vmId} already runs (pid ${this.live.get(spec.vmId)!.pid}): stop or hibernate it first`);
    const paths = this.paths(spec);
    for (const sock of [paths.apiSock, paths.vsock]) {
      if (Buffer.byteLength(sock) > 107) throw new Error(`socket path too long for a unix socket (${Buffer.byteLength(sock)} > 107 bytes): ${sock}`);
    }
    await killLeftover(paths);
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
    const logFd = openSync(paths.log, "a");
    let child: ChildProcess;
    try {
      // Its own process group, so a terminal's Ctrl-C reaches the fleet-agent (which snapshots first), not the VM.
      child = spawn(command, args, { stdio: ["ignore", logFd, logFd], cwd: spec.stateDir, detached: true });
    } finally {
      closeSync(logFd);
    }
    const api = new FirecrackerClient(paths.apiSock);
    let resolveExit!: (e: VmExit) => void;
    const live: Live = {
      vm: { spec, endpoint: { host: net.guestIp, port: this.opts.workloadPort ?? 8080 }, pid: child.pid },
      child,
      pid: child.pid,
      api,
      paths,
      net,
      agent: undefined,
      stopping: false,
      exit: undefined,
      exited: new Promise((r) => (resolveExit = r)),
      exitListeners: [],
      diffBase: undefined,
      poller: undefined,
    };
    const onExit = (exit: VmExit) => {
      if (live.exit) return;
      live.exit = exit;
      if (live.poller) clearInterval(live.poller);
      live.agent?.close();
      live.agent = undefined;
      void api.close();
      if (this.live.get(spec.vmId) === live) this.live.delete(spec.vmId);
      if (existsSync(paths.pidFile) && readFileSync(paths.pidFile, "utf8").startsWith(`${live.pid}\n`)) rmSync(paths.pidFile, { force: true });
      resolveExit(exit);
      if (!live.stopping) {
        this.log.warn("firecracker process exited unexpectedly", { vmId: spec.vmId, ...exit });
        for (const l of live.exitListeners.splice(0)) l(exit);
      }
    };
    let spawnError: Error | undefined;
    child.once("error", (err) => {
      spawnError = err;
      onExit({ code: null, signal: null });
    });
    // A jailer may fork Firecracker and exit 0 at once: until its pid is known, only a failing jailer is an exit.
    let pidKnown = !jailer;
    let earlyExit: VmExit | undefined;
    child.once("exit", (code, sig) => {
      if (pidKnown ? live.pid === child.pid : code !== 0) onExit({ code, signal: sig });
      else if (!pidKnown) earlyExit = { code, signal: sig };
    });
    if (child.pid === undefined) {
      await live.exited;
      throw new Error(`cannot start ${command}: ${spawnError?.message ?? "spawn failed"}`);
    }
    this.live.set(spec.vmId, live);
    try {
      await waitForApi(api, 5000, () => exitedWhy(live));
      // The jailer may fork: Firecracker's own pid is then in <root>/firecracker.pid, and its exit is polled.
      const jailedPid = jailer ? Number(readFileSync(join(paths.root, "firecracker.pid"), "utf8").trim()) : undefined;
      pidKnown = true;
      if (jailedPid === child.pid && earlyExit) onExit(earlyExit);
      if (jailedPid && jailedPid !== child.pid) {
        live.pid = jailedPid;
        live.vm.pid = jailedPid;
        live.poller = setInterval(() => {
          void processMatches(jailedPid, paths.marker).then((alive) => alive || onExit({ code: null, signal: null }));
        }, 250);
        live.poller.unref();
      }
    } catch (err) {
      await this.kill(live);
      throw new Error(`firecracker API did not come up: ${(err as Error).message}${logTail(paths.log)}`, { cause: err });
    }
    writeFileSync(paths.pidFile, `${live.pid}\n${paths.marker}\n`);
    return live;
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
        await new Promise((r) => setTimeout(r, 50));
        if (live.exit) throw err;
      }
    }
  }

  /** Ends the process (intentionally: no onExit) and waits for it. */
  private async kill(live: Live): Promise<void> {
    live.stopping = true;
    live.agent?.close();
    live.agent = undefined;
    if (!live.exit) {
      if (live.pid !== undefined && live.pid !== live.child.pid) {
        try {
          process.kill(live.pid, "SIGKILL");
        } catch {
          /* gone already */
        }
      } else live.child.kill("SIGKILL");
      await live.exited;
    }
    await live.api.close();
    rmSync(live.paths.apiSock, { force: true });
    rmSync(live.paths.vsock, { force: true });
  }
}

export function vmPaths(stateDir: string, jail?: { execFile: string; id: string }): VmPaths {
  const root = jail ? join(stateDir, "jail", jail.execFile, jail.id, "root") : stateDir;
  const apiSock = join(root, "fc.sock");
  return {
    root,
    apiSock,
    vsock: join(root, "vsock.sock"),
    snapDir: join(root, "snapshots"),
    log: join(stateDir, "firecracker.log"),
    pidFile: join(stateDir, "firecracker.pid"),
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

/** Firecracker's `--id` allows alphanumerics and hyphens, up to 64 characters. */
export function firecrackerId(vmId: string): string {
  return vmId.replace(/[^A-Za-z0-9-]/g, "-").slice(0, 64);
}

/** Kills a Firecracker a previous fleet-agent left running for this VM (pid file + its API socket on the command line). */
async function killLeftover(paths: VmPaths): Promise<void> {
  if (!existsSync(paths.pidFile)) return;
  const [pidLine, marker] = readFileSync(paths.pidFile, "utf8").split("\n");
  const pid = Number(pidLine);
  if (Number.isInteger(pid) && pid > 1 && marker && (await processMatches(pid, marker))) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      /* gone already */
    }
    await waitForProcessGone(pid, marker, 5000);
  }
  rmSync(paths.pidFile, { force: true });
}

function exitedWhy(live: Live): string | undefined {
  if (!live.exit) return undefined;
  return `firecracker exited (code ${live.exit.code}, signal ${live.exit.signal})`;
}

async function waitForApi(api: FirecrackerClient, timeoutMs: number, gaveUp: () => string | undefined): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (let delay = 5; ; delay = Math.min(delay * 2, 100)) {
    const why = gaveUp();
    if (why) throw new Error(why);
    try {
      await api.describeInstance();
      return;
    } catch (err) {
      if (performance.now() + delay > deadline) throw err;
    }
    await new Promise((r) => setTimeout(r, delay));
  }
}

/** Resolves once the workload answers any HTTP response on GET /. */
function waitForHttp(endpoint: { host: string; port: number }, deadline: number, gaveUp: () => string | undefined): Promise<void> {
  const attempt = () =>
    new Promise<boolean>((resolve) => {
      const req = request({ host: endpoint.host, port: endpoint.port, path: "/", method: "GET", timeout: 1000 }, (res) => {
        res.resume();
        resolve(true);
      });
      req.once("timeout", () => req.destroy());
      req.once("error", () => resolve(false));
      req.end();
    });
  return (async () => {
    for (;;) {
      const why = gaveUp();
      if (why) throw new Error(why);
      if (await attempt()) return;
      if (performance.now() > deadline) throw new Error(`workload did not answer HTTP on ${endpoint.host}:${endpoint.port} in time`);
      await new Promise((r) => setTimeout(r, 50));
    }
  })();
}

function logTail(path: string): string {
  try {
    const text = readFileSync(path, "utf8").trim();
    return text ? `; firecracker log: …${text.slice(-600)}` : "";
  } catch {
    return "";
  }
}

function roundAll(o: Record<string, number>): Record<string, number> {
  return Object.fromEntries(Object.entries(o).map(([k, v]) => [k, Math.round(v * 10) / 10]));
}

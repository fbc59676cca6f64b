// The qemu driver: one QEMU microvm per VM (KVM when usable, TCG otherwise); hibernate = QMP migrate to a file, wake = -incoming + cont + clock fix.
import { spawn, type ChildProcess } from "node:child_process";
import { closeSync, mkdirSync, openSync, readFileSync, rmSync, statSync, truncateSync } from "node:fs";
import { readFile, rename, rm, writeFile } from "node:fs/promises";
import { request } from "node:http";
import { connect } from "node:net";
import { join } from "node:path";
import { silentLogger, type Logger } from "../../lib/log.ts";
import type { BootResult, RunningVm, SnapshotResult, VmDriver, VmExit, VmSpec, WakeResult } from "./driver.ts";
import { fixGuestClock, GuestAgentClient } from "./guest-agent.ts";
import { machineArgs, opt, qemuArgs, shellQuote, vmPaths, type Accel, type VmPaths } from "./qemu-args.ts";
import { detectAccel, freeLoopbackPort, hostCpuModel, hostTscKhz, processAlive, processArgv, processCpuSeconds, qemuVersion } from "./qemu-host.ts";
import { commitManifest, fsyncPath, incompatibility, MANIFEST_VERSION, readManifest, removeUnreferencedSnapshots, sha256File, type SnapshotManifest } from "./qemu-snapshot.ts";
import { ensureListenBacklogShim } from "./qemu-backlog.ts";
import { QmpClient, type MigrationInfo } from "./qmp.ts";

export interface GuestImagePaths {
  kernel: string;
  initrd: string;
}

export interface QemuDriverOptions {
  /** Kernel and initramfs per image name (`demo`); a fixed pair serves every VM. */
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
   */
  prestart?: boolean;
  /**
   * LD_PRELOAD shim that raises QEMU's listen backlog (see qemu-backlog.ts): `auto` (default) builds it
   * with gcc on first use, a path uses that file, false runs QEMU without it.
   */
  listenBacklogShim?: "auto" | string | false;
}

/** Restoring into the target failed in a way a cold boot recovers from. */
class RestoreFailed extends Error {
  override name = "RestoreFailed";
}

interface VmProcess {
  spec: VmSpec;
  paths: VmPaths;
  hostPort: number;
  machineArgs: string[];
  child: ChildProcess;
  pid: number;
  qmp: QmpClient | undefined;
  agent: GuestAgentClient | undefined;
  agentOpen: boolean;
  exit: Promise<VmExit>;
  exited: VmExit | undefined;
  /** The driver asked it to go (quit, kill): not a crash. */
  intentional: boolean;
  exitListeners: Array<(e: VmExit) => void>;
  lastCpuSeconds: number;
}

const UNLIMITED_BANDWIDTH = 2 ** 40; // bytes/s; QEMU 7.2 caps migration at 128 MiB/s by default
const CONSOLE_LOG_MAX = 4 << 20;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class QemuDriver implements VmDriver {
  readonly name = "qemu" as const;
  readonly isolated = true;
  readonly accel: Accel;
  readonly accelReason: string;
  readonly qemuVersion: string;
  private readonly binary: string;
  private readonly log: Logger;
  private readonly opts: QemuDriverOptions;
  private readonly tscKhz: number | undefined;
  private readonly preload: string | undefined;
  private readonly hostCpu = hostCpuModel();
  private readonly running = new Map<string, VmProcess>();
  /** Pre-started QEMUs in `-incoming defer`, by vmId. */
  private readonly waiting = new Map<string, VmProcess>();
  /** Crashes of processes no longer tracked, for listeners that register late. */
  private readonly crashes = new Map<number, VmExit>();

  constructor(opts: QemuDriverOptions) {
    this.opts = opts;
    this.binary = opts.qemuBinary ?? "qemu-system-x86_64";
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
    this.log.info("qemu driver ready", { accel: this.accel, why: this.accelReason, qemu: this.qemuVersion, tscKhz: this.tscKhz, preload: this.preload });
  }

  async boot(spec: VmSpec): Promise<BootResult> {
    const started = performance.now();
    const { vm } = await this.bootInternal(spec, started);
    return { vm, bootMs: performance.now() - started };
  }

  async hibernate(vm: RunningVm, signal?: AbortSignal): Promise<SnapshotResult> {
    const started = performance.now();
    const vp = this.mustBeRunning(vm);
    const qmp = vp.qmp!;
    const { paths, spec } = vp;
    const notDone = (): SnapshotResult => ({ completed: false, snapshotMs: performance.now() - started, bytes: 0 });
    if (signal?.aborted) return notDone();
    await rm(paths.snapshotTmp, { force: true });
    await rm(paths.snapshotDone, { force: true });

    let manifest: SnapshotManifest;
    let dataPath: string | undefined;
    await qmp.execute("stop");
    try {
      // The marker is written only after cat has flushed and closed the file: QEMU may report
      // "completed" while cat is still writing.
      await qmp.execute("migrate", { uri: `exec:cat > ${shellQuote(paths.snapshotTmp)} && : > ${shellQuote(paths.snapshotDone)}` });
      const info = await this.waitMigration(vp, { signal, timeoutMs: 120_000 });
      if (info.status !== "completed") throw new Error(`snapshot migration ${info.status}: ${info["error-desc"] ?? "no detail"}`);
      await this.waitForFile(paths.snapshotDone, 10_000, signal);
      signal?.throwIfAborted();
      const [{ sha256, bytes }] = await Promise.all([sha256File(paths.snapshotTmp, signal), fsyncPath(paths.snapshotTmp)]);
      signal?.throwIfAborted();
      const createdAt = new Date();
      const file = `snapshot-${createdAt.getTime()}.bin`;
      dataPath = join(spec.stateDir, file);
      await rename(paths.snapshotTmp, dataPath);
      await rm(paths.snapshotDone, { force: true });
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
      };
      signal?.throwIfAborted();
      // The point of no return: from here the new snapshot is the VM.
      await commitManifest(manifest, paths.manifest, paths.manifestTmp);
    } catch (err) {
      const aborted = signal?.aborted === true;
      if (dataPath) await rm(dataPath, { force: true }); // renamed but never named by the manifest
      await this.resumeAfterFailedSnapshot(vp, aborted);
      if (aborted) {
        this.log.info("hibernate cancelled; VM resumed", { vmId: spec.vmId });
        return notDone();
      }
      throw err;
    }
    await this.quit(vp);
    await removeUnreferencedSnapshots(spec.stateDir, manifest.file);
    const snapshotMs = performance.now() - started;
    this.log.info("hibernated", { vmId: spec.vmId, bytes: manifest.bytes, snapshotMs: Math.round(snapshotMs) });
    if (this.opts.prestart) this.prestart(spec).catch((err) => this.log.warn("prestart failed", { vmId: spec.vmId, err }));
    return { completed: true, snapshotMs, bytes: manifest.bytes };
  }

  async wake(spec: VmSpec): Promise<WakeResult> {
    const started = performance.now();
    if (this.running.has(spec.vmId)) throw new Error(`VM ${spec.vmId} is already running`);
    const paths = vmPaths(spec.stateDir);
    let reason: string | undefined;
    let manifest: SnapshotManifest | undefined;
    try {
      manifest = await readManifest(paths.manifest);
      if (!manifest) reason = "no snapshot";
    } catch (err) {
      reason = `unreadable snapshot manifest: ${(err as Error).message}`;
    }
    if (manifest) {
      const hostPort = await this.readPort(paths);
      reason = incompatibility(manifest, {
        qemuVersion: this.qemuVersion,
        accel: this.accel,
        hostCpu: this.hostCpu,
        memMiB: spec.memMiB,
        vcpus: spec.vcpus,
        machineArgs: machineArgs({ spec, paths, accel: this.accel, hostPort: hostPort ?? 0 }),
      });
    }
    if (manifest && !reason) {
      try {
        return await this.restore(spec, manifest, started);
      } catch (err) {
        if (!(err instanceof RestoreFailed)) throw err;
        reason = err.message;
      }
    }
    this.log.warn("cold boot instead of restore", { vmId: spec.vmId, reason });
    const { vm, clock } = await this.bootInternal(spec, started);
    return { vm, mode: "boot", fallbackReason: reason ?? "unknown", timings: { restoreMs: performance.now() - started, ...clock } };
  }

  async stop(vm: RunningVm): Promise<void> {
    const vp = this.running.get(vm.spec.vmId);
    if (vp) await this.quit(vp);
    await this.discardWaiting(vm.spec.vmId);
  }

  async destroy(spec: VmSpec): Promise<void> {
    const vp = this.running.get(spec.vmId);
    if (vp) await this.quit(vp);
    await this.discardWaiting(spec.vmId);
    await this.reap(spec);
    const paths = vmPaths(spec.stateDir);
    if (paths.socketDir !== spec.stateDir) await rm(paths.socketDir, { recursive: true, force: true });
    await rm(spec.stateDir, { recursive: true, force: true });
  }

  async cpuSeconds(vm: RunningVm): Promise<number> {
    const vp = this.running.get(vm.spec.vmId);
    if (!vp) return 0; // not running here: nothing is using CPU for it
    const s = processCpuSeconds(vp.pid);
    if (s !== undefined) vp.lastCpuSeconds = s;
    return vp.lastCpuSeconds;
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
    const vp = this.running.get(vm.spec.vmId);
    if (vp && vp.pid === vm.pid) {
      vp.exitListeners.push(listener);
      return;
    }
    const crash = vm.pid === undefined ? undefined : this.crashes.get(vm.pid);
    if (crash) queueMicrotask(() => listener(crash));
  }

  /** Host shutdown: pre-started QEMUs are killed, VMs still running are stopped (their snapshots stay). */
  async close(): Promise<void> {
    await Promise.all([...this.waiting.keys()].map((id) => this.discardWaiting(id)));
    await Promise.all([...this.running.values()].map((vp) => this.quit(vp)));
  }

  /**
   * Kills a QEMU a previous fleet-agent left running for this VM (its pid file, checked against
   * /proc/<pid>/cmdline) and removes partial snapshot files; the complete snapshot stays.
   */
  async reap(spec: VmSpec): Promise<void> {
    if (this.running.has(spec.vmId) || this.waiting.has(spec.vmId)) return; // ours and alive
    const paths = vmPaths(spec.stateDir);
    const pid = Number((await readFile(paths.pid, "utf8").catch(() => "")).trim());
    if (pid > 0) {
      const argv = processArgv(pid);
      if (argv && /qemu/.test(argv[0] ?? "") && argv.some((a) => a.includes(opt(paths.qmp)))) {
        this.log.warn("killing a QEMU left running by a previous fleet-agent", { vmId: spec.vmId, pid });
        try {
          process.kill(pid, "SIGKILL");
        } catch {
          // already gone
        }
        const deadline = performance.now() + 5000;
        while (processArgv(pid) && processAlive(pid) && performance.now() < deadline) await sleep(10);
      }
    }
    let keep: string | undefined;
    let manifestReadable = true;
    try {
      keep = (await readManifest(paths.manifest))?.file;
    } catch {
      manifestReadable = false;
    }
    if (manifestReadable) await removeUnreferencedSnapshots(spec.stateDir, keep);
    else for (const p of [paths.snapshotTmp, paths.snapshotDone, paths.manifestTmp]) await rm(p, { force: true });
    for (const p of [paths.qmp, paths.agent, paths.pid]) await rm(p, { force: true });
  }

  // ---- internals ----

  private mustBeRunning(vm: RunningVm): VmProcess {
    const vp = this.running.get(vm.spec.vmId);
    if (!vp || vp.exited) throw new Error(`VM ${vm.spec.vmId} is not running`);
    return vp;
  }

  private async imageFor(name: string): Promise<GuestImagePaths> {
    const image = this.opts.image;
    return typeof image === "function" ? image(name) : image;
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

  private async bootInternal(spec: VmSpec, started: number): Promise<{ vm: RunningVm; clock: { clockFixMs: number; skewBeforeMs: number; skewAfterMs: number } }> {
    if (this.running.has(spec.vmId)) throw new Error(`VM ${spec.vmId} is already running`);
    await this.discardWaiting(spec.vmId);
    const image = await this.imageFor(spec.image);
    const deadline = started + (this.opts.bootTimeoutMs ?? 120_000);
    const vp = await this.launch(spec, image, false);
    try {
      await this.connectAgent(vp, deadline);
      // The RTC gives the guest whole seconds at boot; set it to the millisecond like after a restore.
      const clock = await fixGuestClock(vp.agent!);
      await this.waitHttp(vp, deadline);
      this.running.set(spec.vmId, vp);
      this.log.info("booted", { vmId: spec.vmId, pid: vp.pid, port: vp.hostPort, bootMs: Math.round(performance.now() - started) });
      return { vm: this.runningVm(vp), clock };
    } catch (err) {
      await this.kill(vp);
      throw this.withLog(vp, err as Error);
    }
  }

  private async restore(spec: VmSpec, manifest: SnapshotManifest, started: number): Promise<WakeResult> {
    const paths = vmPaths(spec.stateDir);
    const file = join(spec.stateDir, manifest.file);
    try {
      statSync(file);
    } catch {
      throw new RestoreFailed(`snapshot file ${manifest.file} is missing`);
    }
    // The checksum is verified while QEMU loads the file; the guest runs (cont) only if it matches.
    const verify = sha256File(file).then(
      (r) => (r.sha256 === manifest.sha256 && r.bytes === manifest.bytes ? undefined : `snapshot checksum mismatch (${r.bytes} bytes, sha256 ${r.sha256.slice(0, 12)}…, manifest says ${manifest.sha256.slice(0, 12)}…)`),
      (err: Error) => `snapshot unreadable: ${err.message}`,
    );
    let vp = this.takeWaiting(spec);
    if (!vp) {
      const image = await this.imageFor(spec.image);
      try {
        vp = await this.launch(spec, image, true);
      } catch (err) {
        await verify;
        throw new RestoreFailed(`QEMU did not start for the restore: ${(err as Error).message}`);
      }
    }
    const deadline = performance.now() + (this.opts.restoreTimeoutMs ?? 60_000);
    try {
      const agentReady = this.openAgent(vp);
      await vp.qmp!.execute("migrate-incoming", { uri: `exec:cat ${shellQuote(file)}` });
      const info = await this.waitMigration(vp, { timeoutMs: deadline - performance.now() });
      if (info.status !== "completed") throw new RestoreFailed(`restore ${info.status}: ${info["error-desc"] ?? "no detail"}`);
      const bad = await verify;
      if (bad) throw new RestoreFailed(bad);
      await agentReady;
      await vp.qmp!.execute("cont");
      await this.pingAgent(vp, Math.min(deadline, performance.now() + 10_000));
    } catch (err) {
      await this.kill(vp);
      await verify;
      if (err instanceof RestoreFailed) throw err;
      throw new RestoreFailed(this.withLog(vp, err as Error).message);
    }
    const restoreMs = performance.now() - started;
    const fix = await fixGuestClock(vp.agent!);
    this.running.set(spec.vmId, vp);
    if (Math.abs(fix.skewAfterMs) >= 50) this.log.warn("guest clock still off after the fix", { vmId: spec.vmId, skewAfterMs: fix.skewAfterMs });
    this.log.info("restored", { vmId: spec.vmId, pid: vp.pid, restoreMs: Math.round(restoreMs), clockFixMs: Math.round(fix.clockFixMs), skewBeforeMs: Math.round(fix.skewBeforeMs), skewAfterMs: fix.skewAfterMs });
    return { vm: this.runningVm(vp), mode: "restore", timings: { restoreMs, clockFixMs: fix.clockFixMs, skewBeforeMs: fix.skewBeforeMs, skewAfterMs: fix.skewAfterMs } };
  }

  private runningVm(vp: VmProcess): RunningVm {
    return { spec: vp.spec, endpoint: { host: "127.0.0.1", port: vp.hostPort }, pid: vp.pid };
  }

  /** Starts QEMU and connects QMP; retries once on a new port when the stored one is taken. */
  private async launch(spec: VmSpec, image: GuestImagePaths, incoming: boolean): Promise<VmProcess> {
    mkdirSync(spec.stateDir, { recursive: true });
    const paths = vmPaths(spec.stateDir);
    mkdirSync(paths.socketDir, { recursive: true, mode: 0o700 });
    for (const log of [paths.console, paths.qemuLog]) {
      try {
        if (statSync(log).size > CONSOLE_LOG_MAX) truncateSync(log, 0);
      } catch {
        // no log yet
      }
    }
    let hostPort = await this.hostPort(paths);
    for (let attempt = 0; ; attempt++) {
      const vp = this.spawnQemu(spec, paths, image, hostPort, incoming);
      try {
        vp.qmp = await QmpClient.connect(paths.qmp, { timeoutMs: 15_000, alive: () => !vp.exited });
        await vp.qmp.execute("migrate-set-parameters", { "max-bandwidth": UNLIMITED_BANDWIDTH });
        return vp;
      } catch (err) {
        await this.kill(vp);
        const log = this.qemuLogTail(paths);
        if (attempt === 0 && /host forwarding rule|Could not set up host forwarding/i.test(log)) {
          this.log.warn("forwarded port taken; choosing another", { vmId: spec.vmId, port: hostPort });
          hostPort = await this.hostPort(paths, true);
          continue;
        }
        throw this.withLog(vp, err as Error);
      }
    }
  }

  private spawnQemu(spec: VmSpec, paths: VmPaths, image: GuestImagePaths, hostPort: number, incoming: boolean): VmProcess {
    for (const p of [paths.qmp, paths.agent]) rmSyncQuiet(p);
    const launch = { spec, paths, accel: this.accel, hostPort, kernel: image.kernel, initrd: image.initrd, tscKhz: this.tscKhz, incoming };
    const errFd = openSync(paths.qemuLog, "a");
    let child: ChildProcess;
    try {
      const env = { ...process.env };
      if (this.preload) env.LD_PRELOAD = [this.preload, env.LD_PRELOAD].filter(Boolean).join(" ");
      // Its own process group: a terminal's Ctrl-C reaches the fleet-agent, which snapshots the VM before
      // stopping it, not QEMU directly (a VM killed first would lose its state). Orphans are reaped at restart.
      child = spawn(this.binary, qemuArgs(launch), { stdio: ["ignore", "ignore", errFd], env, detached: true });
    } finally {
      closeSync(errFd);
    }
    let resolveExit!: (e: VmExit) => void;
    const vp: VmProcess = {
      spec,
      paths,
      hostPort,
      machineArgs: machineArgs(launch),
      child,
      pid: child.pid ?? -1,
      qmp: undefined,
      agent: undefined,
      agentOpen: false,
      exit: new Promise((r) => (resolveExit = r)),
      exited: undefined,
      intentional: false,
      exitListeners: [],
      lastCpuSeconds: 0,
    };
    child.on("error", (err) => {
      this.log.error("QEMU failed to start", { vmId: spec.vmId, err });
      this.onProcessExit(vp, { code: null, signal: null }, resolveExit);
    });
    child.on("exit", (code, signal) => this.onProcessExit(vp, { code, signal }, resolveExit));
    return vp;
  }

  private onProcessExit(vp: VmProcess, exit: VmExit, resolveExit: (e: VmExit) => void): void {
    if (vp.exited) return;
    vp.exited = exit;
    resolveExit(exit);
    vp.qmp?.close();
    vp.agent?.close();
    const id = vp.spec.vmId;
    const wasRunning = this.running.get(id) === vp;
    if (wasRunning) this.running.delete(id);
    if (this.waiting.get(id) === vp) this.waiting.delete(id);
    if (vp.intentional || !wasRunning) return;
    this.log.error("QEMU exited unexpectedly", { vmId: id, pid: vp.pid, code: exit.code, signal: exit.signal, log: this.qemuLogTail(vp.paths) });
    this.crashes.set(vp.pid, exit);
    if (this.crashes.size > 1000) this.crashes.delete(this.crashes.keys().next().value!);
    for (const l of vp.exitListeners.splice(0)) l(exit);
  }

  /** Asks QEMU to quit, then kills it if it does not; waits for the exit. */
  private async quit(vp: VmProcess): Promise<void> {
    vp.intentional = true;
    if (vp.exited) return;
    try {
      await vp.qmp?.execute("quit", undefined, 2000);
    } catch {
      // it may close the socket before answering
    }
    const exited = await Promise.race([vp.exit.then(() => true), sleep(5000).then(() => false)]);
    if (!exited) await this.kill(vp);
    for (const p of [vp.paths.qmp, vp.paths.agent]) rmSyncQuiet(p);
  }

  private async kill(vp: VmProcess): Promise<void> {
    vp.intentional = true;
    if (vp.exited) return;
    vp.child.kill("SIGKILL");
    await vp.exit;
  }

  private takeWaiting(spec: VmSpec): VmProcess | undefined {
    const vp = this.waiting.get(spec.vmId);
    if (!vp) return undefined;
    this.waiting.delete(spec.vmId);
    return vp.exited ? undefined : vp;
  }

  private async discardWaiting(vmId: string): Promise<void> {
    const vp = this.waiting.get(vmId);
    if (!vp) return;
    this.waiting.delete(vmId);
    await this.kill(vp);
  }

  private async prestart(spec: VmSpec): Promise<void> {
    if (this.running.has(spec.vmId) || this.waiting.has(spec.vmId)) return;
    const vp = await this.launch(spec, await this.imageFor(spec.image), true);
    if (this.running.has(spec.vmId) || this.waiting.has(spec.vmId)) return this.kill(vp);
    this.waiting.set(spec.vmId, vp);
  }

  /** Opens the host end of the agent's virtio-serial port (a unix socket QEMU serves). */
  private openAgent(vp: VmProcess): Promise<void> {
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

  /** Boot: connect to the agent port and ping until the guest agent answers. */
  private async connectAgent(vp: VmProcess, deadline: number): Promise<void> {
    for (;;) {
      if (vp.exited) throw new Error(`QEMU exited during boot (code ${vp.exited.code}, signal ${vp.exited.signal})`);
      if (performance.now() > deadline) throw new Error("guest agent did not answer before the boot deadline");
      try {
        await this.openAgent(vp);
        await vp.agent!.ping(500);
        return;
      } catch {
        if (!vp.agentOpen) await sleep(20);
      }
    }
  }

  private async pingAgent(vp: VmProcess, deadline: number): Promise<void> {
    let last: Error | undefined;
    while (performance.now() < deadline) {
      if (vp.exited) throw new Error("QEMU exited after the restore");
      try {
        await this.openAgent(vp);
        await vp.agent!.ping(Math.max(100, Math.min(1000, deadline - performance.now())));
        return;
      } catch (err) {
        last = err as Error;
        if (!vp.agentOpen) await sleep(10);
      }
    }
    throw new RestoreFailed(`guest agent did not answer after the restore: ${last?.message ?? "timeout"}`);
  }

  private async waitHttp(vp: VmProcess, deadline: number): Promise<void> {
    for (;;) {
      if (vp.exited) throw new Error("QEMU exited before the workload answered");
      if (performance.now() > deadline) throw new Error("the workload did not answer HTTP before the boot deadline");
      if (await httpOk(vp.hostPort, "/healthz", 2000)) return;
      await sleep(25);
    }
  }

  /** Polls query-migrate until the migration leaves its active states; cancels it when `signal` aborts. */
  private async waitMigration(vp: VmProcess, opts: { signal?: AbortSignal | undefined; timeoutMs: number }): Promise<MigrationInfo> {
    const qmp = vp.qmp!;
    const deadline = performance.now() + opts.timeoutMs;
    let cancelled = false;
    for (;;) {
      if (vp.exited) throw new Error(`QEMU exited during the migration: ${this.qemuLogTail(vp.paths) || "no message"}`);
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
      await sleep(3);
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

  /** After a cancelled or failed snapshot: end any migration, run the guest again, fix its clock, drop partial files. */
  private async resumeAfterFailedSnapshot(vp: VmProcess, aborted: boolean): Promise<void> {
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
      await qmp.execute("cont");
      // The guest clock stood still while the VM was stopped.
      await fixGuestClock(vp.agent!);
    } catch (err) {
      this.log.error("could not resume the VM after a failed snapshot", { vmId: vp.spec.vmId, aborted, err });
    }
    const paths = vp.paths;
    for (const p of [paths.snapshotTmp, paths.snapshotDone, paths.manifestTmp]) await rm(p, { force: true });
  }

  private qemuLogTail(paths: VmPaths): string {
    try {
      const text = readFileSync(paths.qemuLog, "utf8");
      return text.trim().split("\n").slice(-3).join(" | ");
    } catch {
      return "";
    }
  }

  private withLog(vp: VmProcess, err: Error): Error {
    const tail = this.qemuLogTail(vp.paths);
    if (!tail || err.message.includes(tail)) return err;
    return new Error(`${err.message} (qemu: ${tail})`, { cause: err });
  }
}

function rmSyncQuiet(path: string): void {
  try {
    // Stale unix sockets from a previous QEMU would make clients connect to nothing.
    rmSync(path);
  } catch {
    // absent
  }
}

/** GET http://127.0.0.1:<port><path> answers 200 within the timeout. */
function httpOk(port: number, path: string, timeoutMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    const req = request({ host: "127.0.0.1", port, path, method: "GET", agent: false, timeout: timeoutMs }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode === 200));
      res.on("error", () => resolve(false));
    });
    req.on("timeout", () => req.destroy());
    req.on("error", () => resolve(false));
    req.end();
  });
}

/** The driver for this host, with the accelerator chosen by `detectAccel` unless configured. */
export function createQemuDriver(opts: QemuDriverOptions): QemuDriver {
  return new QemuDriver(opts);
}

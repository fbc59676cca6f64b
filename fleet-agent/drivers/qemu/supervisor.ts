// Process supervision for the qemu driver: starting QEMU (its sockets, the egress listener, a fresh RAM file, the
// forwarded port, QMP's set-up), watching its exit, and the bookkeeping of each VM's QEMUs: the running one, the one
// kept for a hibernated VM (pre-started or paused, waiting.ts), and the work after a hibernation that whatever starts
// the VM's next QEMU waits for (`settled`).
import { closeSync, existsSync, mkdirSync, openSync, rmSync } from "node:fs";
import { readFile, rm, stat, writeFile } from "node:fs/promises";
import type { Logger } from "../../../lib/log.ts";
import { makeLaunchDrive } from "../common/launch-data.ts";
import { killLeftover } from "../common/proc.ts";
import { freeLoopbackPort } from "../common/readiness.ts";
import { capLog, VmProcess, VmProcesses, withTail } from "../common/vm-process.ts";
import type { ExecStubs } from "../common/exec-stubs.ts";
import type { RunningVm, VmExit, VmSpec } from "../driver.ts";
import { egressProxyUrl } from "../../egress/guest-address.ts";
import type { EgressProxy } from "../../egress/proxy.ts";
import { machineArgs, NETNS_EXEC_PORT, NETNS_WEB_PORT, opt, qemuArgs, vmPaths, type VmPaths } from "./args.ts";
import { IMAGE_GUEST, type GuestImagePaths, type QemuDriverOptions } from "./options.ts";
import type { Phases } from "./phases.ts";
import { contAfterMigration, QmpClient } from "./qmp.ts";
import { freshRamFile } from "./ram-file.ts";
import type { LaunchRam } from "./ram-plan.ts";
import type { RamSpace } from "./ram-space.ts";
import { cacheInSmallPages, smallPagesTool } from "./small-pages.ts";
import { readManifest, removePartialDrives, removePartialSnapshots, removeUnreferencedSnapshots } from "./snapshot.ts";
import { syncGuest, type QemuHost, type QemuVm } from "./vm.ts";
import type { EvictReason, WaitingPool } from "./waiting.ts";

const UNLIMITED_BANDWIDTH = 2 ** 40; // bytes/s; QEMU 7.2 caps migration at 128 MiB/s by default
/** A stop (host shutdown, delete) waits less for the guest's flush: the disk's journal covers the rest. */
const STOP_SYNC_TIMEOUT_MS = 3000;

export interface SupervisorDeps {
  host: QemuHost;
  log: Logger;
  /** Kernel and initramfs per image name (QemuDriverOptions.image). */
  image: QemuDriverOptions["image"];
  /** QemuDriverOptions.prestart: after a hibernation, start the VM's next QEMU in `-incoming defer`. */
  prestart: QemuDriverOptions["prestart"];
  egress: EgressProxy;
  /** Waiting exec stubs QEMU is started from (QemuDriverOptions.execStubs). */
  stubs: ExecStubs | undefined;
  /** QEMUs kept for hibernated VMs; it gives what it evicts to `endKept`. */
  waiting: WaitingPool<QemuVm>;
  /** A kept QEMU's RAM file stays reserved while it waits; once it has ended, the file is made sparse (ram-space.ts). */
  space: Pick<RamSpace, "dig" | "reserve" | "ticket">;
}

export class QemuSupervisor {
  /** Each running VM's QEMU, by vmId. */
  readonly running = new Map<string, QemuVm>();
  /** QEMUs kept for hibernated VMs (pre-started in `-incoming defer`, or stopped after the hibernation), by vmId. */
  readonly waiting: WaitingPool<QemuVm>;
  /** A hibernation's work after its answer, by vmId: QEMU's exit, the egress listener, older files (`settled`). */
  private readonly settling = new Map<string, Promise<void>>();
  private readonly processes = new VmProcesses();
  private smallPagesMissingSaid = false;
  private readonly host: QemuHost;
  private readonly log: Logger;
  private readonly deps: SupervisorDeps;

  constructor(deps: SupervisorDeps) {
    this.deps = deps;
    this.host = deps.host;
    this.log = deps.log;
    this.waiting = deps.waiting;
  }

  /**
   * After a committed hibernation: QEMU quits and the egress listener ends, off the caller's path; then the prestart,
   * of a QEMU that holds RAM as the snapshot's wake will (`next`: ram-file.ts `ramPlan`; absent: none can wait for it).
   */
  settle(spec: VmSpec, vp: QemuVm, next?: LaunchRam): void {
    const settling = (async () => {
      await this.quit(vp);
      await this.deps.egress.release(spec.vmId);
    })()
      .catch((err: unknown) => this.log.warn("cleanup after a hibernation failed", { vmId: spec.vmId, err }))
      .then(() =>
        this.deps.prestart && next ? this.prestart(spec, next).catch((err: unknown) => this.log.warn("prestart failed", { vmId: spec.vmId, err })) : undefined,
      );
    this.trackSettling(spec.vmId, settling);
  }

  /** Work on a VM's QEMU that whatever starts a QEMU for the VM next waits for (`settled`), forgotten once done. */
  private trackSettling(vmId: string, work: Promise<void>): void {
    this.settling.set(vmId, work);
    void work.then(() => {
      if (this.settling.get(vmId) === work) this.settling.delete(vmId);
    });
  }

  /** Waits for a hibernation's background work on this VM (QEMU's exit, cleanup) before anything else uses it. */
  async settled(vmId: string): Promise<void> {
    await this.settling.get(vmId);
  }

  /** Every piece of work `settled` waits for (host shutdown waits for them all). */
  allSettling(): Promise<void>[] {
    return [...this.settling.values()];
  }

  /** Called once if the VM's QEMU exits without being told to (VmDriver.onExit). */
  onExit(vm: RunningVm, listener: (exit: VmExit) => void): void {
    this.processes.onExit(vm, listener);
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
    for (const p of [paths.qmp, paths.agent, paths.pid, paths.web, paths.exec]) await rm(p, { force: true });
  }

  /**
   * At a host's start, after `reap`: a QEMU kept for a sleeping agent held its RAM file reserved whole (a file is dug
   * only once no QEMU may run on it); one that died with an earlier fleet-agent left it so, its whole size on disk until
   * the agent's next hibernation. Dug now, as the kept QEMU's end would have. Only a file reserved whole, under a
   * snapshot: a few (the kept QEMUs were bounded), not every sleeping agent's data read again at each start.
   */
  async digLeftReserved(spec: VmSpec): Promise<void> {
    const paths = vmPaths(spec.stateDir);
    const { manifest, problem } = await readManifest(paths.manifest);
    if (manifest && !problem && (await reservedWhole(paths.ram))) this.deps.space.dig(spec.vmId, paths.ram, this.deps.space.ticket(spec.vmId));
  }

  /** The QEMU of a running VM; throws when the VM is not running here (or its QEMU exited). */
  mustBeRunning(vm: RunningVm): QemuVm {
    const vp = this.running.get(vm.spec.vmId);
    if (!vp || vp.proc.exit) throw new Error(`VM ${vm.spec.vmId} is not running`);
    return vp;
  }

  /** The kernel and initramfs the VM boots (a built image's VM: IMAGE_GUEST's). */
  async imageFor(spec: VmSpec): Promise<GuestImagePaths> {
    const image = this.deps.image;
    return typeof image === "function" ? image(spec.rootImage ? IMAGE_GUEST : spec.image) : image;
  }

  /** The forwarded host port kept in the stateDir, if there is a valid one. */
  async readPort(paths: VmPaths): Promise<number | undefined> {
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

  /**
   * Starts QEMU and connects QMP; retries once on a new port when the stored one is taken. `incoming`: it waits for a
   * snapshot (`-incoming defer`); `ram`: how it holds guest RAM (ram-file.ts `ramPlan`; a cold boot: the host's mode).
   * `standby` (standby.ts): a second QEMU beside the VM's, on its own files (`paths`), sharing the VM's launch drive
   * and egress listener, which it neither rewrites nor opens.
   */
  async launch(spec: VmSpec, image: GuestImagePaths, incoming: boolean, ram: LaunchRam, phases?: Phases, standby?: { paths: VmPaths }): Promise<QemuVm> {
    mkdirSync(spec.stateDir, { recursive: true });
    const paths = standby?.paths ?? vmPaths(spec.stateDir);
    mkdirSync(paths.socketDir, { recursive: true, mode: 0o700 });
    capLog(paths.console); // QEMU appends the guest console itself; its own log is capped when opened
    // A built image's QEMU needs its launch drive at every start (the same devices for a boot and a restore). The guest
    // reads it only at its boot: a restore keeps the one its guest booted with (a new one cost each wake ~20 ms of
    // mke2fs), and only a VM restored where it never booted (a fork, a moved agent) gets one made.
    const proxy = this.host.egressRelay !== undefined;
    const egress = spec.allowEgress && proxy;
    if (spec.allowEgress && !egress) this.log.warn("agent allows egress but there is no relay: it gets none", { vmId: spec.vmId });
    // A boot's environment names the tenant's upstreams (a restored guest read its own at its boot: nothing to ask).
    const upstreams = proxy && !incoming ? await this.upstreamNames(spec) : undefined;
    if (spec.rootImage && !((standby || incoming) && existsSync(paths.launchDrive)))
      await makeLaunchDrive(spec.stateDir, spec.rootImage.config, {
        agentId: spec.agentId,
        port: spec.rootImage.config.port,
        ...(egress ? { egressProxy: egressProxyUrl } : {}),
        ...(proxy ? { upstreams: upstreams ?? [] } : {}),
        ...(spec.desktop ? { desktop: spec.desktop } : {}),
      });
    // The proxy listens before QEMU starts: the guest may connect as soon as it runs (a restored one at once). Every
    // VM gets it (its upstreams are there); one without egress is refused anything else.
    if (proxy && !standby) await this.deps.egress.listen(spec.vmId, paths.egress, { egress });
    // A cold boot on file-backed RAM starts a fresh RAM file (and generation): no snapshot pairs with it any more; so
    // does the load of a streamed snapshot into file-backed RAM (`convert`: its pages are written into the file).
    // Its blocks are reserved before a guest runs on it (ram-space.ts: a full disk must not kill the VM).
    if (ram.memory === "file" && (!incoming || ram.convert)) {
      await freshRamFile(paths, spec.memMiB);
      await this.deps.space.reserve(paths.ram);
      await this.smallPages(spec, paths.ram);
    }
    // In a namespace of its own, QEMU's forwards take fixed ports on a loopback nobody else has.
    const relayed = this.host.netns;
    let hostPort = relayed ? NETNS_WEB_PORT : await this.hostPort(paths);
    for (let attempt = 0; ; attempt++) {
      // The exec server's forward: a fresh port for every QEMU (a kept or pre-started one holds its own meanwhile).
      const execPort = relayed ? NETNS_EXEC_PORT : await freeLoopbackPort();
      phases?.mark("launchPrepare");
      const vp = this.spawnQemu(spec, paths, image, hostPort, execPort, incoming, ram, upstreams);
      phases?.mark("spawn");
      try {
        vp.qmp = await QmpClient.connect(paths.qmp, { timeoutMs: 15_000, alive: () => !vp.proc.exit });
        phases?.mark("qmpConnect");
        // Sent together (QEMU answers in order). `events`: MIGRATION status events, which waitMigration waits on. Both
        // sides, file-backed RAM: the shared RAM file is not migrated, only the device state (`x-ignore-shared`); a
        // streamed snapshot's load is the exception (restore.ts sets it once the pages are in the file).
        const ignoreShared = ram.memory === "file" && !ram.convert;
        const capabilities = [{ capability: "events", state: true }, ...(ignoreShared ? [{ capability: "x-ignore-shared", state: true }] : [])];
        await Promise.all([
          vp.qmp.execute("migrate-set-parameters", { "max-bandwidth": UNLIMITED_BANDWIDTH }),
          vp.qmp.execute("migrate-set-capabilities", { capabilities }),
        ]);
        phases?.mark("qmpSetup");
        return vp;
      } catch (err) {
        await vp.proc.kill();
        const said = await vp.proc.finalOutput();
        if (attempt === 0 && !relayed && /host forwarding rule|Could not set up host forwarding/i.test(said)) {
          this.log.warn("forwarded port taken; choosing another", { vmId: spec.vmId, port: hostPort });
          hostPort = await this.hostPort(paths, true);
          continue;
        }
        throw withTail(err as Error, said, "qemu");
      }
    }
  }

  /** The tenant's upstreams' names for a booting VM's environment; none when they cannot be read now (it boots without them: they are still reachable under AGENTVM_UPSTREAMS_URL). */
  private async upstreamNames(spec: VmSpec): Promise<string[]> {
    try {
      return await this.deps.egress.upstreams.names(spec.vmId);
    } catch (err) {
      this.log.warn("the tenant's upstreams could not be read for the VM's environment", { vmId: spec.vmId, err });
      return [];
    }
  }

  private spawnQemu(
    spec: VmSpec,
    paths: VmPaths,
    image: GuestImagePaths,
    hostPort: number,
    execPort: number,
    incoming: boolean,
    ram: LaunchRam,
    upstreams: readonly string[] | undefined,
  ): QemuVm {
    const { templateRam } = ram;
    // Stale unix sockets from a previous QEMU would make clients connect to nothing (the relay replaces its own).
    for (const p of [paths.qmp, paths.agent]) rmSync(p, { force: true });
    const relayed = this.host.netns;
    const launch = {
      spec,
      paths,
      accel: this.host.accel,
      hostPort,
      execPort,
      kernel: image.kernel,
      initrd: image.initrd,
      tscKhz: this.host.tscKhz,
      tcgTbMiB: this.host.tcgTbMiB,
      incoming,
      memory: ram.memory,
      ramId: ram.ramId,
      egressRelay: this.host.egressRelay,
      templateRam,
      ...(upstreams ? { upstreams } : {}),
    };
    const templateFd = templateRam ? openSync(templateRam, "r") : undefined;
    const env = { ...process.env };
    if (this.host.preload) env.LD_PRELOAD = [this.host.preload, env.LD_PRELOAD].filter(Boolean).join(" ");
    // QEMU's stderr is relayed through us (see `relayStderr`): its log shares the disk a snapshot may have filled.
    const proc = VmProcess.spawn({
      vmId: spec.vmId,
      command: this.host.binary,
      args: qemuArgs(launch),
      log: paths.qemuLog,
      output: "stderr",
      relayStderr: true,
      env,
      stubs: this.deps.stubs,
      // Its own network namespace: the forwards listen on its private loopback, relayed to root-only sockets.
      ...(relayed
        ? {
            relays: [
              { socket: paths.web, port: hostPort },
              { socket: paths.exec, port: execPort },
            ],
          }
        : {}),
    });
    const vp: QemuVm = {
      spec,
      paths,
      hostPort,
      execPort,
      relayed,
      machineArgs: machineArgs(launch),
      proc,
      qmp: undefined,
      agent: undefined,
      agentOpen: false,
      templateRam,
      templateFd,
      memory: ram.memory,
      ramId: ram.ramId,
    };
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
      void vp.proc
        .finalOutput()
        .then((said) => this.log.error("QEMU exited unexpectedly", { vmId: id, pid: vp.proc.pid, code: exit.code, signal: exit.signal, log: said }));
    }
  }

  /**
   * Ends a running VM that is not hibernated: a built image's guest flushes its disk first (briefly; a dozing one runs
   * again for it, its clock left as it is), then QEMU quits. A dozing demo just quits.
   */
  async quitRunning(vp: QemuVm): Promise<void> {
    if (vp.spec.rootImage && vp.agentOpen && !vp.proc.exit) {
      if (vp.dozing) {
        await contAfterMigration(vp.qmp!).catch((err: unknown) => this.log.warn("a dozing VM did not run again for its flush", { vmId: vp.spec.vmId, err }));
        vp.dozing = false;
      }
      await syncGuest(vp, this.log, STOP_SYNC_TIMEOUT_MS);
    }
    await this.quit(vp);
  }

  /** Asks QEMU to quit, then kills it if it does not; waits for the exit. */
  async quit(vp: QemuVm): Promise<void> {
    await vp.proc.stop(() => vp.qmp?.execute("quit", undefined, 2000), 5000);
    for (const p of [vp.paths.qmp, vp.paths.agent]) rmSync(p, { force: true });
  }

  /** Kills QEMU at once (its guest's state is being thrown away: nothing to flush or close cleanly); waits for the exit. */
  async kill(vp: QemuVm): Promise<void> {
    await vp.proc.kill();
    for (const p of [vp.paths.qmp, vp.paths.agent]) rmSync(p, { force: true });
  }

  takeWaiting(spec: VmSpec): QemuVm | undefined {
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
  async smallPages(spec: VmSpec, ram: string): Promise<void> {
    const helper = smallPagesTool();
    if (!("path" in helper)) {
      if (!this.smallPagesMissingSaid)
        this.log.warn("RAM files keep the kernel's large page-cache folios: hibernations write back more", { why: helper.error });
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
  endKept(vmId: string, vp: QemuVm, why: EvictReason): void {
    this.log.info("kept QEMU ended; the next wake restores from the files", { vmId, why, paused: vp.pausedAt !== undefined, pid: vp.proc.pid });
    const before = this.settling.get(vmId);
    const ending = (async () => {
      await before;
      await vp.proc.kill();
      await this.deps.egress.release(vmId);
      if (vp.digTicket !== undefined) this.deps.space.dig(vmId, vp.paths.ram, vp.digTicket);
      if (vp.pendingDisk) await rm(vp.pendingDisk, { force: true }); // an adopted reset standby's (standby.ts)
    })().catch((err: unknown) => this.log.warn("ending a kept QEMU failed", { vmId, err }));
    this.trackSettling(vmId, ending);
  }

  async discardWaiting(vmId: string): Promise<void> {
    const vp = this.waiting.get(vmId);
    if (!vp) return;
    this.waiting.delete(vmId);
    await vp.proc.kill();
    if (vp.pendingDisk) await rm(vp.pendingDisk, { force: true }); // an adopted reset standby's (standby.ts)
  }

  private async prestart(spec: VmSpec, ram: LaunchRam): Promise<void> {
    if (this.running.has(spec.vmId) || this.waiting.has(spec.vmId)) return;
    const vp = await this.launch(spec, await this.imageFor(spec), true, ram);
    if (this.running.has(spec.vmId) || this.waiting.has(spec.vmId)) return vp.proc.kill();
    this.waiting.set(spec.vmId, vp);
  }
}

/** Whether the file has every block of its size allocated (a RAM file reserved for a guest that may run on it). */
async function reservedWhole(file: string): Promise<boolean> {
  const st = await stat(file).catch(() => undefined);
  return st !== undefined && st.size > 0 && st.blocks * 512 >= st.size;
}

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
// A doze (pause/resume) is QMP stop/cont with the wake's clock fix (doze.ts, which also says how the rest of the driver
// treats a dozing VM).
// The class composes the phases, each in a file of its own: boot.ts (cold boot), restore.ts (a wake's restore),
// hibernate.ts, doze.ts, checkpointing.ts (checkpoints, restore and fork of one, template clones; templates by
// common/template-boot.ts), supervisor.ts (QEMU processes: launch, exits, kept QEMUs), over migration.ts and vm.ts.
import { randomBytes } from "node:crypto";
import { rm, stat } from "node:fs/promises";
import { silentLogger, type Logger } from "../../../lib/log.ts";
import type { GuestAgentClient } from "../common/guest-agent.ts";
import { readMemoryKiB } from "../common/proc.ts";
import { restoreOrBoot } from "../common/restore-or-boot.ts";
import { ExecStubs, execStubTool, privateNetwork } from "../common/exec-stubs.ts";
import { bootFromTemplate } from "../common/template-boot.ts";
import { VmTemplates } from "../common/templates.ts";
import type { BootResult, CheckpointInfo, DriverTemplate, ExecTarget, RunningVm, SnapshotResult, VmDriver, VmExit, VmSpec, WakeResult } from "../driver.ts";
import { defaultEgressConfig } from "../../egress/config.ts";
import { EgressProxy } from "../../egress/proxy.ts";
import { ensureEgressRelay } from "../../egress/relay.ts";
import { TCG_TB_MIB, vmPaths, type Accel, type MemoryMode } from "./args.ts";
import { ensureListenBacklogShim } from "./backlog.ts";
import { coldBoot, type BootDeps } from "./boot.ts";
import { materialize, takeCheckpoint, type CheckpointDeps } from "./checkpointing.ts";
import { endDozeFor, pauseVm, resumeVm } from "./doze.ts";
import { QemuHibernation } from "./hibernate.ts";
import { detectAccel, hostCpuModel, hostTscKhz, qemuVersion } from "./host.ts";
import { DEFAULT_PRESTART_KEEP_MS, DEFAULT_PRESTART_MAX, type QemuDriverOptions } from "./options.ts";
import { currentBootId, syncRamFile } from "./ram-file.ts";
import { RamSpace, ramSpaceTool } from "./ram-space.ts";
import { ResetStandbys } from "./standby.ts";
import { restoreVm, type RestoreDeps } from "./restore.ts";
import { QemuSupervisor } from "./supervisor.ts";
import { execEndpoint, openAgent, type QemuHost, type QemuVm } from "./vm.ts";
import { WaitingPool } from "./waiting.ts";

export { DEFAULT_PRESTART_KEEP_MS, DEFAULT_PRESTART_MAX, IMAGE_GUEST, type GuestImagePaths, type QemuDriverOptions } from "./options.ts";
export { guestHostname } from "./vm.ts";

export class QemuDriver implements VmDriver {
  readonly name = "qemu" as const;
  readonly isolated = true;
  readonly accel: Accel;
  readonly accelReason: string;
  /** QemuHost.netns: each QEMU in a network namespace of its own, its ports reached through root-only unix sockets. */
  readonly netns: boolean;
  readonly qemuVersion: string;
  readonly memory: MemoryMode;
  private readonly log: Logger;
  private readonly egress: EgressProxy;
  /** Waiting exec stubs QEMU is started from (QemuDriverOptions.execStubs). */
  private readonly stubs: ExecStubs | undefined;
  /** Waiting exec stubs the RAM file helper runs from (its reservation is on a wake's path). */
  private readonly helperStubs: ExecStubs | undefined;
  private readonly sup: QemuSupervisor;
  private readonly hibernation: QemuHibernation;
  private readonly bootDeps: BootDeps;
  private readonly restoreDeps: RestoreDeps;
  private readonly checkpointDeps: CheckpointDeps;
  /** RAM files reserved while awake, made sparse again while asleep (ram-space.ts). */
  private readonly space: RamSpace;
  /** Warm templates new VMs are cloned from (QemuDriverOptions.templates). */
  readonly templates: VmTemplates | undefined;
  /** Reset standbys (standby.ts), and the checkpoint each VM restored with `again` wants one of after its wake. */
  readonly standbys: ResetStandbys;
  private readonly standbyWanted = new Map<string, string>();

  constructor(opts: QemuDriverOptions) {
    const hostCpu = hostCpuModel();
    const bootId = currentBootId();
    // Made first: bounds it refuses fail the driver before QEMU is asked anything. It hands what it evicts to the supervisor.
    // A kept QEMU weighs its anonymous memory (its RAM file's pages are page cache the host can reclaim).
    const keptLimits = {
      keepMs: opts.prestartKeepMs ?? DEFAULT_PRESTART_KEEP_MS,
      max: opts.prestartMax ?? DEFAULT_PRESTART_MAX,
      maxBytes: opts.prestartMemoryBytes,
    };
    const weigh = (vp: QemuVm) => (vp.proc.pid === undefined ? 0 : (readMemoryKiB(vp.proc.pid)?.anonymous ?? 0) * 1024);
    const waiting = new WaitingPool<QemuVm>(keptLimits, (id, vp, why) => this.sup.endKept(id, vp, why), { weigh });
    const binary = opts.qemuBinary ?? "qemu-system-x86_64";
    this.memory = opts.memory ?? "stream";
    this.log = (opts.log ?? silentLogger).child({ driver: "qemu" });
    // Said first: whether a VM's ports are reachable by any local process, or only through the host (root).
    const stubTool = execStubTool();
    const isolation = opts.netns === false ? { ok: false as const, why: "turned off (QemuDriverOptions.netns)" } : privateNetwork(stubTool);
    this.netns = isolation.ok;
    if (isolation.ok) this.log.info("QEMU networking: a network namespace per VM; its ports are reachable through root-only unix sockets only");
    else
      this.log.warn("QEMU networking: ports forwarded on the host's loopback, where any local process can call a VM without the gateway", {
        why: isolation.why,
      });
    const choice = opts.accel && opts.accel !== "auto" ? { accel: opts.accel, reason: "configured" } : detectAccel();
    this.accel = choice.accel;
    this.accelReason = choice.reason;
    this.qemuVersion = qemuVersion(binary);
    const tscKhz = hostTscKhz();
    let preload: string | undefined;
    const shim = opts.listenBacklogShim ?? "auto";
    if (shim === "auto") {
      const built = ensureListenBacklogShim();
      if ("path" in built) preload = built.path;
      else this.log.warn("QEMU runs without the listen-backlog shim: bursts of connections to a VM will stall", { why: built.error });
    } else if (shim) preload = shim;
    this.egress = opts.egress ?? new EgressProxy(defaultEgressConfig, { log: this.log });
    let egressRelay: string | undefined;
    if (opts.egressRelay === undefined) {
      const relay = ensureEgressRelay();
      if ("path" in relay) egressRelay = relay.path;
      else this.log.warn("no egress relay: agents that allow egress get none", { why: relay.error });
    } else if (opts.egressRelay) egressRelay = opts.egressRelay;
    // Without waiting stubs (execStubs false) a VM in a namespace still starts through one, forked when needed.
    if ((opts.execStubs ?? true) || this.netns) {
      this.stubs = new ExecStubs({ log: this.log, tool: stubTool, size: (opts.execStubs ?? true) ? undefined : 0, netns: this.netns });
      this.stubs.fill();
    }
    // One helper stub waits (no namespace, stdout read): a wake's reservation then forks nothing.
    if ((opts.execStubs ?? true) && "path" in stubTool) {
      this.helperStubs = new ExecStubs({ log: this.log, tool: stubTool, size: 1, stdout: "pipe" });
      this.helperStubs.fill();
    }
    const host: QemuHost = {
      binary,
      accel: this.accel,
      qemuVersion: this.qemuVersion,
      hostCpu,
      tscKhz,
      tcgTbMiB: opts.tcgTbMiB ?? TCG_TB_MIB,
      memory: this.memory,
      preload,
      egressRelay,
      bootId,
      netns: this.netns,
    };
    const log = this.log;
    const helperStubs = this.helperStubs;
    const space = (this.space = new RamSpace(log, helperStubs ? (path, args) => helperStubs.start({ command: path, args, env: {} })! : undefined));
    const spaceTool = this.memory === "file" ? ramSpaceTool() : undefined;
    if (spaceTool && !("path" in spaceTool))
      log.warn("RAM files are not reserved while their VMs run: a full disk can kill a running VM (SIGBUS)", { why: spaceTool.error });
    const sup = (this.sup = new QemuSupervisor({
      host,
      log,
      image: opts.image,
      prestart: opts.prestart,
      egress: this.egress,
      stubs: this.stubs,
      waiting,
      space,
    }));
    this.hibernation = new QemuHibernation({ host, log, sup, opts, space });
    this.standbys = new ResetStandbys({
      host,
      log,
      sup,
      egress: this.egress,
      limits: keptLimits, // a standby is a kept QEMU of another kind: the same bounds, counted apart
      weigh,
      timeoutMs: opts.restoreTimeoutMs ?? 60_000,
    });
    this.bootDeps = { host, log, sup, space, bootTimeoutMs: opts.bootTimeoutMs };
    this.restoreDeps = { host, sup, opts, space };
    this.checkpointDeps = { host, log, sup, syncTimeoutMs: opts.syncTimeoutMs };
    if (opts.templates) {
      this.templates = new VmTemplates({
        root: opts.templates.root,
        log: this.log.child({ part: "templates" }),
        boot: async (spec) => (await coldBoot(this.bootDeps, spec, performance.now())).vm,
        checkpoint: (spec, vm, dir) => this.checkpoint(spec, vm, dir),
        destroy: (spec) => this.destroy(spec),
        environment: async (spec) => {
          const image = await sup.imageFor(spec);
          const [k, i] = await Promise.all([stat(image.kernel), stat(image.initrd)]);
          return JSON.stringify([this.qemuVersion, this.accel, hostCpu, this.memory, image.kernel, k.size, k.mtimeMs, image.initrd, i.size, i.mtimeMs]);
        },
      });
    }
    this.log.info("qemu driver ready", { accel: this.accel, why: this.accelReason, qemu: this.qemuVersion, memory: this.memory, tscKhz, preload });
  }

  /** A clone of the template of its kind when one is ready (its wake gives it its identity), else a cold boot. */
  async boot(spec: VmSpec): Promise<BootResult> {
    const started = performance.now();
    await this.sup.settled(spec.vmId);
    return bootFromTemplate({
      spec,
      log: this.log,
      started,
      take: async () => this.templates?.take(spec),
      clone: async (template) => {
        await materialize(this.checkpointDeps, spec, template.dir, { shareRam: this.memory === "file" ? "template" : "copy" });
      },
      wake: () => this.wake(spec),
      discard: () => this.reapProcesses(spec),
      coldBoot: async () => {
        const { vm } = await coldBoot(this.bootDeps, spec, started);
        return { vm, bootMs: performance.now() - started };
      },
    });
  }

  async hibernate(vm: RunningVm, signal?: AbortSignal): Promise<SnapshotResult> {
    const vp = this.sup.running.get(vm.spec.vmId);
    if (vp) await endDozeFor(vp, this.log, "hibernation");
    return this.hibernation.hibernate(vm, signal);
  }

  /**
   * A doze: the vCPUs stopped (QMP `stop`, confirmed by `query-status`); everything else stays (doze.ts). With
   * file-backed RAM the guest's dirty pages are then written back in the background: clean page cache is memory the
   * host may reclaim while the VM dozes (a template's clone maps its RAM privately: nothing to write back there).
   */
  async pause(vm: RunningVm): Promise<void> {
    const vp = this.sup.mustBeRunning(vm);
    await pauseVm(vp);
    if (vp.memory === "file" && !vp.templateRam)
      void syncRamFile(vmPaths(vp.spec.stateDir)).catch((err: unknown) => this.log.warn("writing a dozing VM's RAM back failed", { vmId: vm.spec.vmId, err }));
  }

  /** The doze's end: `cont`, then the guest clock set as after a wake (doze.ts). */
  resume(vm: RunningVm): Promise<{ clockFixMs: number }> {
    return resumeVm(this.sup.mustBeRunning(vm), this.log);
  }

  async wake(spec: VmSpec): Promise<WakeResult> {
    const started = performance.now();
    if (this.sup.running.has(spec.vmId)) throw new Error(`VM ${spec.vmId} is already running`);
    await this.sup.settled(spec.vmId);
    const woken = await restoreOrBoot({
      spec,
      log: this.log,
      started,
      restore: (undo) => restoreVm(this.restoreDeps, spec, undo, started),
      boot: () => coldBoot(this.bootDeps, spec, started),
    });
    // Restored to a checkpoint it is likely restored to again: the standby for that is made while this run goes on.
    const again = this.standbyWanted.get(spec.vmId);
    if (again) void this.standbys.prepare(spec, again);
    return woken;
  }

  async stop(vm: RunningVm, opts?: { discard?: boolean }): Promise<void> {
    await this.sup.settled(vm.spec.vmId);
    const vp = this.sup.running.get(vm.spec.vmId);
    if (vp && opts?.discard) await this.sup.kill(vp);
    else if (vp) await this.sup.quitRunning(vp);
    // A stop for a restore keeps the reset standby the restore may adopt; any other stop ends it.
    if (!opts?.discard) await this.forgetStandby(vm.spec.vmId);
    await this.sup.discardWaiting(vm.spec.vmId);
    await this.egress.release(vm.spec.vmId);
  }

  async destroy(spec: VmSpec): Promise<void> {
    await this.sup.settled(spec.vmId);
    await this.hibernation.ramWriteBack(spec.vmId);
    await this.space.forget(spec.vmId);
    const vp = this.sup.running.get(spec.vmId);
    if (vp) await this.sup.quit(vp);
    await this.sup.discardWaiting(spec.vmId);
    await this.forgetStandby(spec.vmId);
    await this.egress.release(spec.vmId);
    await this.reapProcesses(spec);
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
    const vp = vm && this.sup.running.get(vm.spec.vmId);
    if (vp) await endDozeFor(vp, this.log, "checkpoint");
    else await this.space.cancel(spec.vmId); // a sleeping VM's RAM file is checked against its snapshot, mtime and all
    return takeCheckpoint(this.checkpointDeps, spec, vm, dir);
  }

  /**
   * Makes the stateDir a hibernated VM whose snapshot is the checkpoint: its state, RAM file and disk copied in (each
   * under a temporary name, then renamed), new generations for the RAM file and the disk, and a manifest that binds
   * them and says `clonedFrom`, so the wake gives the guest a fresh identity. The old snapshot is gone first: a crash
   * part way leaves no snapshot (a cold boot) rather than one over the wrong files.
   */
  async restoreCheckpoint(spec: VmSpec, dir: string, opts?: { again?: boolean }): Promise<void> {
    // A reset standby of this checkpoint (standby.ts) becomes the VM's kept paused QEMU: the wake is then a `cont`.
    const standby = await this.standbys.take(spec.vmId, dir);
    let manifest;
    try {
      manifest = await materialize(this.checkpointDeps, spec, dir, { shareRam: "link" });
      if (standby) {
        if (!manifest.templateRam) throw new Error("the restored snapshot names no shared RAM file");
        await this.standbys.adopt(spec, standby, { pausedAt: `${manifest.file}:${manifest.sha256}`, templateRam: manifest.templateRam.path });
      }
    } catch (err) {
      if (standby) {
        this.log.warn("reset standby not adopted: the wake loads the checkpoint's files", { vmId: spec.vmId, err });
        await standby.proc.kill();
      }
      if (!manifest) throw err;
    }
    if (opts?.again) this.standbyWanted.set(spec.vmId, dir);
    else this.standbyWanted.delete(spec.vmId);
  }

  /** The VM is no longer restored to a checkpoint again: its reset standby, and the wish for one, end. */
  private async forgetStandby(vmId: string): Promise<void> {
    this.standbyWanted.delete(vmId);
    await this.standbys.end(vmId);
  }

  async guestCheckpointRequests(vm: RunningVm): Promise<string[]> {
    const vp = this.sup.mustBeRunning(vm);
    if (vp.dozing) return []; // a stopped guest asks for nothing; what it asked before the doze was polled then
    return vp.agent!.checkpointRequests();
  }

  /**
   * The guest's exec server through this QEMU's second forwarded port, with a key made for this QEMU and pushed through
   * the guest agent on first use (a restore's new QEMU makes and pushes a new one; the guest keeps the last it got).
   */
  async execTarget(vm: RunningVm): Promise<ExecTarget> {
    const vp = this.sup.mustBeRunning(vm);
    const key = (vp.execKey ??= randomBytes(32).toString("hex"));
    if (!vp.execKeyPushed) {
      const pushed = openAgent(vp).then(() => vp.agent!.execKey(key)); // the agent's port reopened if it closed
      vp.execKeyPushed = pushed;
      pushed.catch(() => {
        if (vp.execKeyPushed === pushed) vp.execKeyPushed = undefined;
      });
    }
    await vp.execKeyPushed;
    return { ...execEndpoint(vp), key };
  }

  /** The templates of QemuDriverOptions.templates (none when they are off); the host drops their paths before the API sees them. */
  async listTemplates(): Promise<DriverTemplate[]> {
    return (await this.templates?.list()) ?? [];
  }

  async cpuSeconds(vm: RunningVm): Promise<number> {
    return this.sup.running.get(vm.spec.vmId)?.proc.cpuSeconds() ?? 0; // not running here: nothing is using CPU for it
  }

  async guestLeases(vm: RunningVm): Promise<number> {
    const vp = this.sup.mustBeRunning(vm);
    if (vp.dozing) return vp.lastLeases ?? 0; // a stopped guest cannot take or drop one: as it last said
    vp.lastLeases = await vp.agent!.leases();
    return vp.lastLeases;
  }

  /** QEMU's run state of a running VM (`query-status`: `running`, `paused`, …), for diagnostics and tests. */
  async runState(vm: RunningVm): Promise<string> {
    return (await this.sup.mustBeRunning(vm).qmp!.execute("query-status")).status;
  }

  /** The guest agent connection of a running VM (diagnostics and tests; the driver owns it). */
  guestAgent(vm: RunningVm): GuestAgentClient {
    return this.sup.mustBeRunning(vm).agent!;
  }

  onExit(vm: RunningVm, listener: (exit: VmExit) => void): void {
    this.sup.onExit(vm, listener);
  }

  /** Host shutdown: pre-started QEMUs are killed, VMs still running are stopped (their snapshots stay). */
  async close(): Promise<void> {
    // Hibernations finish their work first: QEMUs exit, and RAM files become durable before the host goes.
    await Promise.all([...this.sup.allSettling(), ...this.hibernation.allRamWriteBacks()]);
    await this.space.cancelAll(); // a dig left half done is one the next hibernation does again
    await this.standbys.close();
    await Promise.all([...this.sup.waiting.keys()].map((id) => this.sup.discardWaiting(id)));
    await Promise.all([...this.sup.running.values()].map((vp) => this.sup.quitRunning(vp)));
    this.stubs?.close();
    this.helperStubs?.close();
    await this.egress.close();
  }

  /** The guest console (QEMU appends it): the kernel's few lines, the init's, and a built image's workload's stdout and stderr. */
  logPath(spec: VmSpec): string {
    return vmPaths(spec.stateDir).console;
  }

  /**
   * Kills a QEMU a previous fleet-agent left running for this VM (its pid file, checked against
   * /proc/<pid>/cmdline) and removes partial snapshot and drive files; the complete snapshot and the disk stay. A RAM
   * file its kept QEMU left reserved whole is dug (supervisor.ts `digLeftReserved`).
   */
  async reap(spec: VmSpec): Promise<void> {
    await this.reapProcesses(spec);
    await this.sup.digLeftReserved(spec);
  }

  /** `reap` without the RAM file's dig: what a VM about to be removed or made again needs. */
  private async reapProcesses(spec: VmSpec): Promise<void> {
    await this.sup.reap(spec);
    await this.standbys.reap(spec);
  }
}

/** The driver for this host, with the accelerator chosen by `detectAccel` unless configured. */
export function createQemuDriver(opts: QemuDriverOptions): QemuDriver {
  return new QemuDriver(opts);
}

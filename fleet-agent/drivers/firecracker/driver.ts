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
//
// doze:      PATCH /vm Paused; PATCH /vm Resumed → clock fix over the vsock channel kept through the pause (doze.ts).
//
// Where each phase is: boot.ts (cold boot, a built image's drives, the jailer's chroot), restore.ts (wake: load, vsock
// and tap overrides, a clone's identity; the clock fix is common/restore-or-boot.ts), hibernate.ts, doze.ts, checkpoint-take.ts
// and checkpoint-restore.ts (checkpoints, forks), templates.ts (which template a boot clones, else boots cold),
// supervisor.ts (the Firecracker and jailer processes, their exits, leftovers), guest.ts (the guest agent of a running
// VM), image-files.ts (a built image's drive files), options.ts and paths.ts. This class composes them behind
// VmDriver; each phase gets only the dependencies it names.
import { randomBytes } from "node:crypto";
import { rm } from "node:fs/promises";
import { silentLogger, type Logger } from "../../../lib/log.ts";
import { processFiles } from "../common/state-dir.ts";
import { VmTemplates } from "../common/templates.ts";
import {
  EXEC_GUEST_PORT,
  type BootResult,
  type CheckpointInfo,
  type DriverTemplate,
  type ExecTarget,
  type RunningVm,
  type SnapshotResult,
  type VmDriver,
  type VmExit,
  type VmSpec,
  type WakeResult,
} from "../driver.ts";
import { coldBoot, type BootDeps } from "./boot.ts";
import { restoreCheckpoint, type RestoreCheckpointDeps } from "./checkpoint-restore.ts";
import { takeCheckpoint, type TakeCheckpointDeps } from "./checkpoint-take.ts";
import { endDozeFor, pauseVm, resumeVm, type DozeDeps } from "./doze.ts";
import { askAgent } from "./guest.ts";
import { hibernate, type HibernateDeps } from "./hibernate.ts";
import { checkFirecrackerHost, type FirecrackerHostFacts } from "./host.ts";
import { recordedNet, releaseNet, runNetScript } from "./net.ts";
import { guestAgentPort, type FirecrackerDriverOptions } from "./options.ts";
import type { VmPaths } from "./paths.ts";
import { wake, type RestoreDeps } from "./restore.ts";
import { FirecrackerProcesses } from "./supervisor.ts";
import { bootFromTemplate } from "../common/template-boot.ts";
import { templateEnvironment, usableTemplate, type TemplateEnvironmentDeps, type TemplateSlotDeps } from "./templates.ts";

export { BASE_BOOT_ARGS, GUEST_CID, IMAGE_GUEST, type FirecrackerDriverOptions, type FirecrackerImage, type JailerOptions } from "./options.ts";
export { firecrackerId, vmPaths, type VmPaths } from "./paths.ts";

/** What the phases share: each takes the part of it that its `…Deps` names. */
type PhaseDeps = BootDeps & RestoreDeps & HibernateDeps & TakeCheckpointDeps & RestoreCheckpointDeps & TemplateSlotDeps & TemplateEnvironmentDeps;

export class FirecrackerDriver implements VmDriver {
  readonly name = "firecracker" as const;
  readonly isolated = true;
  /** Warm templates new VMs are cloned from (FirecrackerDriverOptions.templates). */
  readonly templates: VmTemplates | undefined;
  private readonly opts: FirecrackerDriverOptions;
  private readonly binary: string;
  private readonly log: Logger;
  private readonly vms: FirecrackerProcesses;
  private readonly deps: PhaseDeps;
  private host: FirecrackerHostFacts | undefined;

  constructor(opts: FirecrackerDriverOptions) {
    this.opts = opts;
    this.binary = opts.binary ?? "firecracker";
    this.log = (opts.logger ?? silentLogger).child({ driver: "firecracker" });
    this.vms = new FirecrackerProcesses({
      binary: this.binary,
      jailer: opts.jailer,
      workloadPort: opts.workloadPort,
      stopGraceMs: opts.stopGraceMs,
      log: this.log,
    });
    if (opts.templates) {
      this.templates = new VmTemplates({
        root: opts.templates.root,
        log: this.log.child({ part: "templates" }),
        boot: async (spec) => (await coldBoot(this.deps, spec, performance.now())).vm,
        checkpoint: (spec, vm, dir) => this.checkpoint(spec, vm, dir),
        destroy: (spec) => this.destroy(spec),
        environment: (spec) => templateEnvironment(this.deps, spec),
      });
    }
    this.deps = {
      opts,
      log: this.log,
      agentPort: guestAgentPort(opts),
      vms: this.vms,
      ready: () => this.ready(),
      coldBoot: (spec, started) => coldBoot(this.deps, spec, started),
      unsupportedLoadFields: new Set<string>(),
      templates: this.templates,
    };
  }

  /** The readiness check (cached once it passes): refuses with a FirecrackerHostError naming what is missing. */
  async ready(): Promise<FirecrackerHostFacts> {
    this.host ??= await checkFirecrackerHost({ binary: this.binary, ...this.opts.hostCheck, ...(this.opts.jailer ? { jailer: this.opts.jailer.binary } : {}) });
    return this.host;
  }

  /** The file layout of one VM (depends on whether the jailer is used). */
  paths(spec: VmSpec): VmPaths {
    return this.vms.paths(spec);
  }

  /** A clone of the template of its kind when one is usable (its wake gives it its identity), else a cold boot. */
  async boot(spec: VmSpec): Promise<BootResult> {
    const started = performance.now();
    await this.ready(); // a host that cannot run Firecracker refuses before any template is looked at
    return bootFromTemplate({
      spec,
      log: this.log,
      started,
      take: () => usableTemplate(this.deps, spec),
      clone: (template) => this.restoreCheckpoint(spec, template.dir),
      wake: () => this.wake(spec),
      discard: async () => {
        const live = this.vms.get(spec.vmId);
        if (live) await this.vms.kill(live);
        await this.reap(spec);
      },
      // This VM holds the template's network slot now (restored or not): the next clone needs a template of its own.
      afterClone: () => void this.templates!.renew(spec).catch((err: unknown) => this.log.warn("template renewal not started", { vmId: spec.vmId, err })),
      coldBoot: () => coldBoot(this.deps, spec, started),
    });
  }

  async hibernate(vm: RunningVm, signal?: AbortSignal): Promise<SnapshotResult> {
    const live = this.vms.get(vm.spec.vmId);
    if (live) await endDozeFor(live, this.dozeDeps(), "hibernation");
    return hibernate(this.deps, vm, signal);
  }

  /** A doze: PATCH /vm Paused (doze.ts). */
  pause(vm: RunningVm): Promise<void> {
    return pauseVm(this.vms.owned(vm));
  }

  /** The doze's end: PATCH /vm Resumed, then the guest clock set as after a wake (doze.ts). */
  resume(vm: RunningVm): Promise<{ clockFixMs: number }> {
    return resumeVm(this.vms.owned(vm), this.dozeDeps());
  }

  private dozeDeps(): DozeDeps {
    return { log: this.log, agentPort: this.deps.agentPort, clockTargetMs: this.opts.clockTargetMs ?? 50 };
  }

  wake(spec: VmSpec): Promise<WakeResult> {
    return wake(this.deps, spec);
  }

  /** An immutable copy of the VM (checkpoint-take.ts): paused for it while running, copied from its snapshot while hibernated. */
  async checkpoint(spec: VmSpec, vm: RunningVm | undefined, dir: string): Promise<CheckpointInfo> {
    const live = vm && this.vms.get(vm.spec.vmId);
    if (live) await endDozeFor(live, this.dozeDeps(), "checkpoint");
    return takeCheckpoint(this.deps, spec, vm, dir);
  }

  /** Makes the stateDir a hibernated VM whose snapshot is the checkpoint (checkpoint-restore.ts); the next wake loads it. */
  restoreCheckpoint(spec: VmSpec, dir: string): Promise<void> {
    return restoreCheckpoint(this.deps, spec, dir);
  }

  /** The templates of FirecrackerDriverOptions.templates (none when they are off); the host drops their paths before the API sees them. */
  async listTemplates(): Promise<DriverTemplate[]> {
    return (await this.templates?.list()) ?? [];
  }

  async guestCheckpointRequests(vm: RunningVm): Promise<string[]> {
    const live = this.vms.owned(vm);
    if (live.dozing) return []; // a stopped guest asks for nothing; what it asked before the doze was polled then
    return askAgent(live, this.deps.agentPort, (agent) => agent.checkpointRequests());
  }

  /**
   * The guest's exec server at the guest's own address (its tap network), port 1025, with a key made for this
   * Firecracker process and pushed over the vsock guest agent on first use (a restore's new process pushes a new one).
   */
  async execTarget(vm: RunningVm): Promise<ExecTarget> {
    const live = this.vms.owned(vm);
    const key = (live.execKey ??= randomBytes(32).toString("hex"));
    if (!live.execKeyPushed) {
      const pushed = askAgent(live, this.deps.agentPort, (agent) => agent.execKey(key));
      live.execKeyPushed = pushed;
      pushed.catch(() => {
        if (live.execKeyPushed === pushed) live.execKeyPushed = undefined;
      });
    }
    await live.execKeyPushed;
    return { host: live.net.guestIp, port: EXEC_GUEST_PORT, key };
  }

  stop(vm: RunningVm): Promise<void> {
    return this.vms.stop(vm);
  }

  async destroy(spec: VmSpec): Promise<void> {
    const live = this.vms.get(spec.vmId);
    if (live) await this.vms.kill(live);
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
    return this.vms.get(vm.spec.vmId)?.proc.cpuSeconds() ?? 0; // not running here: nothing is using CPU for it
  }

  async guestLeases(vm: RunningVm): Promise<number> {
    const live = this.vms.owned(vm);
    if (live.dozing) return live.lastLeases ?? 0; // a stopped guest cannot take or drop one: as it last said
    live.lastLeases = await askAgent(live, this.deps.agentPort, (agent) => agent.leases());
    return live.lastLeases;
  }

  onExit(vm: RunningVm, listener: (exit: VmExit) => void): void {
    this.vms.onExit(vm, listener);
  }

  logPath(spec: VmSpec): string {
    return processFiles(spec.stateDir, "firecracker").log;
  }

  reap(spec: VmSpec): Promise<void> {
    return this.vms.reap(spec);
  }

  /** Ends every VM this driver started (fleet-agent shutdown without hibernation). */
  close(): Promise<void> {
    return this.vms.killAll();
  }
}

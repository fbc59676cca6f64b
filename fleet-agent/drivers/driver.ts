// The one interface every hypervisor driver implements (process, qemu, firecracker).
import type { PortEndpoint } from "../../lib/node-net.ts";
import type { DesktopSize, WakeTier } from "../../contracts/agent.ts";
import type { ImageArtifact } from "../../contracts/image.ts";
import type { TemplateView } from "../../contracts/fleet.ts";

export type DriverName = "process" | "qemu" | "firecracker";

export interface VmSpec {
  vmId: string;
  agentId: string;
  /** `demo` for the built-in demo workload; for the process driver also any shell command given PORT. */
  image: string;
  vcpus: number;
  memMiB: number;
  /** VMs get no outbound network unless this is set. */
  allowEgress: boolean;
  /** Directory owned by this VM: snapshots, sockets, pid files, logs, leases. Survives fleet-agent restarts. */
  stateDir: string;
  /**
   * A built image to run instead of a built-in one (`image` then holds its digest). The VM gets the image's root
   * filesystem read-only and a persistent disk of its own (`diskMiB`, in `stateDir`) as the writable layer over it.
   */
  rootImage?: ImageArtifact;
  /** Size of the agent's persistent disk, MiB (with `rootImage`). */
  diskMiB?: number;
  /** A desktop agent's display size (`AGENTVM_DESKTOP_SIZE` in its entrypoint's environment). */
  desktop?: DesktopSize;
}

/**
 * Where the workload's HTTP server is reachable from the host: TCP, or (`socketPath`) a root-only unix socket relayed
 * into the VM's own network namespace (a QEMU's, drivers/common/exec-stub.c), `host:port` then naming it only.
 */
export type VmEndpoint = PortEndpoint;

export interface RunningVm {
  spec: VmSpec;
  endpoint: VmEndpoint;
  /** Host process that runs the VM (QEMU, Firecracker, or the workload itself). */
  pid: number | undefined;
}

export interface BootResult {
  vm: RunningVm;
  bootMs: number;
  /** Started as a clone of this template (common/templates.ts) rather than booted cold. */
  template?: string;
}

export interface SnapshotResult {
  /** false when the snapshot was cancelled by the signal and the VM is still running. */
  completed: boolean;
  snapshotMs: number;
  bytes: number;
}

export interface WakeTimings {
  /**
   * Driver's own time from the wake decision to a running restored VM; for a cold-boot fallback (mode `boot`), the
   * time the failed restore attempt took before the boot began.
   */
  restoreMs: number;
  /** Mode `boot` only: the driver's time from the wake decision to the booted VM (the failed attempt included). */
  bootMs?: number;
  /** Setting and verifying the guest clock. */
  clockFixMs: number;
  /** Guest wall clock minus host wall clock before and after the fix (ms, signed). */
  skewBeforeMs: number;
  skewAfterMs: number;
}

export interface WakeResult {
  vm: RunningVm;
  /** restore = from the snapshot; boot = cold boot (no usable snapshot). */
  mode: "restore" | "boot";
  timings: WakeTimings;
  /** Why a restore was not possible, when mode is boot. */
  fallbackReason?: string;
  /**
   * Mode `restore`: when the state it brought back was taken (ms since the epoch; a snapshot's, or a frozen process's
   * freeze). The host tells a rollback when it is older than the agent's last run (host/rollbacks.ts); absent: unknown.
   */
  snapshotAt?: number;
  /** A restore: the sleep tier it woke from (the driver's to say; absent where it has one tier). */
  tier?: WakeTier;
}

/** An immutable copy of a VM's memory and disk: a checkpoint (a template is one). */
export interface CheckpointInfo {
  /** Bytes its files hold (their sizes; with reflinks most of them are shared with the VM's own files). */
  bytes: number;
  /** How long the guest was paused for it, ms (0 when it was taken from a hibernated VM's snapshot). */
  pausedMs: number;
  /** The whole time it took, ms. */
  ms: number;
  /** How its files were made: `reflink` (copy-on-write, blocks shared) or `copy` (every byte written again). */
  copy: "reflink" | "copy";
}

/** A warm template a driver keeps (common/templates.ts): the API's view without the host, which the host adds. */
export type DriverTemplate = Omit<TemplateView, "hostId">;

/** The guest port the exec server (fleet-agent/guest/guest-exec/) listens on (TCP, and vsock where the guest has it). */
export const EXEC_GUEST_PORT = 1025;

/** Where a VM's exec server (fleet-agent/guest/guest-exec/) answers, and the key each of its requests must carry. */
export interface ExecTarget {
  host: string;
  port: number;
  /** A unix socket to connect to instead of `host:port` (as VmEndpoint's). */
  socketPath?: string | undefined;
  /** 64 hex: sent as `x-agentvm-exec-key`; never leaves the host. */
  key: string;
}

export interface VmExit {
  code: number | null;
  signal: string | null;
}

export interface VmDriver {
  readonly name: DriverName;
  /** False for the process driver: workloads run as plain host processes. */
  readonly isolated: boolean;
  /** Cold boot; resolves once the workload answers HTTP on its endpoint. */
  boot(spec: VmSpec): Promise<BootResult>;
  /**
   * Snapshot the VM and release its host resources. When `signal` aborts before the snapshot is
   * complete the driver cancels it where it can and resolves `{completed:false}` with the VM running.
   * When the snapshot cannot be taken it rejects with the VM running as before and the previous snapshot
   * intact (SnapshotNoSpace of common/snapshot-space.ts when it does not fit, checked before writing where
   * the driver can); a VM that cannot be resumed is ended and reported through `onExit`.
   */
  hibernate(vm: RunningVm, signal?: AbortSignal): Promise<SnapshotResult>;
  /** Restore from the last complete snapshot and fix the guest clock; falls back to a cold boot. */
  wake(spec: VmSpec): Promise<WakeResult>;
  /**
   * Keeps an immutable copy of the VM's memory and disk in `dir` (created here; it must not exist). A running VM
   * (`vm` given) is paused while its state is written and runs on after it, its clock fixed; a hibernated one (`vm`
   * undefined) is copied from its snapshot. Rejects with AppError `conflict` when there is no state to copy (it never
   * ran, or a crash consumed its snapshot). Absent: the driver cannot (the process driver: no memory to keep).
   */
  checkpoint?(spec: VmSpec, vm: RunningVm | undefined, dir: string): Promise<CheckpointInfo>;
  /**
   * Makes `spec.stateDir`, whose VM must not be running, a hibernated VM whose snapshot is the checkpoint in `dir`
   * (an earlier snapshot and disk there are replaced; the checkpoint is left as it is). The next `wake` restores it
   * and gives the guest a fresh identity (agent id, hostname, entropy, the clone marker) before it returns. Restoring
   * an agent to its own checkpoint and forking a new agent from one are both this. `again`: the VM is likely restored
   * to this checkpoint again (a reset between RL episodes): the driver may keep something warm for that after the
   * next wake (the qemu driver: a reset standby, qemu/standby.ts).
   */
  restoreCheckpoint?(spec: VmSpec, dir: string, opts?: { again?: boolean }): Promise<void>;
  /** Checkpoint names the workload asked for from inside since the last call (each once); absent: it cannot ask. */
  guestCheckpointRequests?(vm: RunningVm): Promise<string[]>;
  /** The warm templates new VMs are cloned from (ready, building, recently failed); absent: the driver keeps none. */
  listTemplates?(): Promise<DriverTemplate[]>;
  /**
   * Stops the VM's vCPUs (QEMU `stop`, Firecracker `PATCH /vm Paused`, the process driver SIGSTOP of the workload's
   * group) and keeps everything else: its process, memory, network state and every open connection. A doze.
   * Absent: the driver cannot (its VMs never doze).
   */
  pause?(vm: RunningVm): Promise<void>;
  /**
   * Runs a paused VM again and fixes its guest clock (it stopped with the vCPUs) before it resolves; answers how long
   * the clock fix took (ms, 0 where the driver needs none).
   */
  resume?(vm: RunningVm): Promise<{ clockFixMs: number }>;
  /**
   * Where the VM's exec server answers (commands, files, background processes inside the agent's root), with the key
   * its requests carry; pushes the key to the guest first when this run of the VM has not had it. Rejects with AppError
   * `guest_outdated` when the guest has no exec server. Absent: the driver cannot (501 `exec_unsupported`).
   */
  execTarget?(vm: RunningVm): Promise<ExecTarget>;
  /**
   * Stop the VM without a snapshot (shutdown, delete). The snapshot, if any, is kept. `discard`: what the VM did since
   * is thrown away (a restore of a checkpoint follows), so the guest is not asked to flush first and may be killed.
   */
  stop(vm: RunningVm, opts?: { discard?: boolean }): Promise<void>;
  /** Remove everything the VM left on disk. */
  destroy(spec: VmSpec): Promise<void>;
  /** Cumulative CPU seconds used by the VM's host process, for the idle rule. */
  cpuSeconds(vm: RunningVm): Promise<number>;
  /** Keep-awake leases the guest itself holds right now. */
  guestLeases(vm: RunningVm): Promise<number>;
  /** Called once if the VM's process exits without being told to. */
  onExit(vm: RunningVm, listener: (exit: VmExit) => void): void;
  /**
   * The file the VM's console and its workload's stdout/stderr go to (the agent's log). The writer keeps it open
   * in append mode, so the host may rotate it by copying it aside and truncating it.
   */
  logPath(spec: VmSpec): string;
  /** Cleans up VM processes a previous fleet-agent left running in `stateDir` (pid files). */
  reap(spec: VmSpec): Promise<void>;
  /** Releases everything the driver still holds (frozen processes, pre-started VMs) at host shutdown. */
  close(): Promise<void>;
}

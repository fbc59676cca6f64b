// What every component knows of an agent's VM: the spec a host runs, VM states, wake and sleep reasons, wake timings.

/**
 * `dozing`: the VM's process and connections stay but its vCPUs are stopped, because every call it has open waits on
 * an outbound call through the host's egress proxy (issue 30; `fleet-agent/host/doze.ts`). Not active time.
 */
export type VmState = "creating" | "booting" | "running" | "dozing" | "snapshotting" | "hibernated" | "restoring" | "stopped" | "failed" | "destroyed";

/**
 * Why a VM woke (or booted): a call to the agent (`request`), a webhook, the API (`api`: a wake, a lease, exec, files),
 * the desktop API or its viewer (`desktop`: a screenshot, actions, a viewer's socket), or `boot`.
 */
export type WakeReason = "request" | "webhook" | "api" | "desktop" | "boot";
export const wakeReasons: readonly WakeReason[] = ["request", "webhook", "api", "desktop", "boot"];
/** Why a VM stopped being active. */
export type SleepReason = "idle" | "api" | "crash" | "shutdown" | "delete" | "moved" | "drain";
/**
 * Why the VM event log recorded a transition: a wake or sleep reason, `cancelled` (a request arrived during the
 * snapshot), or `hibernate_failed` (the snapshot could not be written: the VM went back to running, its previous
 * snapshot kept; the transition's `detail` says why, e.g. `code: "ENOSPC"` with the bytes needed and free).
 */
/**
 * Besides a host's own transitions, a gateway writes two into an agent's event log: `moved` (placement moved it to
 * another host: a drain, a lost host) and `host_lost` (its host's lease ended while it was awake: the row stops).
 */
export type TransitionReason = WakeReason | SleepReason | "cancelled" | "hibernate_failed" | DozeReason | ResumeReason | "host_lost";

/** One VM per agent per host: its id is derived from the agent's, so meters and logs line up across restarts and hosts. */
export function vmIdFor(agentId: string): string {
  return `vm_${agentId.replace(/^agt_/, "")}`;
}
/** Why a running VM dozed: every open call waits on an outbound call (the doze rule of fleet-agent/host/doze.ts). */
export type DozeReason = "doze";
/**
 * Why a dozing VM runs again: an outbound response's first byte (`upstream`), a new inbound call (`request`), a webhook,
 * an API wake or lease (`api`), a desktop call (`desktop`), or `DOZE_MAX_MS` (`doze_max`, the guest's own timers get a turn).
 */
export type ResumeReason = "upstream" | "request" | "webhook" | "api" | "desktop" | "doze_max";

/** An agent's X display size, pixels (docs/desktop.md): within `desktopLimits`. */
export interface DesktopSize {
  width: number;
  height: number;
}

/** The display sizes an agent may have, and the one a desktop image's agent gets when it names none. */
export const desktopLimits = { minWidth: 320, maxWidth: 3840, minHeight: 200, maxHeight: 2160, defaultSize: { width: 1024, height: 768 } } as const;

/** Whether `v` is a `DesktopSize` within `desktopLimits`. */
export function isDesktopSize(v: unknown): v is DesktopSize {
  if (typeof v !== "object" || v === null) return false;
  const { width, height } = v as Record<string, unknown>;
  const L = desktopLimits;
  return (
    Number.isInteger(width) &&
    Number.isInteger(height) &&
    (width as number) >= L.minWidth &&
    (width as number) <= L.maxWidth &&
    (height as number) >= L.minHeight &&
    (height as number) <= L.maxHeight
  );
}

/** The part of an agent row a host needs to run it. */
export interface AgentSpec {
  id: string;
  tenantId: string;
  /** A built-in image (`demo`) or a built image's digest (`sha256:…`, see contracts/image.ts). */
  image: string;
  vcpus: number;
  memMiB: number;
  /** The agent's persistent disk, MiB: the writable layer over a built image (kept across hibernate, restarts, cold boots). */
  diskMiB?: number;
  idleTimeoutMs: number;
  streamIdleMs: number;
  allowEgress: boolean;
  /** A desktop agent's display size: its image's entrypoint sees it as `AGENTVM_DESKTOP_SIZE=<width>x<height>`. */
  desktop?: DesktopSize;
  /**
   * The lease generation the gateway placed the agent under (`agents.generation`; 0 or absent: never moved). A host
   * refuses a call of an older generation than its own (the caller's placement is stale) and discards its copy of the
   * agent on a newer one (the agent moved away and back: the store's snapshot is newer than this host's).
   */
  generation?: number;
}

/**
 * What a wake cost, in ms, as the host measured it. Only the parts the wake had are present: a warm call none,
 * a restore `restoreMs`/`clockFixMs` and the guest clock's skew before and after the fix, a cold boot `bootMs`.
 * `firstByteMs` (wake start to the first response byte) is recorded on the run afterwards.
 */
export interface WakeTimings {
  queuedMs?: number;
  restoreMs?: number;
  clockFixMs?: number;
  bootMs?: number;
  skewBeforeMs?: number;
  skewAfterMs?: number;
  firstByteMs?: number;
  /**
   * Awake time the agent lost, ms: set on a wake that restored a snapshot older than the agent's last run (a host or
   * VM crash, a failed hibernation at shutdown: what it did since that snapshot is gone), from that run's wake to its
   * last known instant (an upper bound when the host died before the meter recorded any of it). Callers see it as
   * `x-wake-rollback`.
   */
  rollbackMs?: number;
  /** A restore's sleep tier (not a time: reports list `wakeTimingKeys`). */
  tier?: WakeTier;
}

/**
 * Where a restored agent slept: `kept`, its QEMU itself, stopped (a wake is `cont` and the clock fix); `prestarted`, a
 * QEMU started ahead waiting for its state (the load, no process start); `files`, nothing but its files (a new process).
 */
export type WakeTier = "kept" | "prestarted" | "files";

/** The response header of a wake that rolled the agent back: `x-wake-rollback: <WakeTimings.rollbackMs>`. */
export const rollbackHeader = "x-wake-rollback";

/** Every key of `WakeTimings`, in the order reports show them. */
export const wakeTimingKeys = [
  "queuedMs",
  "restoreMs",
  "clockFixMs",
  "firstByteMs",
  "bootMs",
  "skewBeforeMs",
  "skewAfterMs",
  "rollbackMs",
] as const satisfies readonly (keyof WakeTimings)[];

/** What a transition cost, as the VM event log keeps it: a wake's parts and its total (`wakeMs`), or a snapshot's time and size (billing prices snapshot storage from `snapshotBytes`). */
export interface TransitionTimings extends WakeTimings {
  wakeMs?: number;
  /** A resume from `dozing`: how long the VM dozed (its clock fix is `clockFixMs`). */
  dozeMs?: number;
  snapshotMs?: number;
  snapshotBytes?: number;
}

export interface WakeInfo {
  /** warm = already running; restore = from snapshot; boot = cold boot. */
  wake: "warm" | "restore" | "boot";
  runId: string;
  timings: WakeTimings;
}

export interface VmStatus {
  agentId: string;
  vmId: string;
  state: VmState;
  inFlight: number;
  leases: number;
  runId: string | undefined;
  lastWakeAt: number | undefined;
  lastActivityAt: number | undefined;
  /** Set while hibernating this VM keeps failing (the VM stays awake); cleared by the next successful hibernate. */
  lastHibernateError?: HibernateFailure;
}

/** The last failed hibernate of a VM that is still awake because of it. */
export interface HibernateFailure {
  /** Wall clock of the failure, ms since the epoch. */
  at: number;
  message: string;
  /** `ENOSPC` when the snapshot did not fit on the state directory's filesystem. */
  code?: string;
  /** Bytes the snapshot needs free (at most: guest memory plus a margin) and bytes that were free, when known. */
  neededBytes?: number;
  freeBytes?: number;
  /** Failed attempts in a row. */
  attempts: number;
  /** Wall clock before which the idle reaper does not try again, ms since the epoch. */
  retryAt: number;
}

/** A keep-awake lease taken through the API. */
export interface Lease {
  leaseId: string;
  /** Wall clock, ms since the epoch. */
  expiresAt: number;
}

// What the rest of the system sees of a host: the agent spec it runs, VM states, wake reasons, activity for meters.

export type VmState = "creating" | "booting" | "running" | "snapshotting" | "hibernated" | "restoring" | "stopped" | "failed" | "destroyed";

/** Why a VM woke (or booted). */
export type WakeReason = "request" | "webhook" | "api" | "boot";
/** Why a VM stopped being active. */
export type SleepReason = "idle" | "api" | "crash" | "shutdown" | "delete";
export type TransitionReason = WakeReason | SleepReason | "cancelled";

/** The part of an agent row a host needs to run it. */
export interface AgentSpec {
  id: string;
  tenantId: string;
  image: string;
  vcpus: number;
  memMiB: number;
  idleTimeoutMs: number;
  streamIdleMs: number;
  allowEgress: boolean;
}

export interface WakeInfo {
  /** warm = already running; restore = from snapshot; boot = cold boot. */
  wake: "warm" | "restore" | "boot";
  runId: string;
  /** Millisecond timings: queuedMs, restoreMs, clockFixMs, bootMs, skewBeforeMs, skewAfterMs. */
  timings: Record<string, number>;
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
}

/** A VM became active (running) or stopped being active: what meters are cut from. */
export interface ActivityStart {
  /** Host wall clock (ms since epoch) and host monotonic clock (ms) at the transition. */
  at: number;
  mono: number;
  hostId: string;
  vmId: string;
  agentId: string;
  tenantId: string;
  runId: string;
  vcpus: number;
  memMiB: number;
  reason: WakeReason;
}

export interface ActivityEnd {
  at: number;
  mono: number;
  vmId: string;
  reason: SleepReason;
}

export interface ActivityListener {
  active(e: ActivityStart): void;
  inactive(e: ActivityEnd): void;
}

// What the host tells its meter: a VM became active (running) or stopped being active.
import type { SleepReason, WakeReason } from "../contracts/agent.ts";

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

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

/** A running VM dozed (`dozing: true`) or ran again: the run goes on, its time is cut into a segment of the other state. */
export interface ActivityDoze {
  at: number;
  mono: number;
  vmId: string;
  dozing: boolean;
}

export interface ActivityListener {
  active(e: ActivityStart): void;
  inactive(e: ActivityEnd): void;
  /** Between `active` and `inactive`: the VM dozes or runs again (fleet-agent/host/doze.ts). Absent: a listener that does not tell them apart. */
  doze?(e: ActivityDoze): void;
  /** The last instant (ms since the epoch) it recorded `vmId` awake in run `runId`, kept across restarts; absent: it keeps none. */
  lastAwakeAt?(vmId: string, runId: string): number | undefined;
}

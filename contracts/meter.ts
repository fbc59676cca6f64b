// The meter segment: one closed, half-open interval of a VM being active, as spooled on the host and shipped to billing.
import type { SleepReason, WakeReason } from "./agent.ts";

/** Why a segment starts: the run's wake reason for its first segment, `heartbeat` for every continuation. */
export type SegmentStartReason = WakeReason | "heartbeat" | "doze" | "resume";
/** Why a segment ends: the VM stopped being active (the sleep reason), or the periodic `heartbeat` cut. */
export type SegmentEndReason = SleepReason | "heartbeat" | "doze" | "resume";

export const segmentStartReasons: readonly SegmentStartReason[] = ["request", "webhook", "api", "desktop", "boot", "heartbeat", "doze", "resume"];
/** Every end reason, checked both ways: a sleep reason added to contracts/agent.ts and not here fails to compile. */
const endReasonSet = { idle: 1, api: 1, crash: 1, heartbeat: 1, shutdown: 1, delete: 1, moved: 1, drain: 1, doze: 1, resume: 1 } satisfies Record<
  SegmentEndReason,
  1
>;
export const segmentEndReasons: readonly SegmentEndReason[] = Object.keys(endReasonSet) as SegmentEndReason[];

export interface MeterSegment {
  /** `hostId:vmId:seq`, deterministic: the same segment always has the same id, so billing can count it once. */
  id: string;
  hostId: string;
  vmId: string;
  /** Per-VM sequence number, increasing across meter restarts. */
  seq: number;
  tenantId: string;
  agentId: string;
  runId: string;
  /** ISO 8601 UTC with milliseconds; `[startedAt, endedAt)`. */
  startedAt: string;
  endedAt: string;
  vcpus: number;
  memMiB: number;
  startReason: SegmentStartReason;
  endReason: SegmentEndReason;
  /**
   * `dozing`: the VM's vCPUs were stopped while every open call waited on an outbound call (priced apart: no vCPU by
   * default, memory at the snapshot rate). Absent: `active` (so segments spooled before dozing existed stay valid).
   * A run's segments alternate: an active one ends `doze`, the dozing one starts `doze` and ends `resume`.
   */
  state?: SegmentState;
}

export type SegmentState = "active" | "dozing";

export function segmentId(hostId: string, vmId: string, seq: number): string {
  return `${hostId}:${vmId}:${seq}`;
}

/** What billing answers for a batch: every id lands in exactly one list. */
export interface IngestResult {
  /** Newly counted. */
  accepted: string[];
  /** Already counted with an identical body (a retry): safe to drop from the spool. */
  duplicates: string[];
  /** Refused for good (invalid, or an id reused with a different body); retrying will not help. */
  rejected: { id: string; code: string; message: string }[];
}

/** Where a host's meter ships segments: billing in the same process, or over HTTP. Throws when the batch may not have arrived. */
export interface SegmentSink {
  ship(batch: MeterSegment[]): Promise<IngestResult>;
}

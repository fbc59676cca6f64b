// Per-segment checks at ingest: shape, id, time order, clock sanity and size limits, each with its own error code.
import {
  segmentEndReasons,
  segmentStartReasons,
  type MeterSegment,
  type SegmentEndReason,
  type SegmentStartReason,
  type SegmentState,
} from "../contracts/meter.ts";

export const segmentLimits = {
  /** A meter cuts at least every heartbeat (10 s by default); an hour-long segment means a broken meter. */
  maxDurationMs: 3_600_000,
  /** Segments may end at most this far ahead of billing's clock (host clocks drift; more is a broken clock). */
  maxFutureMs: 5 * 60_000,
  maxVcpus: 64,
  /** 1 TiB. */
  maxMemMiB: 1_048_576,
  /** Segments per batch, for one request or one ingest call. */
  maxBatch: 10_000,
} as const;

/** A segment that passed validation, in the units billing computes with (its instants kept as received). */
export interface ValidSegment extends Omit<MeterSegment, "vmId" | "seq" | "state"> {
  startMs: number;
  endMs: number;
  /** Always said: a segment shipped without one (as every segment before dozing existed) is `active`. */
  state: SegmentState;
}

export interface SegmentRejection {
  id: string;
  code: string;
  message: string;
}

/** Ids are opaque but plain: no `:` inside a part (it separates id parts), nothing COPY or CSV would need to escape. */
const partPattern = /^[A-Za-z0-9_.-]{1,100}$/;

const startReasons = new Set<string>(segmentStartReasons);
const endReasons = new Set<string>(segmentEndReasons);

function digits(s: string, from: number, n: number): number {
  let v = 0;
  for (let i = from; i < from + n; i++) {
    const c = s.charCodeAt(i) - 48;
    if (c < 0 || c > 9) return -1;
    v = v * 10 + c;
  }
  return v;
}

/**
 * `YYYY-MM-DDTHH:MM:SS[.f{1,3}]Z` → ms since the epoch, field by field (this runs twice per segment at
 * ingest, where Date.parse plus a regex cost several times more). Out-of-range fields are refused.
 */
export function parseUtcInstant(v: unknown): number | undefined {
  if (typeof v !== "string") return undefined;
  const len = v.length;
  if (len < 20 || len > 24 || v.charCodeAt(len - 1) !== 90 /* Z */) return undefined;
  if (v[4] !== "-" || v[7] !== "-" || v[10] !== "T" || v[13] !== ":" || v[16] !== ":") return undefined;
  const year = digits(v, 0, 4);
  const month = digits(v, 5, 2);
  const day = digits(v, 8, 2);
  const hour = digits(v, 11, 2);
  const minute = digits(v, 14, 2);
  const second = digits(v, 17, 2);
  let ms = 0;
  if (len > 20) {
    if (v[19] !== "." || len === 21) return undefined;
    const frac = digits(v, 20, len - 21);
    if (frac < 0) return undefined;
    ms = len === 22 ? frac * 100 : len === 23 ? frac * 10 : frac;
  }
  if (year < 1970 || month < 1 || month > 12 || day < 1 || hour < 0 || hour > 23 || minute < 0 || minute > 59 || second < 0 || second > 59) return undefined;
  // Date.UTC would roll 2026-02-30 over into March: refuse days the month does not have
  const leap = (year % 4 === 0 && year % 100 !== 0) || year % 400 === 0;
  if (day > (month === 2 ? (leap ? 29 : 28) : month === 4 || month === 6 || month === 9 || month === 11 ? 30 : 31)) return undefined;
  return Date.UTC(year, month - 1, day, hour, minute, second, ms);
}

/**
 * Checks one wire segment against billing's clock `nowMs`. `expectedHost`, when given (the authenticated
 * host of an HTTP shipment), must be the segment's host: a host reports only its own VMs.
 */
export function validateSegment(raw: unknown, index: number, nowMs: number, expectedHost?: string): ValidSegment | SegmentRejection {
  const s = (typeof raw === "object" && raw !== null ? raw : {}) as Partial<Record<keyof MeterSegment, unknown>>;
  const id = typeof s.id === "string" && s.id.length <= 400 ? s.id : `#${index}`;
  const reject = (code: string, message: string): SegmentRejection => ({ id, code, message });
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) return reject("invalid_segment", "a segment must be a JSON object");
  for (const key of ["hostId", "vmId", "tenantId", "agentId", "runId"] as const) {
    const v = s[key];
    if (typeof v !== "string" || !partPattern.test(v)) return reject("invalid_segment", `${key} must be 1-100 characters of [A-Za-z0-9_.-]`);
  }
  const hostId = s.hostId as string;
  if (typeof s.seq !== "number" || !Number.isSafeInteger(s.seq) || s.seq < 0) return reject("invalid_segment", "seq must be a non-negative integer");
  if (s.id !== `${hostId}:${s.vmId as string}:${s.seq}`) return reject("id_mismatch", "id must be hostId:vmId:seq of the segment");
  if (expectedHost !== undefined && hostId !== expectedHost) return reject("host_mismatch", `segment of host ${hostId} shipped by host ${expectedHost}`);
  if (typeof s.startReason !== "string" || !startReasons.has(s.startReason))
    return reject("invalid_segment", `startReason must be one of ${segmentStartReasons.join("|")}`);
  if (typeof s.endReason !== "string" || !endReasons.has(s.endReason))
    return reject("invalid_segment", `endReason must be one of ${segmentEndReasons.join("|")}`);
  const startMs = parseUtcInstant(s.startedAt);
  const endMs = parseUtcInstant(s.endedAt);
  if (startMs === undefined || endMs === undefined)
    return reject("invalid_segment", "startedAt and endedAt must be ISO 8601 UTC instants like 2026-01-01T00:00:00.000Z");
  if (endMs < startMs) return reject("ends_before_start", `segment ends (${s.endedAt as string}) before it starts (${s.startedAt as string})`);
  if (endMs === startMs) return reject("empty_segment", "segment has no duration");
  if (endMs - startMs > segmentLimits.maxDurationMs)
    return reject("too_long", `segment lasts ${endMs - startMs} ms, more than the ${segmentLimits.maxDurationMs} ms limit`);
  if (endMs > nowMs + segmentLimits.maxFutureMs)
    return reject("in_future", `segment ends ${endMs - nowMs} ms after billing's clock (limit ${segmentLimits.maxFutureMs} ms)`);
  if (typeof s.vcpus !== "number" || !Number.isInteger(s.vcpus) || s.vcpus < 1) return reject("invalid_segment", "vcpus must be a positive integer");
  if (s.vcpus > segmentLimits.maxVcpus) return reject("too_many_vcpus", `vcpus ${s.vcpus} exceeds ${segmentLimits.maxVcpus}`);
  if (typeof s.memMiB !== "number" || !Number.isInteger(s.memMiB) || s.memMiB < 1) return reject("invalid_segment", "memMiB must be a positive integer");
  if (s.memMiB > segmentLimits.maxMemMiB) return reject("too_much_memory", `memMiB ${s.memMiB} exceeds ${segmentLimits.maxMemMiB} (1 TiB)`);
  if (s.state !== undefined && s.state !== "active" && s.state !== "dozing")
    return reject("invalid_segment", "state must be active or dozing (or absent: active)");
  return {
    id: s.id,
    hostId,
    tenantId: s.tenantId as string,
    agentId: s.agentId as string,
    runId: s.runId as string,
    startMs,
    endMs,
    startedAt: s.startedAt as string,
    endedAt: s.endedAt as string,
    vcpus: s.vcpus,
    memMiB: s.memMiB,
    startReason: s.startReason as SegmentStartReason,
    endReason: s.endReason as SegmentEndReason,
    state: (s.state as SegmentState | undefined) ?? "active",
  };
}

export function isRejection(v: ValidSegment | SegmentRejection): v is SegmentRejection {
  return "code" in v;
}

/** True when two valid segments with the same id carry the same body (a retry, not a conflict). */
export function sameBody(a: ValidSegment, b: ValidSegment): boolean {
  return (
    a.id === b.id &&
    a.tenantId === b.tenantId &&
    a.agentId === b.agentId &&
    a.runId === b.runId &&
    a.startMs === b.startMs &&
    a.endMs === b.endMs &&
    a.vcpus === b.vcpus &&
    a.memMiB === b.memMiB &&
    a.startReason === b.startReason &&
    a.endReason === b.endReason &&
    a.state === b.state
  );
}

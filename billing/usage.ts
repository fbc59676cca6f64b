// Usage over half-open ranges in a time zone, by agent and/or local hour/day: from 15-minute rollups, or raw segments by overlap.
import { AppError } from "../lib/errors.ts";
import type { Db } from "../schema/db.ts";
import { alignedToBuckets } from "./buckets.ts";
import { sqlRunner, toNumber } from "./sql-runner.ts";
import { segmentLimits } from "./validate.ts";
import { assertZone, windowBoundaries } from "./zones.ts";

export type TimeGroup = "hour" | "day";

export interface UsageQuery {
  tenantId: string;
  /** `[from, to)`, ms since the epoch. */
  from: number;
  to: number;
  /** IANA zone that local hours and days are cut in. */
  zone: string;
  byAgent: boolean;
  time?: TimeGroup;
  agentId?: string;
}

export interface UsageSums {
  activeMs: number;
  vcpuMs: number;
  /** MiB-milliseconds. */
  mibMs: number;
}

export interface WindowUsage extends UsageSums {
  /** Index of the window `[boundaries[window], boundaries[window + 1])`. */
  window: number;
  agentId?: string;
}

export interface UsageRow extends UsageSums {
  start: number;
  end: number;
  agentId?: string;
}

export interface UsageReport {
  query: UsageQuery;
  /** rollup: 15-minute buckets; raw: segments split by overlap (ranges or zones whose boundaries are not on a quarter hour). */
  source: "rollup" | "raw";
  rows: UsageRow[];
  totals: UsageSums;
}

export const usageLimits = { maxRangeDays: 400, maxHourRangeDays: 93 } as const;

export function windowsOf(q: Pick<UsageQuery, "from" | "to" | "zone" | "time">): number[] {
  return q.time ? windowBoundaries(q.zone, q.from, q.to, q.time) : [q.from, q.to];
}

/** Usage for `q`, from the rollups whenever every window boundary is on a 15-minute UTC edge, else from raw segments. */
export async function usageReport(db: Db, q: UsageQuery, opts: { source?: "auto" | "rollup" | "raw" } = {}): Promise<UsageReport> {
  assertZone(q.zone);
  if (!(q.to > q.from)) throw new AppError("bad_request", "the range is empty: `to` must be after `from`");
  const days = (q.to - q.from) / 86_400_000;
  if (days > usageLimits.maxRangeDays) throw new AppError("bad_request", `the range may span at most ${usageLimits.maxRangeDays} days`);
  if (q.time === "hour" && days > usageLimits.maxHourRangeDays) throw new AppError("bad_request", `hourly usage may span at most ${usageLimits.maxHourRangeDays} days`);
  const boundaries = windowsOf(q);
  const wanted = opts.source ?? "auto";
  const source = wanted === "auto" ? (alignedToBuckets(boundaries) ? "rollup" : "raw") : wanted;
  if (source === "rollup" && !alignedToBuckets(boundaries)) throw new AppError("bad_request", "these windows do not fall on 15-minute boundaries; rollups cannot answer them");
  const windows = source === "rollup" ? await rollupUsage(db, q, boundaries) : await rawUsage(db, q, boundaries);
  // both queries answer in (window, agent) order
  const rows: UsageRow[] = windows.map((w) => {
    const row: UsageRow = { start: boundaries[w.window] as number, end: boundaries[w.window + 1] as number, activeMs: w.activeMs, vcpuMs: w.vcpuMs, mibMs: w.mibMs };
    if (w.agentId !== undefined) row.agentId = w.agentId;
    return row;
  });
  return { query: q, source, rows, totals: sumUsage(rows) };
}

export function sumUsage(rows: readonly UsageSums[]): UsageSums {
  const t = { activeMs: 0, vcpuMs: 0, mibMs: 0 };
  for (const r of rows) {
    t.activeMs += r.activeMs;
    t.vcpuMs += r.vcpuMs;
    t.mibMs += r.mibMs;
  }
  return t;
}

const iso = (t: number) => new Date(t).toISOString();

function toWindowUsage(r: Record<string, unknown>, byAgent: boolean): WindowUsage {
  const w: WindowUsage = { window: toNumber(r.w), activeMs: toNumber(r.active_ms), vcpuMs: toNumber(r.vcpu_ms), mibMs: toNumber(r.mib_ms) };
  if (byAgent) w.agentId = String(r.agent_id);
  return w;
}

/** Epoch ms of a timestamptz column, exact (timestamps here carry whole milliseconds). */
const msOf = (col: string) => `(extract(epoch FROM ${col}) * 1000)::int8`;

/**
 * A `timestamptz[]` parameter as an array literal: every driver passes a string through for an array type, and
 * Postgres parses it once per query. (A JS array would need per-driver serializers; a cast array expression
 * would be evaluated again for every row.)
 */
export function timestampArray(ms: readonly number[]): string {
  return `{${ms.map((t) => `"${iso(t)}"`).join(",")}}`;
}

/** Sums of the 15-minute rollups per window (boundaries must be bucket-aligned). */
export async function rollupUsage(db: Db, q: Pick<UsageQuery, "tenantId" | "byAgent" | "agentId">, boundaries: readonly number[]): Promise<WindowUsage[]> {
  const params: unknown[] = [q.tenantId, timestampArray(boundaries.slice(0, -1)), iso(boundaries[0] as number), iso(boundaries[boundaries.length - 1] as number)];
  if (q.agentId !== undefined) params.push(q.agentId);
  const rows = await sqlRunner(db).query<Record<string, unknown>>(
    `SELECT width_bucket(bucket_start, $2::timestamptz[]) - 1 AS w${q.byAgent ? ", agent_id" : ""},
       sum(active_ms)::int8 AS active_ms, sum(vcpu_ms)::int8 AS vcpu_ms, sum(mib_ms)::int8 AS mib_ms
     FROM usage_quarter_hours
     WHERE tenant_id = $1 AND bucket_start >= $3::text::timestamptz AND bucket_start < $4::text::timestamptz${q.agentId !== undefined ? " AND agent_id = $5" : ""}
     GROUP BY 1${q.byAgent ? ", 2" : ""} ORDER BY 1${q.byAgent ? ", 2" : ""}`,
    params,
  );
  return rows.map((r) => toWindowUsage(r, q.byAgent));
}

/**
 * The same sums straight from raw segments, each split by overlap with the windows. `received.before` /
 * `received.from` restrict to segments billing received before / at-or-after an instant (invoice cutoffs).
 * Segments last at most an hour, which bounds the scan to `[from - 1 h, to)` by start time.
 */
export async function rawUsage(
  db: Db,
  q: Pick<UsageQuery, "tenantId" | "byAgent" | "agentId">,
  boundaries: readonly number[],
  received: { before?: number; from?: number } = {},
): Promise<WindowUsage[]> {
  const from = boundaries[0] as number;
  const to = boundaries[boundaries.length - 1] as number;
  const n = boundaries.length - 1;
  const params: unknown[] = [q.tenantId, [...boundaries], iso(from), iso(to), iso(from - segmentLimits.maxDurationMs), n];
  const extra: string[] = [];
  if (q.agentId !== undefined) {
    params.push(q.agentId);
    extra.push(`agent_id = $${params.length}`);
  }
  if (received.before !== undefined) {
    params.push(iso(received.before));
    extra.push(`received_at < $${params.length}::text::timestamptz`);
  }
  if (received.from !== undefined) {
    params.push(iso(received.from));
    extra.push(`received_at >= $${params.length}::text::timestamptz`);
  }
  const rows = await sqlRunner(db).query<Record<string, unknown>>(
    `SELECT i - 1 AS w${q.byAgent ? ", s.agent_id" : ""},
       sum(o.ms)::int8 AS active_ms, sum(o.ms * s.vcpus)::int8 AS vcpu_ms, sum(o.ms * s.mem_mib)::int8 AS mib_ms
     FROM (
       SELECT agent_id, vcpus, mem_mib, ${msOf("started_at")} AS sm, ${msOf("ended_at")} AS em
       FROM meter_segments
       WHERE tenant_id = $1 AND started_at < $4::text::timestamptz AND ended_at > $3::text::timestamptz
         AND started_at >= $5::text::timestamptz${extra.map((e) => ` AND ${e}`).join("")}
     ) s,
       LATERAL generate_series(greatest(width_bucket(s.sm, $2::int8[]), 1), least(width_bucket(s.em - 1, $2::int8[]), $6::int)) AS i,
       LATERAL (SELECT least(s.em, ($2::int8[])[i + 1]) - greatest(s.sm, ($2::int8[])[i]) AS ms) o
     WHERE o.ms > 0
     GROUP BY 1${q.byAgent ? ", 2" : ""} ORDER BY 1${q.byAgent ? ", 2" : ""}`,
    params,
  );
  return rows.map((r) => toWindowUsage(r, q.byAgent));
}

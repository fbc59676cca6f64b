// Usage over half-open ranges in a time zone, by agent and/or local hour/day: from 15-minute rollups, or raw segments by overlap; hibernated time from the VM event log.
import { AppError } from "../lib/errors.ts";
import type { Db } from "../schema/db.ts";
import { alignedToBuckets, bucketMs } from "./buckets.ts";
import { sqlRunner } from "./sql-runner.ts";
import { hibernatedTime } from "./storage.ts";
import { asLines, columnsOf, withHibernated, type HibernatedCell, type UsageColumns } from "./usage-columns.ts";
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
  /** Time the VM ran (its vCPUs not stopped), and its vCPU- and MiB-milliseconds. */
  activeMs: number;
  vcpuMs: number;
  /** MiB-milliseconds. */
  mibMs: number;
  /** Time the VM dozed (vCPUs stopped while every open call waited on an outbound call), and its vCPU- and MiB-milliseconds. */
  dozedMs: number;
  dozedVcpuMs: number;
  dozedMibMs: number;
  /** Time the agent was hibernated (its snapshot held, no VM); 0 from segment queries (rollups and raw), which do not know it. */
  hibernatedMs: number;
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
  /** The warm pool the agent belongs to (by agent only; absent for an agent in none). */
  poolId?: string;
}

export interface UsageReport {
  query: UsageQuery;
  /** rollup: 15-minute buckets; raw: segments split by overlap (ranges or zones whose boundaries are not on a quarter hour). */
  source: "rollup" | "raw";
  rows: UsageRow[];
  totals: UsageSums;
}

/** The same report as `UsageReport`, with its rows as columns and the window boundaries they index. */
export interface UsageTable {
  query: UsageQuery;
  source: "rollup" | "raw";
  boundaries: readonly number[];
  columns: UsageColumns;
  totals: UsageSums;
  /** By agent: the warm pool of each agent in one (agent id → pool id); a pooled agent is billed as any other. */
  agentPools?: ReadonlyMap<string, string>;
}

export { columnsOf, compareCodePoints, type UsageColumns } from "./usage-columns.ts";

export const usageLimits = { maxRangeDays: 400, maxHourRangeDays: 93 } as const;

export function windowsOf(q: Pick<UsageQuery, "from" | "to" | "zone" | "time">): number[] {
  return q.time ? windowBoundaries(q.zone, q.from, q.to, q.time) : [q.from, q.to];
}

/**
 * Window boundaries per zone, range and unit, kept for the process's life (the zone database does not change while it
 * runs): asking the zone database for a month's days costs about a millisecond, which repeated reports need not pay.
 */
const windowCache = new Map<string, readonly number[]>();
const windowCacheSize = 256;

function cachedWindowsOf(q: Pick<UsageQuery, "from" | "to" | "zone" | "time">): readonly number[] {
  const key = `${q.zone}|${q.from}|${q.to}|${q.time ?? ""}`;
  let b = windowCache.get(key);
  if (b === undefined) {
    b = windowsOf(q);
    if (windowCache.size >= windowCacheSize) windowCache.delete(windowCache.keys().next().value as string);
    windowCache.set(key, b);
  }
  return b;
}

export interface UsageOptions {
  /** rollup or raw; default auto (rollup whenever the windows allow it). */
  source?: "auto" | "rollup" | "raw";
  /** Most rollup queries one report runs at once (see `rollupColumns`); default `rollupParts.max`. */
  parts?: number;
}

/** Usage for `q` as columns, from the rollups whenever every window boundary is on a 15-minute UTC edge, else from raw segments. */
export async function usageTable(db: Db, q: UsageQuery, opts: UsageOptions = {}): Promise<UsageTable> {
  assertZone(q.zone);
  if (!(q.to > q.from)) throw new AppError("bad_request", "the range is empty: `to` must be after `from`");
  const days = (q.to - q.from) / 86_400_000;
  if (days > usageLimits.maxRangeDays) throw new AppError("bad_request", `the range may span at most ${usageLimits.maxRangeDays} days`);
  if (q.time === "hour" && days > usageLimits.maxHourRangeDays)
    throw new AppError("bad_request", `hourly usage may span at most ${usageLimits.maxHourRangeDays} days`);
  const boundaries = cachedWindowsOf(q);
  const wanted = opts.source ?? "auto";
  const source = wanted === "auto" ? (alignedToBuckets(boundaries) ? "rollup" : "raw") : wanted;
  if (source === "rollup" && !alignedToBuckets(boundaries))
    throw new AppError("bad_request", "these windows do not fall on 15-minute boundaries; rollups cannot answer them");
  const [metered, hibernated, agentPools] = await Promise.all([
    source === "rollup" ? rollupColumns(db, q, boundaries, opts.parts === undefined ? {} : { parts: opts.parts }) : rawColumns(db, q, boundaries),
    hibernatedCells(db, q, boundaries),
    q.byAgent ? poolsOfAgents(db, q) : undefined,
  ]);
  const columns = withHibernated(metered, hibernated);
  return { query: q, source, boundaries, columns, totals: sumColumns(columns), ...(agentPools ? { agentPools } : {}) };
}

/** Each of the tenant's agents that is (or was, deleted since) in a warm pool, with its pool: one query. */
async function poolsOfAgents(db: Db, q: UsageQuery): Promise<Map<string, string>> {
  const params: unknown[] = [q.tenantId];
  if (q.agentId !== undefined) params.push(q.agentId);
  const rows = await sqlRunner(db).query<{ id: string; pool_id: string }>(
    `select id, pool_id from agents where tenant_id = $1 and pool_id is not null${q.agentId !== undefined ? " and id = $2" : ""}`,
    params,
  );
  return new Map(rows.map((r) => [r.id, r.pool_id]));
}

/** The hibernated time of `q`'s agents per window (and agent, when by agent), from the VM event log. */
async function hibernatedCells(db: Db, q: UsageQuery, boundaries: readonly number[]): Promise<HibernatedCell[]> {
  const cells: HibernatedCell[] = [];
  for (const [agentId, byWindow] of await hibernatedTime(db, q.tenantId, boundaries, q.agentId))
    for (const [window, ms] of byWindow) cells.push(q.byAgent ? { window, agentId, ms } : { window, ms });
  return cells;
}

/** Usage for `q` with one object per row (see `usageTable`). */
export async function usageReport(db: Db, q: UsageQuery, opts: UsageOptions = {}): Promise<UsageReport> {
  const t = await usageTable(db, q, opts);
  const c = t.columns;
  const rows: UsageRow[] = [];
  for (let i = 0; i < c.length; i++) {
    const w = c.window[i] as number;
    const row: UsageRow = {
      start: t.boundaries[w] as number,
      end: t.boundaries[w + 1] as number,
      ...sumsAt(c, i),
    };
    if (c.agents && c.agent) {
      const agentId = c.agents[c.agent[i] as number] as string;
      row.agentId = agentId;
      const poolId = t.agentPools?.get(agentId);
      if (poolId !== undefined) row.poolId = poolId;
    }
    rows.push(row);
  }
  return { query: t.query, source: t.source, rows, totals: t.totals };
}

export const noUsage = (): UsageSums => ({ activeMs: 0, vcpuMs: 0, mibMs: 0, dozedMs: 0, dozedVcpuMs: 0, dozedMibMs: 0, hibernatedMs: 0 });

/** The sums of row `i` of `c`. */
export function sumsAt(c: UsageColumns, i: number): UsageSums {
  return {
    activeMs: c.activeMs[i] as number,
    vcpuMs: c.vcpuMs[i] as number,
    mibMs: c.mibMs[i] as number,
    dozedMs: c.dozedMs[i] as number,
    dozedVcpuMs: c.dozedVcpuMs[i] as number,
    dozedMibMs: c.dozedMibMs[i] as number,
    hibernatedMs: c.hibernatedMs[i] as number,
  };
}

/** Adds `r` into `t` (or takes it out, `sign` -1). */
export function addUsage(t: UsageSums, r: UsageSums, sign: 1 | -1 = 1): UsageSums {
  t.activeMs += sign * r.activeMs;
  t.vcpuMs += sign * r.vcpuMs;
  t.mibMs += sign * r.mibMs;
  t.dozedMs += sign * r.dozedMs;
  t.dozedVcpuMs += sign * r.dozedVcpuMs;
  t.dozedMibMs += sign * r.dozedMibMs;
  t.hibernatedMs += sign * r.hibernatedMs;
  return t;
}

export function sumUsage(rows: readonly UsageSums[]): UsageSums {
  const t = noUsage();
  for (const r of rows) addUsage(t, r);
  return t;
}

export function sumColumns(c: UsageColumns): UsageSums {
  const t = noUsage();
  for (let i = 0; i < c.length; i++) addUsage(t, sumsAt(c, i));
  return t;
}

const iso = (t: number) => new Date(t).toISOString();

/** One object per row of `c` (what invoices read). */
function windowUsageOf(c: UsageColumns): WindowUsage[] {
  const out: WindowUsage[] = [];
  for (let i = 0; i < c.length; i++) {
    const w: WindowUsage = { window: c.window[i] as number, ...sumsAt(c, i) };
    if (c.agents && c.agent) w.agentId = c.agents[c.agent[i] as number];
    out.push(w);
  }
  return out;
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

/**
 * The rollup query of `rollupColumns`, text and parameters (the benchmark EXPLAINs it): the sums per window of
 * `boundaries`, over the buckets in `range` (default all of them; a part's range starts and ends on window boundaries).
 * `snapshot` adds the statement's snapshot (`pg_current_snapshot()`) as a second column, which parts are compared by.
 */
export function rollupQuery(
  q: Pick<UsageQuery, "tenantId" | "byAgent" | "agentId">,
  boundaries: readonly number[],
  opts: { range?: readonly [number, number]; snapshot?: boolean } = {},
): { text: string; params: unknown[] } {
  const [from, to] = opts.range ?? [boundaries[0] as number, boundaries[boundaries.length - 1] as number];
  const params: unknown[] = [q.tenantId, timestampArray(boundaries.slice(0, -1)), iso(from), iso(to)];
  if (q.agentId !== undefined) params.push(q.agentId);
  // Sums in float8, exactly: rollups only ever add non-negative amounts (ingest.ts), so every partial sum is at most
  // the total, and a total below 2^53 (all toNumber accepts) is exact in float8; one at or above it stays at or
  // above it and is refused as before. float8 addition is a plain add, where sum(int8) keeps a numeric state per
  // group and converts it back: a quarter of the query's time.
  const text = asLines(
    `SELECT width_bucket(bucket_start, $2::timestamptz[]) - 1 AS w${q.byAgent ? ", agent_id" : ""},
       sum(active_ms::float8)::int8 AS active_ms, sum(vcpu_ms::float8)::int8 AS vcpu_ms, sum(mib_ms::float8)::int8 AS mib_ms,
       sum(dozed_ms::float8)::int8 AS dozed_ms, sum(dozed_vcpu_ms::float8)::int8 AS dozed_vcpu_ms, sum(dozed_mib_ms::float8)::int8 AS dozed_mib_ms
     FROM usage_quarter_hours
     WHERE tenant_id = $1 AND bucket_start >= $3::text::timestamptz AND bucket_start < $4::text::timestamptz${q.agentId !== undefined ? " AND agent_id = $5" : ""}
     GROUP BY 1${q.byAgent ? ", 2" : ""}`,
    q.byAgent,
  );
  return { text: opts.snapshot ? text.replace(" AS lines FROM ", " AS lines, pg_current_snapshot()::text AS snapshot FROM ") : text, params };
}

/**
 * How a rollup report is cut into queries Postgres answers at once, each on its own connection (and core): a month
 * by day is two half-months of about 6k rollup rows each, where one query keeps one core busy while the other waits. At most
 * `max` parts, each spanning at least `minBuckets` 15-minute buckets, cut on window boundaries (a window is summed by
 * one part only, so the rows and their 2^53 checks are the one query's).
 */
export const rollupParts = { max: 2, minBuckets: 96 } as const;

/**
 * The windows of `boundaries` cut into at most `parts` runs of about equal time: `[0, c1, …, n]`, window indices
 * (n = boundaries.length - 1), increasing, each run spanning at least `minBuckets` buckets.
 */
export function partCuts(boundaries: readonly number[], parts: number, minBuckets: number = rollupParts.minBuckets): number[] {
  const n = boundaries.length - 1;
  const from = boundaries[0] as number;
  const span = (boundaries[n] as number) - from;
  const k = Math.max(1, Math.min(Math.floor(parts), n, Math.floor(span / (minBuckets * bucketMs))));
  const cuts = [0];
  for (let part = 1; part < k; part++) {
    const target = from + (span * part) / k;
    let i = cuts[cuts.length - 1] as number;
    while (i < n && (boundaries[i] as number) < target) i++;
    const last = cuts[cuts.length - 1] as number;
    if (i < n && i > last && (boundaries[i] as number) - (boundaries[last] as number) >= minBuckets * bucketMs) cuts.push(i);
  }
  if (cuts.length > 1 && (boundaries[n] as number) - (boundaries[cuts[cuts.length - 1] as number] as number) < minBuckets * bucketMs) cuts.pop();
  cuts.push(n);
  return cuts;
}

/**
 * Sums of the 15-minute rollups per window (boundaries must be bucket-aligned), in (window, agent) order. On Postgres
 * a long range is asked for in parts (`rollupParts`, `opts.parts` at most) at once, each part's statement with its own
 * snapshot: when those differ (a write committed between them, which could have counted a segment in one part and not
 * in the other), the parts are dropped and one statement answers, so a report always reads one instant's rollups.
 */
export async function rollupColumns(
  db: Db,
  q: Pick<UsageQuery, "tenantId" | "byAgent" | "agentId">,
  boundaries: readonly number[],
  opts: { parts?: number } = {},
): Promise<UsageColumns> {
  const runner = sqlRunner(db);
  const cuts = runner.kind === "postgres" ? partCuts(boundaries, opts.parts ?? rollupParts.max) : [0, boundaries.length - 1];
  if (cuts.length > 2) {
    const answers = await Promise.all(
      cuts.slice(0, -1).map(async (c, i) => {
        const { text, params } = rollupQuery(q, boundaries, { range: [boundaries[c] as number, boundaries[cuts[i + 1] as number] as number], snapshot: true });
        const [row] = await runner.query<{ lines: string | null; snapshot: string }>(text, params);
        return row;
      }),
    );
    // every part numbers the windows of the whole report, and columnsOf orders the rows of all parts' lines
    if (answers.every((a) => a?.snapshot === answers[0]?.snapshot))
      return columnsOf(
        answers.map((a) => a?.lines),
        q.byAgent,
      );
  }
  const { text, params } = rollupQuery(q, boundaries);
  const [row] = await runner.query<{ lines: string | null }>(text, params);
  return columnsOf(row?.lines, q.byAgent);
}

/** `rollupColumns` with one object per row. */
export async function rollupUsage(db: Db, q: Pick<UsageQuery, "tenantId" | "byAgent" | "agentId">, boundaries: readonly number[]): Promise<WindowUsage[]> {
  return windowUsageOf(await rollupColumns(db, q, boundaries));
}

/**
 * The same sums straight from raw segments, each split by overlap with the windows, in (window, agent) order: of a
 * segment clipped at ingest (its agent's time was already billed), only its billed pieces.
 * `received.before` / `received.from` restrict to segments billing received before / at-or-after an instant (invoice
 * cutoffs). Segments last at most an hour, which bounds the scan to `[from - 1 h, to)` by start time.
 */
export async function rawColumns(
  db: Db,
  q: Pick<UsageQuery, "tenantId" | "byAgent" | "agentId">,
  boundaries: readonly number[],
  received: { before?: number; from?: number } = {},
): Promise<UsageColumns> {
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
  const [row] = await sqlRunner(db).query<{ lines: string | null }>(
    asLines(
      `SELECT i - 1 AS w${q.byAgent ? ", s.agent_id" : ""},
       sum(o.ms * (1 - s.dz))::int8 AS active_ms, sum(o.ms * s.vcpus * (1 - s.dz))::int8 AS vcpu_ms, sum(o.ms * s.mem_mib * (1 - s.dz))::int8 AS mib_ms,
       sum(o.ms * s.dz)::int8 AS dozed_ms, sum(o.ms * s.vcpus * s.dz)::int8 AS dozed_vcpu_ms, sum(o.ms * s.mem_mib * s.dz)::int8 AS dozed_mib_ms
     FROM (
       SELECT r.agent_id, r.vcpus, r.mem_mib, r.dz, p.sm, p.em
       FROM (
         SELECT agent_id, vcpus, mem_mib, (state = 'dozing')::int AS dz, ${msOf("started_at")} AS sm, ${msOf("ended_at")} AS em, billed_spans
         FROM meter_segments
         WHERE tenant_id = $1 AND started_at < $4::text::timestamptz AND ended_at > $3::text::timestamptz
           AND started_at >= $5::text::timestamptz${extra.map((e) => ` AND ${e}`).join("")}
       ) r,
         -- the segment's billed pieces: all of it, or what time already billed for its agent left (ingest.ts)
         LATERAL (SELECT r.sm, r.em WHERE r.billed_spans IS NULL UNION ALL SELECT lower(b), upper(b) FROM unnest(r.billed_spans) AS b) p(sm, em)
     ) s,
       LATERAL generate_series(greatest(width_bucket(s.sm, $2::int8[]), 1), least(width_bucket(s.em - 1, $2::int8[]), $6::int)) AS i,
       LATERAL (SELECT least(s.em, ($2::int8[])[i + 1]) - greatest(s.sm, ($2::int8[])[i]) AS ms) o
     WHERE o.ms > 0
     GROUP BY 1${q.byAgent ? ", 2" : ""}`,
      q.byAgent,
    ),
    params,
  );
  return columnsOf(row?.lines, q.byAgent);
}

/** `rawColumns` with one object per row. */
export async function rawUsage(
  db: Db,
  q: Pick<UsageQuery, "tenantId" | "byAgent" | "agentId">,
  boundaries: readonly number[],
  received: { before?: number; from?: number } = {},
): Promise<WindowUsage[]> {
  return windowUsageOf(await rawColumns(db, q, boundaries, received));
}

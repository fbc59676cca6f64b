// Usage over half-open ranges in a time zone, by agent and/or local hour/day: from 15-minute rollups, or raw segments by overlap.
import { AppError } from "../lib/errors.ts";
import type { Db } from "../schema/db.ts";
import { alignedToBuckets } from "./buckets.ts";
import { sqlRunner } from "./sql-runner.ts";
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

/**
 * A report's rows as columns, in (window, agent) order: no object per row, because a month by agent and day is tens
 * of thousands of rows and the HTTP answer is written straight from these (report-views.ts `usageJsonText`).
 */
export interface UsageColumns {
  length: number;
  /** Each row's window: `[boundaries[window[i]], boundaries[window[i] + 1])`. */
  window: Int32Array;
  /** When grouped by agent: the distinct agents in order (Postgres's "C" collation), and each row's index into them. */
  agents?: string[];
  agent?: Int32Array;
  activeMs: Float64Array;
  vcpuMs: Float64Array;
  mibMs: Float64Array;
}

/** The same report as `UsageReport`, with its rows as columns and the window boundaries they index. */
export interface UsageTable {
  query: UsageQuery;
  source: "rollup" | "raw";
  boundaries: readonly number[];
  columns: UsageColumns;
  totals: UsageSums;
}

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

/** Usage for `q` as columns, from the rollups whenever every window boundary is on a 15-minute UTC edge, else from raw segments. */
export async function usageTable(db: Db, q: UsageQuery, opts: { source?: "auto" | "rollup" | "raw" } = {}): Promise<UsageTable> {
  assertZone(q.zone);
  if (!(q.to > q.from)) throw new AppError("bad_request", "the range is empty: `to` must be after `from`");
  const days = (q.to - q.from) / 86_400_000;
  if (days > usageLimits.maxRangeDays) throw new AppError("bad_request", `the range may span at most ${usageLimits.maxRangeDays} days`);
  if (q.time === "hour" && days > usageLimits.maxHourRangeDays) throw new AppError("bad_request", `hourly usage may span at most ${usageLimits.maxHourRangeDays} days`);
  const boundaries = cachedWindowsOf(q);
  const wanted = opts.source ?? "auto";
  const source = wanted === "auto" ? (alignedToBuckets(boundaries) ? "rollup" : "raw") : wanted;
  if (source === "rollup" && !alignedToBuckets(boundaries)) throw new AppError("bad_request", "these windows do not fall on 15-minute boundaries; rollups cannot answer them");
  const columns = source === "rollup" ? await rollupColumns(db, q, boundaries) : await rawColumns(db, q, boundaries);
  return { query: q, source, boundaries, columns, totals: sumColumns(columns) };
}

/** Usage for `q` with one object per row (see `usageTable`). */
export async function usageReport(db: Db, q: UsageQuery, opts: { source?: "auto" | "rollup" | "raw" } = {}): Promise<UsageReport> {
  const t = await usageTable(db, q, opts);
  const c = t.columns;
  const rows: UsageRow[] = [];
  for (let i = 0; i < c.length; i++) {
    const w = c.window[i] as number;
    const row: UsageRow = { start: t.boundaries[w] as number, end: t.boundaries[w + 1] as number, activeMs: c.activeMs[i] as number, vcpuMs: c.vcpuMs[i] as number, mibMs: c.mibMs[i] as number };
    if (c.agents && c.agent) row.agentId = c.agents[c.agent[i] as number];
    rows.push(row);
  }
  return { query: t.query, source: t.source, rows, totals: t.totals };
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

export function sumColumns(c: UsageColumns): UsageSums {
  const t = { activeMs: 0, vcpuMs: 0, mibMs: 0 };
  for (let i = 0; i < c.length; i++) {
    t.activeMs += c.activeMs[i] as number;
    t.vcpuMs += c.vcpuMs[i] as number;
    t.mibMs += c.mibMs[i] as number;
  }
  return t;
}

const iso = (t: number) => new Date(t).toISOString();

/**
 * Postgres's "C" collation, the order of agent ids: code points (UTF-8 bytes). `<` on JavaScript's UTF-16 agrees,
 * except that a surrogate (part of a code point past U+FFFF) must sort after U+E000–U+FFFF.
 */
export function compareCodePoints(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.charCodeAt(i);
    const y = b.charCodeAt(i);
    if (x === y) continue;
    const sx = x >= 0xd800 && x <= 0xdfff;
    const sy = y >= 0xd800 && y <= 0xdfff;
    return sx === sy ? x - y : sx ? 1 : -1;
  }
  return a.length - b.length;
}

/**
 * A grouped query (columns `w`, `agent_id` when by agent, `active_ms`, `vcpu_ms`, `mib_ms`) answered as one text value,
 * a line `w,active,vcpu,mib[,"agent"]` per row, in no order. One value instead of a row each: reading thousands of
 * rows of five columns cost the billing process more than the rest of the report (a string per column from the
 * driver), while Postgres writes the line for about what it spends sending a row. The agent is last and JSON-quoted,
 * so no id can break a line.
 */
function asLines(grouped: string, byAgent: boolean): string {
  return `SELECT string_agg(w || ',' || active_ms || ',' || vcpu_ms || ',' || mib_ms${byAgent ? ` || ',' || to_json(agent_id)::text` : ""}, E'\\n') AS lines FROM (${grouped}) g`;
}

/** `order` stably re-sorted by `key` (integers in `[0, buckets)`): one counting pass. */
function countingSort(order: Uint32Array, key: Int32Array, buckets: number): Uint32Array {
  const start = new Uint32Array(buckets + 1);
  for (let i = 0; i < order.length; i++) {
    const k = (key[order[i] as number] as number) + 1;
    start[k] = (start[k] as number) + 1;
  }
  for (let k = 0; k < buckets; k++) start[k + 1] = (start[k + 1] as number) + (start[k] as number);
  const out = new Uint32Array(order.length);
  for (let i = 0; i < order.length; i++) {
    const j = order[i] as number;
    const k = key[j] as number;
    out[start[k] as number] = j;
    start[k] = (start[k] as number) + 1;
  }
  return out;
}

const comma = 44;
const newline = 10;

/**
 * The lines of `asLines` read into columns in (window, agent) order. Numbers are read digit by digit (no string
 * per number) and must be integers below 2^53, as `toNumber` requires. The order is made here, not in the query:
 * sorting a month's aggregated rows cost Postgres about a third of its time, while here only the distinct agents
 * (hundreds) are compared as strings and the rows are put in order by two counting passes (agent rank, then window).
 */
export function columnsOf(lines: string | null | undefined, byAgent: boolean): UsageColumns {
  const text = lines ?? "";
  let n = text.length === 0 ? 0 : 1;
  for (let p = text.indexOf("\n"); p >= 0; p = text.indexOf("\n", p + 1)) n++;
  const win = new Int32Array(n);
  const sums = [new Float64Array(n), new Float64Array(n), new Float64Array(n)] as const;
  const ids: string[] = [];
  let windows = 0;
  let i = 0;
  for (let row = 0; row < n; row++) {
    for (let f = 0; f < 4; f++) {
      let neg = false;
      let v = 0;
      let digits = 0;
      let ch = text.charCodeAt(i);
      if (ch === 45) {
        neg = true;
        ch = text.charCodeAt(++i);
      }
      for (; ch >= 48 && ch <= 57; ch = text.charCodeAt(++i), digits++) v = v * 10 + (ch - 48);
      const ended = f < 3 || byAgent ? ch === comma : ch === newline || i === text.length;
      if (digits === 0 || !ended) throw new Error(`unreadable usage line ${row + 1}: ${JSON.stringify(text.slice(i - digits, i + 40))}`);
      if (v > Number.MAX_SAFE_INTEGER) throw new Error(`integer ${text.slice(i - digits, i)} exceeds 2^53`);
      i++;
      if (f === 0) {
        if (neg || v >= 2 ** 31) throw new Error(`usage row in window ${v}`); // the queries' ranges are the windows'
        win[row] = v;
        if (v >= windows) windows = v + 1;
      } else (sums[f - 1] as Float64Array)[row] = neg ? -v : v;
    }
    if (byAgent) {
      let e = text.indexOf("\n", i);
      if (e < 0) e = text.length;
      const quoted = text.slice(i, e);
      // a JSON string: only ids with a quote, a backslash or a control character have escapes
      ids.push(quoted.includes("\\") ? (JSON.parse(quoted) as string) : quoted.slice(1, -1));
      i = e + 1;
    }
  }
  let order: Uint32Array = new Uint32Array(n);
  for (let k = 0; k < n; k++) order[k] = k;
  let agents: string[] | undefined;
  let agentRank: Int32Array | undefined;
  if (byAgent) {
    const rank = new Map<string, number>();
    for (const id of ids) rank.set(id, 0);
    agents = [...rank.keys()].sort(compareCodePoints);
    for (let k = 0; k < agents.length; k++) rank.set(agents[k] as string, k);
    agentRank = new Int32Array(n);
    for (let k = 0; k < n; k++) agentRank[k] = rank.get(ids[k] as string) as number;
    order = countingSort(order, agentRank, agents.length);
  }
  order = countingSort(order, win, windows);
  const c: UsageColumns = { length: n, window: new Int32Array(n), activeMs: new Float64Array(n), vcpuMs: new Float64Array(n), mibMs: new Float64Array(n) };
  const agent = agentRank ? new Int32Array(n) : undefined;
  for (let k = 0; k < n; k++) {
    const j = order[k] as number;
    c.window[k] = win[j] as number;
    if (agent) agent[k] = agentRank![j] as number;
    c.activeMs[k] = sums[0][j] as number;
    c.vcpuMs[k] = sums[1][j] as number;
    c.mibMs[k] = sums[2][j] as number;
  }
  if (agents && agent) {
    c.agents = agents;
    c.agent = agent;
  }
  return c;
}

/** One object per row of `c` (what invoices read). */
function windowUsageOf(c: UsageColumns): WindowUsage[] {
  const out: WindowUsage[] = [];
  for (let i = 0; i < c.length; i++) {
    const w: WindowUsage = { window: c.window[i] as number, activeMs: c.activeMs[i] as number, vcpuMs: c.vcpuMs[i] as number, mibMs: c.mibMs[i] as number };
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

/** The rollup query of `rollupColumns`, text and parameters (the benchmark EXPLAINs it). */
export function rollupQuery(q: Pick<UsageQuery, "tenantId" | "byAgent" | "agentId">, boundaries: readonly number[]): { text: string; params: unknown[] } {
  const params: unknown[] = [q.tenantId, timestampArray(boundaries.slice(0, -1)), iso(boundaries[0] as number), iso(boundaries[boundaries.length - 1] as number)];
  if (q.agentId !== undefined) params.push(q.agentId);
  // Sums in float8, exactly: rollups only ever add non-negative amounts (ingest.ts), so every partial sum is at most
  // the total, and a total below 2^53 (all toNumber accepts) is exact in float8; one at or above it stays at or
  // above it and is refused as before. float8 addition is a plain add, where sum(int8) keeps a numeric state per
  // group and converts it back: a quarter of the query's time.
  const text = asLines(
    `SELECT width_bucket(bucket_start, $2::timestamptz[]) - 1 AS w${q.byAgent ? ", agent_id" : ""},
       sum(active_ms::float8)::int8 AS active_ms, sum(vcpu_ms::float8)::int8 AS vcpu_ms, sum(mib_ms::float8)::int8 AS mib_ms
     FROM usage_quarter_hours
     WHERE tenant_id = $1 AND bucket_start >= $3::text::timestamptz AND bucket_start < $4::text::timestamptz${q.agentId !== undefined ? " AND agent_id = $5" : ""}
     GROUP BY 1${q.byAgent ? ", 2" : ""}`,
    q.byAgent,
  );
  return { text, params };
}

/** Sums of the 15-minute rollups per window (boundaries must be bucket-aligned), in (window, agent) order. */
export async function rollupColumns(db: Db, q: Pick<UsageQuery, "tenantId" | "byAgent" | "agentId">, boundaries: readonly number[]): Promise<UsageColumns> {
  const { text, params } = rollupQuery(q, boundaries);
  const [row] = await sqlRunner(db).query<{ lines: string | null }>(text, params);
  return columnsOf(row?.lines, q.byAgent);
}

/** `rollupColumns` with one object per row. */
export async function rollupUsage(db: Db, q: Pick<UsageQuery, "tenantId" | "byAgent" | "agentId">, boundaries: readonly number[]): Promise<WindowUsage[]> {
  return windowUsageOf(await rollupColumns(db, q, boundaries));
}

/**
 * The same sums straight from raw segments, each split by overlap with the windows, in (window, agent) order.
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

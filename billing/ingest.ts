// Idempotent ingest of meter segments: validate, write raw rows and rollups in one transaction, then answer per id.
import type { IngestResult } from "../contracts/meter.ts";
import type { Clock } from "../lib/clock.ts";
import { AppError } from "../lib/errors.ts";
import { silentLogger, type Logger } from "../lib/log.ts";
import { noopMetrics, seconds, type Metrics } from "../lib/metrics.ts";
import type { Db } from "../schema/db.ts";
import { bucketMs } from "./buckets.ts";
import { billedSpansOf, clipAgainst, mergeCoverage, multirangeText, type Clip, type CoverSpan, type Span } from "./overlap.ts";
import { CopyUnsupportedError, sqlRunner, sqlState, toNumber, type SqlRunner } from "./sql-runner.ts";
import { isRejection, sameBody, segmentLimits, validateSegment, type ValidSegment } from "./validate.ts";

export interface IngestOptions {
  /** The authenticated host of an HTTP shipment: it may only report its own segments. */
  hostId?: string;
  log?: Logger;
  /** Where clipped overlaps are counted (`agentvm_billing_overlap_*`); default nowhere. */
  metrics?: Metrics;
  /** Try `COPY` first where the client streams it (postgres.js); falls back to `INSERT … ON CONFLICT` on a duplicate. Default true. */
  copy?: boolean;
}

const segmentColumns = [
  "id",
  "tenant_id",
  "agent_id",
  "run_id",
  "started_at",
  "ended_at",
  "vcpus",
  "mem_mib",
  "start_reason",
  "end_reason",
  "received_at",
  "state",
] as const;

const insertSql = `
INSERT INTO meter_segments (${segmentColumns.join(", ")})
SELECT id, t, a, r, s::timestamptz, e::timestamptz, v, m, sr, er, $11::text::timestamptz, st
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int4[], $8::int4[], $9::text[], $10::text[], $12::text[])
  AS x(id, t, a, r, s, e, v, m, sr, er, st)
ON CONFLICT (id) DO NOTHING
RETURNING id`;

const bucketUpsertSql = `
INSERT INTO usage_quarter_hours AS u (tenant_id, bucket_start, agent_id, active_ms, vcpu_ms, mib_ms, dozed_ms, dozed_vcpu_ms, dozed_mib_ms)
SELECT t, to_timestamp(b * ${bucketMs / 1000}), a, x, y, z, d, dv, dm
FROM unnest($1::text[], $2::int8[], $3::text[], $4::int8[], $5::int8[], $6::int8[], $7::int8[], $8::int8[], $9::int8[]) AS r(t, b, a, x, y, z, d, dm, dv)
ON CONFLICT (tenant_id, bucket_start, agent_id) DO UPDATE SET
  active_ms = u.active_ms + excluded.active_ms, vcpu_ms = u.vcpu_ms + excluded.vcpu_ms, mib_ms = u.mib_ms + excluded.mib_ms,
  dozed_ms = u.dozed_ms + excluded.dozed_ms, dozed_vcpu_ms = u.dozed_vcpu_ms + excluded.dozed_vcpu_ms, dozed_mib_ms = u.dozed_mib_ms + excluded.dozed_mib_ms`;

const runUpsertSql = `
INSERT INTO run_usage AS u (run_id, tenant_id, agent_id, active_ms, vcpu_ms, mib_ms, dozed_ms, dozed_vcpu_ms, dozed_mib_ms, segments, overlap_ms, first_started_at, last_ended_at)
SELECT r, t, a, x, y, z, d, dv, dm, n, o, 'epoch'::timestamptz + f * interval '1 millisecond', 'epoch'::timestamptz + l * interval '1 millisecond'
FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::int8[], $6::int8[], $7::int4[], $8::int8[], $9::int8[], $10::int8[], $11::int8[], $12::int8[], $13::int8[])
  AS q(r, t, a, x, y, z, n, f, l, d, dm, dv, o)
ON CONFLICT (run_id) DO UPDATE SET
  active_ms = u.active_ms + excluded.active_ms, vcpu_ms = u.vcpu_ms + excluded.vcpu_ms, mib_ms = u.mib_ms + excluded.mib_ms,
  dozed_ms = u.dozed_ms + excluded.dozed_ms, dozed_vcpu_ms = u.dozed_vcpu_ms + excluded.dozed_vcpu_ms, dozed_mib_ms = u.dozed_mib_ms + excluded.dozed_mib_ms,
  segments = u.segments + excluded.segments, overlap_ms = u.overlap_ms + excluded.overlap_ms,
  first_started_at = least(u.first_started_at, excluded.first_started_at), last_ended_at = greatest(u.last_ended_at, excluded.last_ended_at)`;

/**
 * One transaction-scoped advisory lock per agent of the batch, taken in key order (two batches cannot deadlock on
 * them): batches that report the same agent are written one after the other, so each sees the time the other billed.
 */
const lockAgentsSql = `
SELECT count(pg_advisory_xact_lock(k)) AS n FROM (SELECT DISTINCT hashtext(a) AS k FROM unnest($1::text[]) AS x(a) ORDER BY 1) l`;

/**
 * The coverage rows of each (tenant, agent) of the batch that overlap or touch the span `[lo, hi]` the batch reports
 * for it: rows are disjoint, so that is the last one starting at or before `lo` (if it reaches `lo`) and those
 * starting inside; two primary-key ranges per agent.
 */
const coverageSql = `
SELECT q.t AS tenant_id, q.a AS agent_id, c.start_ms, c.end_ms, array_to_string(c.host_ids, ',') AS hosts
FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[]) AS q(t, a, lo, hi)
CROSS JOIN LATERAL (
  SELECT start_ms, end_ms, host_ids FROM meter_coverage
  WHERE tenant_id = q.t AND agent_id = q.a AND start_ms <= q.hi
    AND start_ms >= coalesce((SELECT max(start_ms) FROM meter_coverage WHERE tenant_id = q.t AND agent_id = q.a AND start_ms <= q.lo), q.lo)
) c
WHERE c.end_ms >= q.lo`;

const coverageDeleteSql = `
DELETE FROM meter_coverage c USING unnest($1::text[], $2::text[], $3::int8[]) AS d(t, a, s)
WHERE c.tenant_id = d.t AND c.agent_id = d.a AND c.start_ms = d.s`;

const coverageUpsertSql = `
INSERT INTO meter_coverage AS c (tenant_id, agent_id, start_ms, end_ms, host_ids)
SELECT t, a, s, e, string_to_array(h, ',') FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[]) AS x(t, a, s, e, h)
ON CONFLICT (tenant_id, agent_id, start_ms) DO UPDATE SET end_ms = excluded.end_ms, host_ids = excluded.host_ids`;

const clipSql = `
UPDATE meter_segments m SET billed_spans = c.b::int8multirange, overlap_ms = c.o
FROM unnest($1::text[], $2::text[], $3::int8[]) AS c(id, b, o) WHERE m.id = c.id`;

const existingSql = `
SELECT id, tenant_id, agent_id, run_id, (extract(epoch from started_at) * 1000)::int8 AS s, (extract(epoch from ended_at) * 1000)::int8 AS e,
  vcpus, mem_mib, start_reason, end_reason, state
FROM meter_segments WHERE id = ANY($1::text[])`;

/**
 * Counts every valid segment of `batch` exactly once, however often and in whatever order it arrives.
 * Rows and rollups are committed before this returns: only then may a shipper drop them from its spool.
 */
export async function ingestSegments(db: Db, batch: readonly unknown[], clock: Clock, opts: IngestOptions = {}): Promise<IngestResult> {
  if (!Array.isArray(batch)) throw new AppError("bad_request", "segments must be an array");
  if (batch.length > segmentLimits.maxBatch)
    throw new AppError("payload_too_large", `at most ${segmentLimits.maxBatch} segments per batch, got ${batch.length}`);
  const log = opts.log ?? silentLogger;
  const now = clock.now();
  const result: IngestResult = { accepted: [], duplicates: [], rejected: [] };

  const byId = new Map<string, ValidSegment>();
  const conflictingInBatch = new Set<string>();
  for (let i = 0; i < batch.length; i++) {
    const v = validateSegment(batch[i], i, now, opts.hostId);
    if (isRejection(v)) {
      result.rejected.push(v);
      continue;
    }
    const prev = byId.get(v.id);
    if (!prev) byId.set(v.id, v);
    else if (!sameBody(prev, v)) conflictingInBatch.add(v.id);
  }
  for (const id of conflictingInBatch) {
    byId.delete(id);
    result.rejected.push({ id, code: "conflict", message: "the batch carries this segment id twice with different bodies" });
  }
  if (byId.size === 0) return result;

  // Rows go in as they came (sorting 10k ids costs more than the rare deadlock it would prevent: two
  // concurrent shipments of the same host's segments; Postgres breaks it and `withRetry` runs it again).
  // Rollup rows, shared by every host, are written in key order.
  const valid = [...byId.values()];
  const runner = sqlRunner(db);
  const receivedAt = new Date(now).toISOString();
  const { written: inserted, clips } = await withRetry(() => writeBatch(runner, valid, receivedAt, opts.copy !== false));
  if (clips.size > 0) {
    logOverlaps(log, inserted, clips);
    const metrics = opts.metrics ?? noopMetrics;
    metrics.inc("agentvm_billing_overlap_segments_total", {}, clips.size);
    metrics.inc("agentvm_billing_overlap_seconds_total", {}, seconds([...clips.values()].reduce((n, c) => n + c.overlapMs, 0)));
  }
  const insertedIds = new Set(inserted.map((s) => s.id));
  for (const s of valid) if (insertedIds.has(s.id)) result.accepted.push(s.id);

  const others = valid.filter((s) => !insertedIds.has(s.id));
  if (others.length > 0) {
    const rows = await runner.query<Record<string, unknown>>(existingSql, [others.map((s) => s.id)]);
    const existing = new Map(rows.map((r) => [String(r.id), rowToSegment(r)]));
    const conflicts: { incoming: ValidSegment; existing: ValidSegment }[] = [];
    for (const s of others) {
      const e = existing.get(s.id);
      if (!e) continue; // neither written nor there: leave it out of every list, the shipper retries
      if (sameBody(e, s)) result.duplicates.push(s.id);
      else {
        conflicts.push({ incoming: s, existing: e });
        result.rejected.push({ id: s.id, code: "conflict", message: "this segment id was already counted with a different body" });
      }
    }
    if (conflicts.length > 0) {
      await runner.query(
        `INSERT INTO meter_conflicts (segment_id, received_at, incoming, existing)
         SELECT id, $2::text::timestamptz, i::jsonb, e::jsonb FROM unnest($1::text[], $3::text[], $4::text[]) AS c(id, i, e)`,
        [
          conflicts.map((c) => c.incoming.id),
          receivedAt,
          conflicts.map((c) => JSON.stringify(describe(c.incoming))),
          conflicts.map((c) => JSON.stringify(describe(c.existing))),
        ],
      );
      log.warn("meter segment ids reused with different bodies", {
        count: conflicts.length,
        ids: conflicts.slice(0, 10).map((c) => c.incoming.id),
        hostId: opts.hostId,
      });
    }
  }
  if (result.rejected.length > 0) log.warn("meter segments rejected", { count: result.rejected.length, first: result.rejected[0], hostId: opts.hostId });
  return result;
}

async function withRetry<T>(fn: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await fn();
    } catch (err) {
      const state = sqlState(err);
      // deadlock or serialization failure: the transaction rolled back as a whole, run it again
      if ((state === "40P01" || state === "40001") && attempt < 5) continue;
      throw err;
    }
  }
}

interface Written {
  written: ValidSegment[];
  /** The written segments that overlap time already billed for their agent, by id. */
  clips: Map<string, Clip>;
}

/**
 * Writes the segments not yet stored and their rollups in one transaction; returns the ones written and how those
 * that overlap time their agent was already billed for were clipped (their rows say so, the rollups hold the rest).
 */
async function writeBatch(runner: ReturnType<typeof sqlRunner>, valid: ValidSegment[], receivedAt: string, preferCopy: boolean): Promise<Written> {
  if (preferCopy && runner.copyIn) {
    try {
      return await runner.transaction(async (tx) => {
        const coverage = await lockAndReadCoverage(tx, valid);
        await tx.copyIn!("meter_segments", segmentColumns, copyRows(valid, receivedAt));
        const clips = await clip(tx, coverage, valid);
        await upsertRollups(tx, valid, clips);
        return { written: valid, clips };
      });
    } catch (err) {
      // no COPY here (postgres.js internals changed, or no Node streams, e.g. on Workers): INSERT from now on
      if (err instanceof CopyUnsupportedError || err instanceof TypeError) runner.copyIn = undefined;
      else if (sqlState(err) !== "23505") throw err;
      // otherwise some ids are already stored (a retry): take the path that skips them
    }
  }
  return runner.transaction(async (tx) => {
    const coverage = await lockAndReadCoverage(tx, valid);
    const rows = await tx.query<{ id: string }>(insertSql, [
      valid.map((s) => s.id),
      valid.map((s) => s.tenantId),
      valid.map((s) => s.agentId),
      valid.map((s) => s.runId),
      valid.map((s) => s.startedAt),
      valid.map((s) => s.endedAt),
      valid.map((s) => s.vcpus),
      valid.map((s) => s.memMiB),
      valid.map((s) => s.startReason),
      valid.map((s) => s.endReason),
      receivedAt,
      valid.map((s) => s.state),
    ]);
    const ids = new Set(rows.map((r) => r.id));
    const written = valid.filter((s) => ids.has(s.id));
    const clips = await clip(tx, coverage, written);
    await upsertRollups(tx, written, clips);
    return { written, clips };
  });
}

const agentKey = (tenantId: string, agentId: string) => `${tenantId}\u0000${agentId}`;

/**
 * Locks the batch's agents, then reads the time their stored segments cover around the batch's span, per agent
 * (written before this batch: a re-sent segment's time is in it).
 */
async function lockAndReadCoverage(tx: SqlRunner, valid: readonly ValidSegment[]): Promise<Map<string, CoverSpan[]>> {
  const spans = new Map<string, { tenantId: string; agentId: string; lo: number; hi: number }>();
  for (const s of valid) {
    const key = agentKey(s.tenantId, s.agentId);
    const span = spans.get(key);
    if (!span) spans.set(key, { tenantId: s.tenantId, agentId: s.agentId, lo: s.startMs, hi: s.endMs });
    else {
      if (s.startMs < span.lo) span.lo = s.startMs;
      if (s.endMs > span.hi) span.hi = s.endMs;
    }
  }
  const list = [...spans.values()];
  await tx.query(lockAgentsSql, [[...new Set(list.map((a) => a.agentId))]]);
  const rows = await tx.query<Record<string, unknown>>(coverageSql, [
    list.map((a) => a.tenantId),
    list.map((a) => a.agentId),
    list.map((a) => a.lo),
    list.map((a) => a.hi),
  ]);
  const out = new Map<string, CoverSpan[]>();
  for (const r of rows) {
    const key = agentKey(String(r.tenant_id), String(r.agent_id));
    let l = out.get(key);
    if (!l) out.set(key, (l = []));
    l.push({ startMs: toNumber(r.start_ms), endMs: toNumber(r.end_ms), hostIds: String(r.hosts).split(",") });
  }
  return out;
}

/**
 * Clips the written segments by the time already covered (and by each other, in batch order), marks the clipped
 * rows, and adds the written segments' time to their agents' coverage.
 */
async function clip(tx: SqlRunner, coverage: Map<string, CoverSpan[]>, written: readonly ValidSegment[]): Promise<Map<string, Clip>> {
  const byAgent = new Map<string, ValidSegment[]>();
  for (const s of written) {
    const key = agentKey(s.tenantId, s.agentId);
    const l = byAgent.get(key);
    if (l) l.push(s);
    else byAgent.set(key, [s]);
  }
  const clips = new Map<string, Clip>();
  const del = { t: [] as string[], a: [] as string[], s: [] as number[] };
  const up = { t: [] as string[], a: [] as string[], s: [] as number[], e: [] as number[], h: [] as string[] };
  for (const [key, segments] of byAgent) {
    const read = coverage.get(key) ?? [];
    for (const [id, c] of clipAgainst(billedSpansOf(read), segments)) clips.set(id, c);
    const { tenantId, agentId } = segments[0]!;
    const { upsert, removed } = mergeCoverage(read, segments);
    for (const start of removed) {
      del.t.push(tenantId);
      del.a.push(agentId);
      del.s.push(start);
    }
    for (const c of upsert) {
      up.t.push(tenantId);
      up.a.push(agentId);
      up.s.push(c.startMs);
      up.e.push(c.endMs);
      up.h.push(c.hostIds.join(","));
    }
  }
  if (del.s.length > 0) await tx.query(coverageDeleteSql, [del.t, del.a, del.s]);
  if (up.s.length > 0) await tx.query(coverageUpsertSql, [up.t, up.a, up.s, up.e, up.h]);
  if (clips.size > 0) {
    const ids = [...clips.keys()].sort();
    await tx.query(clipSql, [ids, ids.map((id) => multirangeText(clips.get(id)!.pieces)), ids.map((id) => clips.get(id)!.overlapMs)]);
  }
  return clips;
}

/** One warning per agent whose segments overlapped time it was already billed for. */
function logOverlaps(log: Logger, written: readonly ValidSegment[], clips: Map<string, Clip>): void {
  const byAgent = new Map<string, { tenantId: string; agentId: string; hostIds: Set<string>; overlapMs: number; segments: string[] }>();
  for (const s of written) {
    const c = clips.get(s.id);
    if (!c) continue;
    const key = agentKey(s.tenantId, s.agentId);
    let a = byAgent.get(key);
    if (!a) byAgent.set(key, (a = { tenantId: s.tenantId, agentId: s.agentId, hostIds: new Set(), overlapMs: 0, segments: [] }));
    a.hostIds.add(s.hostId);
    for (const h of c.coveredBy) a.hostIds.add(h);
    a.overlapMs += c.overlapMs;
    a.segments.push(s.id);
  }
  for (const a of byAgent.values())
    log.warn("meter segments overlap time already billed for their agent: billed only the rest", {
      tenantId: a.tenantId,
      agentId: a.agentId,
      hostIds: [...a.hostIds].sort(),
      overlapMs: a.overlapMs,
      segments: a.segments.length,
      ids: a.segments.slice(0, 10),
    });
}

/** Tab-separated COPY rows; validation guarantees no field needs escaping. */
function copyRows(valid: readonly ValidSegment[], receivedAt: string): string {
  let out = "";
  for (const s of valid) {
    out += `${s.id}\t${s.tenantId}\t${s.agentId}\t${s.runId}\t${s.startedAt}\t${s.endedAt}\t${s.vcpus}\t${s.memMiB}\t${s.startReason}\t${s.endReason}\t${receivedAt}\t${s.state}\n`;
  }
  return out;
}

/** Active time and its vCPU- and MiB-ms; dozing time and its vCPU- and MiB-ms (a dozing segment adds to these only). */
interface Sums {
  active: number;
  vcpu: number;
  mib: number;
  dozed: number;
  dozedVcpu: number;
  dozedMib: number;
}

const noSums = (): Sums => ({ active: 0, vcpu: 0, mib: 0, dozed: 0, dozedVcpu: 0, dozedMib: 0 });

/** Adds `ms` of segment `s` to `sums`: to the active columns, or to the dozed ones when it dozed. */
function addTo(sums: Sums, s: ValidSegment, ms: number): void {
  if (s.state === "dozing") {
    sums.dozed += ms;
    sums.dozedVcpu += ms * s.vcpus;
    sums.dozedMib += ms * s.memMiB;
  } else {
    sums.active += ms;
    sums.vcpu += ms * s.vcpus;
    sums.mib += ms * s.memMiB;
  }
}

/**
 * Adds the written segments to the 15-minute and per-run rollups, in primary-key order: a clipped segment only its
 * billed pieces (its run also counts the ms left out, and the segment; its first and last instants are the raw span's).
 */
async function upsertRollups(tx: SqlRunner, written: readonly ValidSegment[], clips: ReadonlyMap<string, Clip>): Promise<void> {
  if (written.length === 0) return;
  // tenant → bucket → agent → sums (the primary key's order)
  const buckets = new Map<string, Map<number, Map<string, Sums>>>();
  const runs = new Map<string, Sums & { tenantId: string; agentId: string; n: number; overlap: number; first: number; last: number }>();
  for (const s of written) {
    let byBucket = buckets.get(s.tenantId);
    if (!byBucket) buckets.set(s.tenantId, (byBucket = new Map()));
    const c = clips.size > 0 ? clips.get(s.id) : undefined;
    const pieces: readonly Span[] = c ? c.pieces : [[s.startMs, s.endMs]];
    let billedMs = 0;
    for (const [start, end] of pieces) {
      billedMs += end - start;
      for (let b = Math.floor(start / bucketMs); b * bucketMs < end; b++) {
        const ms = Math.min(end, (b + 1) * bucketMs) - Math.max(start, b * bucketMs);
        let byAgent = byBucket.get(b);
        if (!byAgent) byBucket.set(b, (byAgent = new Map()));
        let sums = byAgent.get(s.agentId);
        if (!sums) byAgent.set(s.agentId, (sums = noSums()));
        addTo(sums, s, ms);
      }
    }
    let run = runs.get(s.runId);
    if (run) {
      run.n++;
      run.first = Math.min(run.first, s.startMs);
      run.last = Math.max(run.last, s.endMs);
    } else runs.set(s.runId, (run = { ...noSums(), tenantId: s.tenantId, agentId: s.agentId, n: 1, overlap: 0, first: s.startMs, last: s.endMs }));
    addTo(run, s, billedMs);
    if (c) run.overlap += c.overlapMs;
  }
  const t: string[] = [];
  const b: number[] = [];
  const a: string[] = [];
  const x: number[] = [];
  const y: number[] = [];
  const z: number[] = [];
  const d: number[] = [];
  const dm: number[] = [];
  const dv: number[] = [];
  for (const tenant of [...buckets.keys()].sort()) {
    const byBucket = buckets.get(tenant)!;
    for (const bucket of [...byBucket.keys()].sort((p, q) => p - q)) {
      const byAgent = byBucket.get(bucket)!;
      for (const agent of [...byAgent.keys()].sort()) {
        const sums = byAgent.get(agent)!;
        t.push(tenant);
        b.push(bucket);
        a.push(agent);
        x.push(sums.active);
        y.push(sums.vcpu);
        z.push(sums.mib);
        d.push(sums.dozed);
        dm.push(sums.dozedMib);
        dv.push(sums.dozedVcpu);
      }
    }
  }
  await tx.query(bucketUpsertSql, [t, b, a, x, y, z, d, dm, dv]);
  const runIds = [...runs.keys()].sort();
  const rs = runIds.map((id) => runs.get(id)!);
  await tx.query(runUpsertSql, [
    runIds,
    rs.map((r) => r.tenantId),
    rs.map((r) => r.agentId),
    rs.map((r) => r.active),
    rs.map((r) => r.vcpu),
    rs.map((r) => r.mib),
    rs.map((r) => r.n),
    rs.map((r) => r.first),
    rs.map((r) => r.last),
    rs.map((r) => r.dozed),
    rs.map((r) => r.dozedMib),
    rs.map((r) => r.dozedVcpu),
    rs.map((r) => r.overlap),
  ]);
}

function rowToSegment(r: Record<string, unknown>): ValidSegment {
  const startMs = toNumber(r.s);
  const endMs = toNumber(r.e);
  const id = String(r.id);
  return {
    id,
    hostId: id.split(":")[0] ?? "",
    tenantId: String(r.tenant_id),
    agentId: String(r.agent_id),
    runId: String(r.run_id),
    startMs,
    endMs,
    startedAt: new Date(startMs).toISOString(),
    endedAt: new Date(endMs).toISOString(),
    vcpus: toNumber(r.vcpus),
    memMiB: toNumber(r.mem_mib),
    startReason: String(r.start_reason) as ValidSegment["startReason"],
    endReason: String(r.end_reason) as ValidSegment["endReason"],
    state: r.state === "dozing" ? "dozing" : "active",
  };
}

function describe(s: ValidSegment): Record<string, unknown> {
  return {
    id: s.id,
    tenantId: s.tenantId,
    agentId: s.agentId,
    runId: s.runId,
    startedAt: new Date(s.startMs).toISOString(),
    endedAt: new Date(s.endMs).toISOString(),
    vcpus: s.vcpus,
    memMiB: s.memMiB,
    startReason: s.startReason,
    endReason: s.endReason,
    state: s.state,
  };
}

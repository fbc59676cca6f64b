// Idempotent ingest of meter segments: validate, write raw rows and rollups in one transaction, then answer per id.
import type { IngestResult } from "../contracts/meter.ts";
import type { Clock } from "../lib/clock.ts";
import { AppError } from "../lib/errors.ts";
import { silentLogger, type Logger } from "../lib/log.ts";
import type { Db } from "../schema/db.ts";
import { bucketMs } from "./buckets.ts";
import { CopyUnsupportedError, sqlRunner, sqlState, toNumber, type SqlRunner } from "./sql-runner.ts";
import { isRejection, sameBody, segmentLimits, validateSegment, type ValidSegment } from "./validate.ts";

export interface IngestOptions {
  /** The authenticated host of an HTTP shipment: it may only report its own segments. */
  hostId?: string;
  log?: Logger;
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
INSERT INTO run_usage AS u (run_id, tenant_id, agent_id, active_ms, vcpu_ms, mib_ms, dozed_ms, dozed_vcpu_ms, dozed_mib_ms, segments, first_started_at, last_ended_at)
SELECT r, t, a, x, y, z, d, dv, dm, n, 'epoch'::timestamptz + f * interval '1 millisecond', 'epoch'::timestamptz + l * interval '1 millisecond'
FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::int8[], $6::int8[], $7::int4[], $8::int8[], $9::int8[], $10::int8[], $11::int8[], $12::int8[])
  AS q(r, t, a, x, y, z, n, f, l, d, dm, dv)
ON CONFLICT (run_id) DO UPDATE SET
  active_ms = u.active_ms + excluded.active_ms, vcpu_ms = u.vcpu_ms + excluded.vcpu_ms, mib_ms = u.mib_ms + excluded.mib_ms,
  dozed_ms = u.dozed_ms + excluded.dozed_ms, dozed_vcpu_ms = u.dozed_vcpu_ms + excluded.dozed_vcpu_ms, dozed_mib_ms = u.dozed_mib_ms + excluded.dozed_mib_ms,
  segments = u.segments + excluded.segments,
  first_started_at = least(u.first_started_at, excluded.first_started_at), last_ended_at = greatest(u.last_ended_at, excluded.last_ended_at)`;

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
  const inserted = await withRetry(() => writeBatch(runner, valid, receivedAt, opts.copy !== false));
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

/** Writes the segments not yet stored and their rollups in one transaction; returns the ones written. */
async function writeBatch(runner: ReturnType<typeof sqlRunner>, valid: ValidSegment[], receivedAt: string, preferCopy: boolean): Promise<ValidSegment[]> {
  if (preferCopy && runner.copyIn) {
    try {
      return await runner.transaction(async (tx) => {
        await tx.copyIn!("meter_segments", segmentColumns, copyRows(valid, receivedAt));
        await upsertRollups(tx, valid);
        return valid;
      });
    } catch (err) {
      // no COPY here (postgres.js internals changed, or no Node streams, e.g. on Workers): INSERT from now on
      if (err instanceof CopyUnsupportedError || err instanceof TypeError) runner.copyIn = undefined;
      else if (sqlState(err) !== "23505") throw err;
      // otherwise some ids are already stored (a retry): take the path that skips them
    }
  }
  return runner.transaction(async (tx) => {
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
    await upsertRollups(tx, written);
    return written;
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

/** Adds the written segments to the 15-minute and per-run rollups, in primary-key order. */
async function upsertRollups(tx: SqlRunner, written: readonly ValidSegment[]): Promise<void> {
  if (written.length === 0) return;
  // tenant → bucket → agent → sums (the primary key's order)
  const buckets = new Map<string, Map<number, Map<string, Sums>>>();
  const runs = new Map<string, Sums & { tenantId: string; agentId: string; n: number; first: number; last: number }>();
  for (const s of written) {
    let byBucket = buckets.get(s.tenantId);
    if (!byBucket) buckets.set(s.tenantId, (byBucket = new Map()));
    for (let b = Math.floor(s.startMs / bucketMs); b * bucketMs < s.endMs; b++) {
      const ms = Math.min(s.endMs, (b + 1) * bucketMs) - Math.max(s.startMs, b * bucketMs);
      let byAgent = byBucket.get(b);
      if (!byAgent) byBucket.set(b, (byAgent = new Map()));
      let sums = byAgent.get(s.agentId);
      if (!sums) byAgent.set(s.agentId, (sums = noSums()));
      addTo(sums, s, ms);
    }
    let run = runs.get(s.runId);
    if (run) {
      run.n++;
      run.first = Math.min(run.first, s.startMs);
      run.last = Math.max(run.last, s.endMs);
    } else runs.set(s.runId, (run = { ...noSums(), tenantId: s.tenantId, agentId: s.agentId, n: 1, first: s.startMs, last: s.endMs }));
    addTo(run, s, s.endMs - s.startMs);
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

// Snapshot storage and hibernated time: byte-milliseconds of hibernated snapshots (from the VM event log: `snapshot_bytes` or `snapshotBytes` in a hibernation's timings) plus those of checkpoints (their own bytes, from creation to deletion).
import type { Db } from "../schema/db.ts";
import { sqlRunner, toNumber } from "./sql-runner.ts";

export interface StateEvent {
  at: number;
  toState: string;
  /** Snapshot size recorded with a transition to `hibernated`. */
  snapshotBytes: number | undefined;
}

/**
 * Byte-ms of snapshot held while hibernated within `[from, to)`: each transition to `hibernated` holds its
 * snapshot's bytes until the agent's next transition. `events` are one agent's, oldest first, and include the
 * last event before `from` (the state the period starts in). A hibernation without a recorded size counts 0.
 */
export function hibernatedByteMs(events: readonly StateEvent[], from: number, to: number): bigint {
  let total = 0n;
  for (let i = 0; i < events.length; i++) {
    const e = events[i] as StateEvent;
    if (e.toState !== "hibernated" || !e.snapshotBytes) continue;
    const next = events[i + 1];
    const start = Math.max(e.at, from);
    const end = Math.min(next ? next.at : to, to);
    if (end > start) total += BigInt(e.snapshotBytes) * BigInt(end - start);
  }
  return total;
}

/**
 * Per agent of `tenantId`: byte-ms of snapshot storage within `[from, to)`: its snapshot while hibernated, plus each of
 * its checkpoints' bytes from `created_at` to `deleted_at` (or `to`). One figure (the `snapshot_storage` resource), so a
 * rate card prices a checkpoint's byte like a snapshot's; the agent it was taken of carries it.
 */
export async function snapshotStorage(db: Db, tenantId: string, from: number, to: number): Promise<Map<string, bigint>> {
  const out = await hibernatedStorage(db, tenantId, from, to);
  for (const [agent, byteMs] of await checkpointStorage(db, tenantId, from, to)) out.set(agent, (out.get(agent) ?? 0n) + byteMs);
  return out;
}

/** Per agent of `tenantId`: byte-ms its checkpoints held within `[from, to)`, deleted ones up to their deletion. */
export async function checkpointStorage(db: Db, tenantId: string, from: number, to: number): Promise<Map<string, bigint>> {
  // The overlap of [created_at, deleted_at or ∞) with [from, to), in ms, times the bytes: summed in Postgres as numeric (no 2^53 limit).
  const rows = await sqlRunner(db).query<{ agent_id: string; byte_ms: unknown }>(
    `SELECT agent_id, sum(bytes::numeric * (
         extract(epoch FROM least(coalesce(deleted_at, $3::text::timestamptz), $3::text::timestamptz)) * 1000
       - extract(epoch FROM greatest(created_at, $2::text::timestamptz)) * 1000))::numeric(40, 0)::text AS byte_ms
     FROM checkpoints
     WHERE tenant_id = $1 AND created_at < $3::text::timestamptz AND (deleted_at IS NULL OR deleted_at > $2::text::timestamptz)
     GROUP BY agent_id`,
    [tenantId, new Date(from).toISOString(), new Date(to).toISOString()],
  );
  const out = new Map<string, bigint>();
  for (const r of rows) {
    const v = BigInt(String(r.byte_ms));
    if (v > 0n) out.set(r.agent_id, v);
  }
  return out;
}

/**
 * Per agent of `tenantId` (or only `agentId`): its VM events that say what state it was in within `[from, to)`, oldest
 * first, starting with the last one before `from` (the state the range starts in).
 */
async function stateEvents(db: Db, tenantId: string, from: number, to: number, agentId?: string): Promise<Map<string, StateEvent[]>> {
  const params: unknown[] = [tenantId, new Date(from).toISOString(), new Date(to).toISOString()];
  if (agentId !== undefined) params.push(agentId);
  const rows = await sqlRunner(db).query<{ agent_id: string; at_ms: unknown; to_state: string; bytes: unknown }>(
    `WITH mine AS (SELECT id FROM agents WHERE tenant_id = $1${agentId !== undefined ? " AND id = $4" : ""}),
     before AS (
       SELECT p.* FROM mine, LATERAL (
         SELECT e.id, e.agent_id, e.at, e.to_state, e.timings FROM vm_events e
         WHERE e.agent_id = mine.id AND e.at < $2::text::timestamptz ORDER BY e.at DESC, e.id DESC LIMIT 1) p
     ),
     inside AS (
       SELECT e.id, e.agent_id, e.at, e.to_state, e.timings FROM vm_events e JOIN mine ON mine.id = e.agent_id
       WHERE e.at >= $2::text::timestamptz AND e.at < $3::text::timestamptz
     )
     SELECT agent_id, (extract(epoch FROM at) * 1000)::int8 AS at_ms, to_state, coalesce(timings ->> 'snapshot_bytes', timings ->> 'snapshotBytes') AS bytes
     FROM (SELECT * FROM before UNION ALL SELECT * FROM inside) x
     ORDER BY agent_id, at, id`,
    params,
  );
  const byAgent = new Map<string, StateEvent[]>();
  for (const r of rows) {
    let list = byAgent.get(r.agent_id);
    if (!list) byAgent.set(r.agent_id, (list = []));
    const bytes = r.bytes === null || r.bytes === undefined ? undefined : Number(r.bytes);
    list.push({
      at: toNumber(r.at_ms),
      toState: r.to_state,
      snapshotBytes: bytes !== undefined && Number.isSafeInteger(bytes) && bytes > 0 ? bytes : undefined,
    });
  }
  return byAgent;
}

/** Per agent of `tenantId`: byte-ms of snapshot storage while hibernated within `[from, to)`. */
async function hibernatedStorage(db: Db, tenantId: string, from: number, to: number): Promise<Map<string, bigint>> {
  const out = new Map<string, bigint>();
  for (const [agent, events] of await stateEvents(db, tenantId, from, to)) {
    const v = hibernatedByteMs(events, from, to);
    if (v > 0n) out.set(agent, v);
  }
  return out;
}

/**
 * Ms hibernated in each window `[boundaries[w], boundaries[w + 1])`: each transition to `hibernated` lasts until the
 * agent's next transition (or the last boundary). Every hibernation counts, with or without a recorded snapshot size
 * (storage is billed by size; this says how long the agent slept on its snapshot). `events` as in `hibernatedByteMs`.
 */
export function hibernatedMsByWindow(events: readonly StateEvent[], boundaries: readonly number[]): Map<number, number> {
  const out = new Map<number, number>();
  const last = boundaries.length - 1;
  if (last < 1) return out;
  const to = boundaries[last] as number;
  for (let i = 0; i < events.length; i++) {
    const e = events[i] as StateEvent;
    if (e.toState !== "hibernated") continue;
    const start = Math.max(e.at, boundaries[0] as number);
    const end = Math.min(events[i + 1]?.at ?? to, to);
    if (!(end > start)) continue;
    // the first window ending after `start`, then every window up to `end`
    let lo = 0;
    let hi = last - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if ((boundaries[mid + 1] as number) <= start) lo = mid + 1;
      else hi = mid;
    }
    for (let w = lo; w < last && (boundaries[w] as number) < end; w++) {
      const ms = Math.min(end, boundaries[w + 1] as number) - Math.max(start, boundaries[w] as number);
      if (ms > 0) out.set(w, (out.get(w) ?? 0) + ms);
    }
  }
  return out;
}

/** Hibernated ms of `tenantId`'s agents (or only `agentId`) per window of `boundaries` (ascending), per agent. */
export async function hibernatedTime(db: Db, tenantId: string, boundaries: readonly number[], agentId?: string): Promise<Map<string, Map<number, number>>> {
  const out = new Map<string, Map<number, number>>();
  if (boundaries.length < 2) return out;
  const events = await stateEvents(db, tenantId, boundaries[0] as number, boundaries[boundaries.length - 1] as number, agentId);
  for (const [agent, list] of events) {
    const byWindow = hibernatedMsByWindow(list, boundaries);
    if (byWindow.size > 0) out.set(agent, byWindow);
  }
  return out;
}

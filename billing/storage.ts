// Snapshot storage while hibernated: byte-milliseconds from the VM event log (`snapshot_bytes` or `snapshotBytes` in a hibernation's timings).
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

/** Per agent of `tenantId`: byte-ms of snapshot storage while hibernated within `[from, to)`. */
export async function snapshotStorage(db: Db, tenantId: string, from: number, to: number): Promise<Map<string, bigint>> {
  const rows = await sqlRunner(db).query<{ agent_id: string; at_ms: unknown; to_state: string; bytes: unknown }>(
    `WITH mine AS (SELECT id FROM agents WHERE tenant_id = $1),
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
    [tenantId, new Date(from).toISOString(), new Date(to).toISOString()],
  );
  const byAgent = new Map<string, StateEvent[]>();
  for (const r of rows) {
    let list = byAgent.get(r.agent_id);
    if (!list) byAgent.set(r.agent_id, (list = []));
    const bytes = r.bytes === null || r.bytes === undefined ? undefined : Number(r.bytes);
    list.push({ at: toNumber(r.at_ms), toState: r.to_state, snapshotBytes: bytes !== undefined && Number.isSafeInteger(bytes) && bytes > 0 ? bytes : undefined });
  }
  const out = new Map<string, bigint>();
  for (const [agent, events] of byAgent) {
    const v = hibernatedByteMs(events, from, to);
    if (v > 0n) out.set(agent, v);
  }
  return out;
}

// Checkpoints as the gateway reads them (drizzle; Postgres or PGlite): hosts write the rows, the API lists and resolves them.
import { and, asc, eq, isNull, sql } from "drizzle-orm";
import type { Db } from "../../schema/db.ts";
import { checkpoints } from "../../schema/core.ts";
import type { Caller } from "../../contracts/caller.ts";
import { AppError } from "../../lib/errors.ts";
import { isId } from "../../lib/ids.ts";
import { microsIso, ownAgent, type AgentRepo } from "../agents/repo.ts";

export type CheckpointRow = typeof checkpoints.$inferSelect;
/** A listed checkpoint with its position in the order (the cursor after it): `createdAtUs` is µs since the epoch, as stored. */
export type PagedCheckpointRow = CheckpointRow & { createdAtUs: number };

export interface CheckpointPosition {
  createdAtUs: number;
  id: string;
}

export interface CheckpointRepo {
  /** A live checkpoint by id, whatever its tenant: callers check the tenant. */
  get(id: string): Promise<CheckpointRow | undefined>;
  /** The agent's live checkpoint of that name. */
  byName(agentId: string, name: string): Promise<CheckpointRow | undefined>;
  /** One query: the agent's live checkpoints, oldest first (createdAt, id), at most `limit` after `after`. */
  page(agentId: string, q: { limit: number; after?: CheckpointPosition | undefined }): Promise<PagedCheckpointRow[]>;
}

export function createCheckpointRepo(db: Db): CheckpointRepo {
  return {
    async get(id) {
      const rows = await db
        .select()
        .from(checkpoints)
        .where(and(eq(checkpoints.id, id), isNull(checkpoints.deletedAt)))
        .limit(1);
      return rows[0];
    },
    async byName(agentId, name) {
      const rows = await db
        .select()
        .from(checkpoints)
        .where(and(eq(checkpoints.agentId, agentId), eq(checkpoints.name, name), isNull(checkpoints.deletedAt)))
        .limit(1);
      return rows[0];
    },
    async page(agentId, q) {
      // As for agents: the position is compared in µs, or checkpoints taken within one millisecond would repeat or be skipped.
      const where = [eq(checkpoints.agentId, agentId), isNull(checkpoints.deletedAt)];
      if (q.after) where.push(sql`(${checkpoints.createdAt}, ${checkpoints.id}) > (${microsIso(q.after.createdAtUs)}::timestamptz, ${q.after.id})`);
      const rows = await db
        .select({ ...columns, createdAtUs: sql<string>`(extract(epoch from ${checkpoints.createdAt}) * 1000000)::bigint::text` })
        .from(checkpoints)
        .where(and(...where))
        .orderBy(asc(checkpoints.createdAt), asc(checkpoints.id))
        .limit(q.limit);
      return rows.map((r) => ({ ...r, createdAtUs: Number(r.createdAtUs) }));
    },
  };
}

const columns = {
  id: checkpoints.id,
  tenantId: checkpoints.tenantId,
  agentId: checkpoints.agentId,
  hostId: checkpoints.hostId,
  name: checkpoints.name,
  origin: checkpoints.origin,
  bytes: checkpoints.bytes,
  pausedMs: checkpoints.pausedMs,
  createdAt: checkpoints.createdAt,
  deletedAt: checkpoints.deletedAt,
  requestId: checkpoints.requestId,
};

/** The caller's own live checkpoint, or 404 (another tenant's does not exist for them); 400 for what is no checkpoint id. */
/** A checkpoint of the caller's by `ckp_…` id, or by `agt_…:name` (one of the caller's agents' checkpoints by name). */
export async function ownCheckpointRef(repo: CheckpointRepo, agents: AgentRepo, caller: Caller, ref: string, field: string): Promise<CheckpointRow> {
  const colon = ref.indexOf(":");
  if (colon < 0) return ownCheckpoint(repo, caller, ref, field);
  const agent = await ownAgent(agents, caller, ref.slice(0, colon));
  const name = ref.slice(colon + 1);
  const ckp = await repo.byName(agent.id, name);
  if (!ckp) throw new AppError("not_found", `${field}: agent ${agent.id} has no checkpoint named "${name.slice(0, 100)}"`);
  return ckp;
}

export async function ownCheckpoint(repo: CheckpointRepo, caller: Caller, id: string, field = "checkpointId"): Promise<CheckpointRow> {
  if (!isId("checkpoint", id)) throw new AppError("invalid_id", `${field}: "${id.slice(0, 64)}" is not a checkpoint id`);
  const row = await repo.get(id);
  if (!row || row.tenantId !== caller.tenantId) throw new AppError("not_found", `checkpoint ${id} not found`);
  return row;
}

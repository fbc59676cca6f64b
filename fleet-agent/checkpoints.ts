// A host's checkpoints: where their files are, their rows (the checkpoints table, with the audit log), and the per-key queue that keeps checkpoint work apart from wakes and snapshots.
import { join } from "node:path";
import { and, eq, inArray, isNull } from "drizzle-orm";
import { AppError } from "../lib/errors.ts";
import { isId } from "../lib/ids.ts";
import type { Db } from "../schema/db.ts";
import { agents, checkpoints } from "../schema/core.ts";
import { createDbAuditLog } from "../schema/audit-log.ts";
import { isUniqueViolation } from "../schema/db-errors.ts";
import type { CheckpointView } from "../contracts/fleet.ts";

/** A checkpoint's row as the host writes it. */
export type CheckpointRecord = Omit<CheckpointView, "createdAt"> & { createdAt: Date; requestId: string | null };

/** Where a host records its checkpoints (the database; a test may keep them in memory). */
export interface CheckpointStore {
  /** Inserts the row and audits it (`vm.checkpoint`, the host as actor); AppError `conflict` when the agent has a live checkpoint of that name. */
  insert(r: CheckpointRecord): Promise<void>;
  /** A live checkpoint by id. */
  get(id: string): Promise<CheckpointRecord | undefined>;
  /** Whether the agent has a live checkpoint named `name`. */
  nameTaken(agentId: string, name: string): Promise<boolean>;
  /** Marks one deleted (`vm.checkpoint.delete` audited); false when it was not live. */
  markDeleted(id: string, at: Date): Promise<boolean>;
  /** Marks every live checkpoint of the agent on `hostId` deleted; answers their ids (their files are the host's to remove). */
  deleteOfAgent(agentId: string, hostId: string, at: Date): Promise<string[]>;
  /** Which of these ids are live checkpoints (a row, not deleted). */
  liveOf(ids: readonly string[]): Promise<Set<string>>;
  /** The checkpoint the agent was forked from (`agents.forked_from`): the one, besides its own, a reset restores it to. */
  forkedFrom(agentId: string): Promise<string | undefined>;
}

/** A checkpoint's files: `<checkpointsDir>/<id>` (the id is checked: it names a directory). */
export function checkpointDir(checkpointsDir: string, id: string): string {
  if (!isId("checkpoint", id)) throw new AppError("invalid_id", `"${id.slice(0, 64)}" is not a checkpoint id`);
  return join(checkpointsDir, id);
}

export function createDbCheckpointStore(db: Db): CheckpointStore {
  const audit = createDbAuditLog(db);
  const live = (id: string) => and(eq(checkpoints.id, id), isNull(checkpoints.deletedAt));
  return {
    async forkedFrom(agentId) {
      const rows = await db.select({ forkedFrom: agents.forkedFrom }).from(agents).where(eq(agents.id, agentId)).limit(1);
      return rows[0]?.forkedFrom ?? undefined;
    },
    async insert(r) {
      try {
        await db.transaction(async (tx) => {
          await tx.insert(checkpoints).values(r);
          await audit.within(tx).record({
            at: r.createdAt,
            tenantId: r.tenantId,
            actor: r.hostId,
            action: "vm.checkpoint",
            target: r.agentId,
            requestId: r.requestId,
            detail: { checkpointId: r.id, name: r.name, origin: r.origin, bytes: r.bytes, pausedMs: r.pausedMs },
          });
        });
      } catch (err) {
        if (isUniqueViolation(err)) throw new AppError("conflict", `agent ${r.agentId} already has a checkpoint named "${r.name}"`);
        throw err;
      }
    },
    async get(id) {
      const rows = await db.select().from(checkpoints).where(live(id)).limit(1);
      const row = rows[0];
      return row ? recordOf(row) : undefined;
    },
    async nameTaken(agentId, name) {
      const rows = await db
        .select({ id: checkpoints.id })
        .from(checkpoints)
        .where(and(eq(checkpoints.agentId, agentId), eq(checkpoints.name, name), isNull(checkpoints.deletedAt)))
        .limit(1);
      return rows.length > 0;
    },
    async markDeleted(id, at) {
      return db.transaction(async (tx) => {
        const rows = await tx.update(checkpoints).set({ deletedAt: at }).where(live(id)).returning();
        const row = rows[0];
        if (!row) return false;
        await audit.within(tx).record({
          at,
          tenantId: row.tenantId,
          actor: row.hostId,
          action: "vm.checkpoint.delete",
          target: row.agentId,
          detail: { checkpointId: row.id, name: row.name },
        });
        return true;
      });
    },
    async deleteOfAgent(agentId, hostId, at) {
      const rows = await db
        .update(checkpoints)
        .set({ deletedAt: at })
        .where(and(eq(checkpoints.agentId, agentId), eq(checkpoints.hostId, hostId), isNull(checkpoints.deletedAt)))
        .returning({ id: checkpoints.id });
      return rows.map((r) => r.id);
    },
    async liveOf(ids) {
      if (ids.length === 0) return new Set();
      const rows = await db
        .select({ id: checkpoints.id })
        .from(checkpoints)
        .where(and(inArray(checkpoints.id, [...ids]), isNull(checkpoints.deletedAt)));
      return new Set(rows.map((r) => r.id));
    },
  };
}

function recordOf(row: typeof checkpoints.$inferSelect): CheckpointRecord {
  const { deletedAt: _deleted, ...rest } = row;
  return rest;
}

/** The row as the API and the fleet show it. */
export function checkpointView(r: CheckpointRecord): CheckpointView {
  return {
    id: r.id,
    tenantId: r.tenantId,
    agentId: r.agentId,
    hostId: r.hostId,
    name: r.name,
    origin: r.origin,
    bytes: r.bytes,
    pausedMs: r.pausedMs,
    createdAt: r.createdAt.toISOString(),
  };
}

/**
 * Work that must not overlap, one queue per key (an agent id, a checkpoint id): each piece starts when the one before
 * it under the same key has settled. `busy` is what a wake waits for before it starts.
 */
export class KeyedQueue {
  private readonly tails = new Map<string, Promise<unknown>>();

  has(key: string): boolean {
    return this.tails.has(key);
  }

  /** Settles (never rejects) once the work queued so far under `key` has; undefined when there is none. */
  busy(key: string): Promise<void> | undefined {
    const tail = this.tails.get(key);
    return tail?.then(
      () => undefined,
      () => undefined,
    );
  }

  run<T>(key: string, work: () => Promise<T>): Promise<T> {
    const before = this.tails.get(key) ?? Promise.resolve();
    const mine = before.then(work, work);
    this.tails.set(key, mine);
    const forget = () => {
      if (this.tails.get(key) === mine) this.tails.delete(key);
    };
    mine.then(forget, forget);
    return mine;
  }
}

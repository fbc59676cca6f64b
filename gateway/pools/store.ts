// Warm pools as the gateway keeps them (drizzle; Postgres or PGlite): the pool rows, their agents' places, the atomic hand-out.
import { and, asc, desc, eq, getTableColumns, inArray, isNull, sql } from "drizzle-orm";
import type { Db } from "../../schema/postgres.ts";
import { agents, checkpoints, pools, type PoolAgentState } from "../../schema/core.ts";
import { AppError } from "../../lib/errors.ts";
import { isUniqueViolation } from "../../schema/db-errors.ts";
import type { AgentRow, NewAgent } from "../agents/repo.ts";

export type PoolRow = typeof pools.$inferSelect;
export type NewPool = Pick<PoolRow, "id" | "tenantId" | "name" | "fromCheckpoint" | "size" | "maxSize">;

/** A pool's live agents by where they are in it. */
export interface PoolCounts {
  ready: number;
  inUse: number;
  resetting: number;
}

export const noAgents: PoolCounts = { ready: 0, inUse: 0, resetting: 0 };

/** Why a new agent is reserved: handed out at once (up to `maxSize` in all), or made ready by the top-up (up to `size` not in use). */
export type Reservation = "acquire" | "top-up";

export interface PoolStore {
  /** 409 conflict when the tenant has a live pool of that name. */
  create(pool: NewPool): Promise<PoolRow>;
  /** A live pool by id, whatever its tenant: callers check the tenant. */
  get(id: string): Promise<PoolRow | undefined>;
  /** The tenant's live pools, oldest first. */
  list(tenantId: string): Promise<PoolRow[]>;
  /** Every live pool of every tenant (what a gateway tops up at its start). */
  live(): Promise<PoolRow[]>;
  counts(poolIds: readonly string[]): Promise<Map<string, PoolCounts>>;
  /**
   * Hands out the pool's oldest ready agent: one statement that locks it with `FOR UPDATE SKIP LOCKED`, so concurrent
   * acquirers (in any gateway sharing the database) never get the same agent; undefined when none is ready.
   */
  claimReady(poolId: string): Promise<AgentRow | undefined>;
  /**
   * Inserts a new agent row into the pool under the pool row's lock, when the pool has room for it (`acquire`: fewer
   * than `maxSize` agents; `top-up`: fewer than `size` not in use, and fewer than `maxSize`); undefined when it has none
   * or the pool is no longer active. `acquire` inserts it `in_use`, `top-up` `resetting` (it is forked next).
   */
  reserve(poolId: string, agent: NewAgent, why: Reservation): Promise<AgentRow | undefined>;
  /** Sets an active pool's size and maxSize (under its row's lock: no reservation counts against the old ones after); undefined when it is not active. */
  resize(id: string, sizes: Pick<PoolRow, "size" | "maxSize">): Promise<PoolRow | undefined>;
  /**
   * Takes the pool's ready agents beyond its sizes out of it, newest first — beyond `size` not in use, or beyond
   * `maxSize` in all — and marks them deleted (their checkpoints with them), in one transaction under the pool row's
   * lock; handed-out agents are never taken. The caller removes their VMs.
   */
  takeSurplus(poolId: string): Promise<AgentRow[]>;
  /** Moves the agent's pool state when it is one of `from`; undefined when it was not (or it left the pool). */
  move(agentId: string, poolId: string, from: readonly PoolAgentState[], to: PoolAgentState): Promise<AgentRow | undefined>;
  /** The pool's live agents, in the given states (all when none given). */
  members(poolId: string, states?: readonly PoolAgentState[]): Promise<AgentRow[]>;
  /** Marks the pool `deleting` (no more hand-outs or top-ups); its row stays until `markDeleted`. */
  markDeleting(id: string): Promise<void>;
  markDeleted(id: string): Promise<void>;
}

export function createPoolStore(db: Db): PoolStore {
  return {
    async create(pool) {
      try {
        const rows = await db.insert(pools).values(pool).returning();
        return rows[0]!;
      } catch (err) {
        if (isUniqueViolation(err)) throw new AppError("conflict", `a pool named "${pool.name}" exists`);
        throw err;
      }
    },
    async get(id) {
      const rows = await db
        .select()
        .from(pools)
        .where(and(eq(pools.id, id), isNull(pools.deletedAt)))
        .limit(1);
      return rows[0];
    },
    list(tenantId) {
      return db
        .select()
        .from(pools)
        .where(and(eq(pools.tenantId, tenantId), isNull(pools.deletedAt)))
        .orderBy(asc(pools.createdAt), asc(pools.id));
    },
    live() {
      return db.select().from(pools).where(isNull(pools.deletedAt)).orderBy(asc(pools.createdAt));
    },
    async counts(poolIds) {
      const out = new Map<string, PoolCounts>();
      if (poolIds.length === 0) return out;
      const rows = await db
        .select({ poolId: agents.poolId, state: agents.poolState, n: sql<number>`count(*)::int` })
        .from(agents)
        .where(and(inArray(agents.poolId, [...poolIds]), isNull(agents.deletedAt)))
        .groupBy(agents.poolId, agents.poolState);
      for (const r of rows) {
        const c = out.get(r.poolId!) ?? { ...noAgents };
        if (r.state === "ready") c.ready += Number(r.n);
        else if (r.state === "in_use") c.inUse += Number(r.n);
        else c.resetting += Number(r.n);
        out.set(r.poolId!, c);
      }
      return out;
    },
    async claimReady(poolId) {
      const rows = await db
        .update(agents)
        .set({ poolState: "in_use", poolAcquiredAt: sql`now()` })
        .where(
          and(
            eq(
              agents.id,
              sql`(select id from ${agents} where pool_id = ${poolId} and pool_state = 'ready' and deleted_at is null
                   order by created_at, id limit 1 for update skip locked)`,
            ),
            eq(agents.poolState, "ready"),
            isNull(agents.deletedAt),
          ),
        )
        .returning();
      return rows[0];
    },
    reserve(poolId, agent, why) {
      return db.transaction(async (tx) => {
        const [pool] = await tx
          .select()
          .from(pools)
          .where(and(eq(pools.id, poolId), isNull(pools.deletedAt), eq(pools.state, "active")))
          .for("update");
        if (!pool) return undefined;
        const [n] = await tx
          .select({
            all: sql<number>`count(*)::int`,
            notInUse: sql<number>`(count(*) filter (where pool_state <> 'in_use'))::int`,
          })
          .from(agents)
          .where(and(eq(agents.poolId, poolId), isNull(agents.deletedAt)));
        const all = Number(n?.all ?? 0);
        const notInUse = Number(n?.notInUse ?? 0);
        if (all >= pool.maxSize || (why === "top-up" && notInUse >= pool.size)) return undefined;
        const rows = await tx
          .insert(agents)
          .values({
            ...agent,
            poolId,
            poolState: why === "acquire" ? "in_use" : "resetting",
            poolAcquiredAt: why === "acquire" ? new Date() : null,
          })
          .returning();
        return rows[0];
      });
    },
    async resize(id, sizes) {
      const rows = await db
        .update(pools)
        .set({ size: sizes.size, maxSize: sizes.maxSize, updatedAt: sql`now()` })
        .where(and(eq(pools.id, id), isNull(pools.deletedAt), eq(pools.state, "active")))
        .returning();
      return rows[0];
    },
    takeSurplus(poolId) {
      return db.transaction(async (tx) => {
        const [pool] = await tx
          .select()
          .from(pools)
          .where(and(eq(pools.id, poolId), isNull(pools.deletedAt)))
          .for("update");
        if (!pool) return [];
        const [n] = await tx
          .select({
            all: sql<number>`count(*)::int`,
            notInUse: sql<number>`(count(*) filter (where pool_state <> 'in_use'))::int`,
          })
          .from(agents)
          .where(and(eq(agents.poolId, poolId), isNull(agents.deletedAt)));
        const surplus = Math.max(0, Number(n?.notInUse ?? 0) - pool.size, Number(n?.all ?? 0) - pool.maxSize);
        if (surplus === 0) return [];
        const taken = await tx
          .select({ id: agents.id })
          .from(agents)
          .where(and(eq(agents.poolId, poolId), eq(agents.poolState, "ready"), isNull(agents.deletedAt)))
          .orderBy(desc(agents.createdAt), desc(agents.id))
          .limit(surplus)
          // Waits for a row another transaction holds (the host writing the agent's state after its reset): skipping it
          // left the surplus in the pool until something else kicked a trim. Trims are serialised by the pool row's lock
          // above, and one taking a row a claim just handed out sees it is no longer ready and leaves it.
          .for("update");
        if (taken.length === 0) return [];
        const ids = taken.map((t) => t.id);
        const at = new Date();
        const rows = await tx.update(agents).set({ deletedAt: at, state: "destroyed" }).where(inArray(agents.id, ids)).returning();
        await tx
          .update(checkpoints)
          .set({ deletedAt: at })
          .where(and(inArray(checkpoints.agentId, ids), isNull(checkpoints.deletedAt)));
        return rows;
      });
    },
    async move(agentId, poolId, from, to) {
      const rows = await db
        .update(agents)
        .set({ poolState: to, poolAcquiredAt: to === "in_use" ? sql`now()` : null })
        .where(and(eq(agents.id, agentId), eq(agents.poolId, poolId), inArray(agents.poolState, [...from]), isNull(agents.deletedAt)))
        .returning();
      return rows[0];
    },
    members(poolId, states) {
      const where = [eq(agents.poolId, poolId), isNull(agents.deletedAt)];
      if (states) where.push(inArray(agents.poolState, [...states]));
      return db
        .select(getTableColumns(agents))
        .from(agents)
        .where(and(...where))
        .orderBy(asc(agents.createdAt), asc(agents.id));
    },
    async markDeleting(id) {
      await db.update(pools).set({ state: "deleting", updatedAt: sql`now()` }).where(eq(pools.id, id));
    },
    async markDeleted(id) {
      await db.update(pools).set({ deletedAt: sql`now()`, updatedAt: sql`now()` }).where(eq(pools.id, id));
    },
  };
}

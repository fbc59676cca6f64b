// Operations as the gateway reads them (drizzle): hosts write the rows, the API lists an agent's, newest first.
import { and, desc, eq, gte, sql, type SQL } from "drizzle-orm";
import type { Db } from "../../schema/db.ts";
import { operations, type OperationState } from "../../schema/operations.ts";
import { microsIso } from "../agents/repo.ts";

export type OperationRow = typeof operations.$inferSelect;
export type PagedOperationRow = OperationRow & { createdAtUs: number };

/** The position of a listed operation: created at (µs since the epoch, as stored) and its id. */
export interface OperationPosition {
  createdAtUs: number;
  id: string;
}

export interface OperationQuery {
  limit: number;
  /** Rows after this position in the order (newest first). */
  before?: OperationPosition | undefined;
  upstream?: string | undefined;
  state?: OperationState | undefined;
  since?: Date | undefined;
}

export interface OperationRepo {
  /** One query: the agent's operations, newest first (createdAt, id), filtered. */
  page(agentId: string, q: OperationQuery): Promise<PagedOperationRow[]>;
  /** One of the agent's operations. */
  get(agentId: string, id: string): Promise<OperationRow | undefined>;
}

export function createOperationRepo(db: Db): OperationRepo {
  return {
    async page(agentId, q) {
      const where: SQL[] = [eq(operations.agentId, agentId)];
      if (q.upstream !== undefined) where.push(eq(operations.upstream, q.upstream));
      if (q.state !== undefined) where.push(eq(operations.state, q.state));
      if (q.since !== undefined) where.push(gte(operations.createdAt, q.since));
      // Compared in µs, as for agents: rows made within one millisecond would otherwise repeat or be skipped.
      if (q.before) where.push(sql`(${operations.createdAt}, ${operations.id}) < (${microsIso(q.before.createdAtUs)}::timestamptz, ${q.before.id})`);
      const rows = await db
        .select({ row: operations, createdAtUs: sql<string>`(extract(epoch from ${operations.createdAt}) * 1000000)::bigint::text` })
        .from(operations)
        .where(and(...where))
        .orderBy(desc(operations.createdAt), desc(operations.id))
        .limit(q.limit);
      return rows.map((r) => ({ ...r.row, createdAtUs: Number(r.createdAtUs) }));
    },
    async get(agentId, id) {
      const rows = await db
        .select()
        .from(operations)
        .where(and(eq(operations.agentId, agentId), eq(operations.id, id)))
        .limit(1);
      return rows[0];
    },
  };
}

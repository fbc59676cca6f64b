// Tenant rows as the gateway reads and writes them (drizzle over `tenants`; Postgres or PGlite): create, page, status changes.
import { and, asc, eq, getTableColumns, isNull, sql, type SQL } from "drizzle-orm";
import type { Db } from "../../schema/db.ts";
import { agents, pools, tenants, type TenantStatus } from "../../schema/core.ts";
import { microsIso } from "../agents/repo.ts";

export type TenantRow = typeof tenants.$inferSelect;
export type { TenantStatus };

/** A listed tenant with its position in the order (createdAt, id): `createdAtUs` is µs since the epoch, as stored. */
export type PagedTenantRow = TenantRow & { createdAtUs: number };

export interface TenantPageQuery {
  limit: number;
  after?: { createdAtUs: number; id: string } | undefined;
  status?: TenantStatus | undefined;
}

export interface NewTenant {
  id: string;
  name: string;
  timeZone: string;
}

export interface TenantStore {
  get(id: string): Promise<TenantRow | undefined>;
  /** The new row; undefined when a tenant with this id exists already (whatever its status). */
  create(tenant: NewTenant): Promise<TenantRow | undefined>;
  /** One query: tenants in the order (createdAt, id), at most `limit` of them. */
  page(query: TenantPageQuery): Promise<PagedTenantRow[]>;
  /** active → suspended (the first suspension's instant and reason are kept); undefined when there is no such tenant. */
  suspend(id: string, reason: string | null): Promise<TenantRow | undefined>;
  /** suspended → active; an active tenant is left as it is. */
  resume(id: string): Promise<TenantRow | undefined>;
  /** Any status → deleted (the first deletion's instant is kept; the reason given last wins). */
  markDeleted(id: string, reason: string | null): Promise<TenantRow | undefined>;
  /** The ids of the tenant's live (not deleted) agents. */
  liveAgentIds(tenantId: string): Promise<string[]>;
}

export function createTenantStore(db: Db): TenantStore {
  async function one(rows: Promise<TenantRow[]>): Promise<TenantRow | undefined> {
    return (await rows)[0];
  }
  const get = (id: string) => one(db.select().from(tenants).where(eq(tenants.id, id)).limit(1));

  return {
    get,
    async create(t) {
      const rows = await db.insert(tenants).values({ id: t.id, name: t.name, timeZone: t.timeZone }).onConflictDoNothing().returning();
      return rows[0];
    },
    async page(q) {
      const where: (SQL | undefined)[] = [];
      if (q.after) where.push(sql`(${tenants.createdAt}, ${tenants.id}) > (${microsIso(q.after.createdAtUs)}::timestamptz, ${q.after.id})`);
      if (q.status !== undefined) where.push(eq(tenants.status, q.status));
      const rows = await db
        .select({ ...getTableColumns(tenants), createdAtUs: sql<string>`(extract(epoch from ${tenants.createdAt}) * 1000000)::bigint::text` })
        .from(tenants)
        .where(and(...where))
        .orderBy(asc(tenants.createdAt), asc(tenants.id))
        .limit(q.limit);
      return rows.map((r) => ({ ...r, createdAtUs: Number(r.createdAtUs) }));
    },
    async suspend(id, reason) {
      const changed = await one(
        db
          .update(tenants)
          .set({ status: "suspended", statusReason: reason, suspendedAt: new Date() })
          .where(and(eq(tenants.id, id), eq(tenants.status, "active")))
          .returning(),
      );
      return changed ?? get(id);
    },
    async resume(id) {
      const changed = await one(
        db
          .update(tenants)
          .set({ status: "active", statusReason: null, suspendedAt: null })
          .where(and(eq(tenants.id, id), eq(tenants.status, "suspended")))
          .returning(),
      );
      return changed ?? get(id);
    },
    async markDeleted(id, reason) {
      // Its warm pools go first: no top-up forks an agent for a deleted tenant (its agents are destroyed next).
      await db
        .update(pools)
        .set({ deletedAt: sql`now()`, updatedAt: sql`now()` })
        .where(and(eq(pools.tenantId, id), isNull(pools.deletedAt)));
      return one(
        db
          .update(tenants)
          .set({ status: "deleted", statusReason: reason, deletedAt: sql`coalesce(${tenants.deletedAt}, now())` })
          .where(eq(tenants.id, id))
          .returning(),
      );
    },
    async liveAgentIds(tenantId) {
      const rows = await db
        .select({ id: agents.id })
        .from(agents)
        .where(and(eq(agents.tenantId, tenantId), isNull(agents.deletedAt)))
        .orderBy(asc(agents.createdAt));
      return rows.map((r) => r.id);
    },
  };
}

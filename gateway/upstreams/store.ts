// A tenant's upstreams in Postgres (drizzle; Postgres or PGlite): the headers sealed before they are written, each change audited in its own transaction (header names only).
import { and, asc, eq, gt, isNull } from "drizzle-orm";
import type { DbAuditLog } from "../../schema/audit-log.ts";
import type { Db } from "../../schema/db.ts";
import { upstreams } from "../../schema/operations.ts";
import { newId } from "../../lib/ids.ts";
import { seal } from "../../lib/seal.ts";

export type UpstreamRow = typeof upstreams.$inferSelect;

/** Who changed it, for the audit entry (the caller's subject and the request). */
export interface UpstreamActor {
  actor: string;
  requestId: string | null;
}

export interface UpstreamStore {
  /** The tenant's live upstream of that name. */
  get(tenantId: string, name: string): Promise<UpstreamRow | undefined>;
  /** The tenant's live upstreams by name, at most `limit` after `afterName`. */
  list(tenantId: string, q: { limit: number; afterName?: string | undefined }): Promise<UpstreamRow[]>;
  /** Creates it; undefined when the tenant has a live one of that name. */
  create(
    tenantId: string,
    input: { name: string; baseUrl: string; headers: Record<string, string> },
    by: UpstreamActor,
    now: Date,
  ): Promise<UpstreamRow | undefined>;
  /** Changes its base URL and/or replaces its whole header set; undefined when there is no such live upstream. */
  update(
    row: UpstreamRow,
    patch: { baseUrl?: string | undefined; headers?: Record<string, string> | undefined },
    by: UpstreamActor,
    now: Date,
  ): Promise<UpstreamRow | undefined>;
  /** Deletes it (the row is kept, `deleted_at` set: operations name it); false when it was gone already. */
  delete(row: UpstreamRow, by: UpstreamActor, now: Date): Promise<boolean>;
}

/** `key`: the upstream key (UPSTREAM_KEY_FILE), as WebCrypto holds it. */
export function createUpstreamStore(db: Db, audit: DbAuditLog, key: () => Promise<CryptoKey>): UpstreamStore {
  const sealed = async (id: string, headers: Record<string, string>) => seal(await key(), JSON.stringify(headers), id);
  const live = (tenantId: string, name: string) => and(eq(upstreams.tenantId, tenantId), eq(upstreams.name, name), isNull(upstreams.deletedAt));

  return {
    async get(tenantId, name) {
      const rows = await db.select().from(upstreams).where(live(tenantId, name)).limit(1);
      return rows[0];
    },

    list(tenantId, q) {
      return db
        .select()
        .from(upstreams)
        .where(and(eq(upstreams.tenantId, tenantId), isNull(upstreams.deletedAt), q.afterName === undefined ? undefined : gt(upstreams.name, q.afterName)))
        .orderBy(asc(upstreams.name))
        .limit(q.limit);
    },

    async create(tenantId, input, by, now) {
      const id = newId("upstream");
      const headersSealed = await sealed(id, input.headers);
      return db.transaction(async (tx) => {
        const rows = await tx
          .insert(upstreams)
          .values({
            id,
            tenantId,
            name: input.name,
            baseUrl: input.baseUrl,
            headerNames: Object.keys(input.headers),
            headersSealed,
            createdAt: now,
            updatedAt: now,
          })
          .onConflictDoNothing()
          .returning();
        const row = rows[0];
        if (!row) return undefined;
        await audit.within(tx).record({
          ...by,
          at: now,
          tenantId,
          action: "upstream.create",
          target: row.id,
          detail: { name: row.name, baseUrl: row.baseUrl, headerNames: row.headerNames },
        });
        return row;
      });
    },

    async update(row, patch, by, now) {
      const set: Partial<typeof upstreams.$inferInsert> = { updatedAt: now };
      if (patch.baseUrl !== undefined) set.baseUrl = patch.baseUrl;
      if (patch.headers !== undefined) {
        set.headerNames = Object.keys(patch.headers);
        set.headersSealed = await sealed(row.id, patch.headers);
      }
      return db.transaction(async (tx) => {
        const rows = await tx
          .update(upstreams)
          .set(set)
          .where(and(eq(upstreams.id, row.id), isNull(upstreams.deletedAt)))
          .returning();
        const updated = rows[0];
        if (!updated) return undefined;
        await audit.within(tx).record({
          ...by,
          at: now,
          tenantId: row.tenantId,
          action: "upstream.update",
          target: row.id,
          detail: {
            name: row.name,
            ...(patch.baseUrl !== undefined ? { baseUrl: patch.baseUrl } : {}),
            ...(patch.headers !== undefined ? { headerNames: updated.headerNames } : {}),
          },
        });
        return updated;
      });
    },

    delete(row, by, now) {
      return db.transaction(async (tx) => {
        const rows = await tx
          .update(upstreams)
          .set({ deletedAt: now, updatedAt: now })
          .where(and(eq(upstreams.id, row.id), isNull(upstreams.deletedAt)))
          .returning({ id: upstreams.id });
        if (rows.length === 0) return false;
        await audit.within(tx).record({ ...by, at: now, tenantId: row.tenantId, action: "upstream.delete", target: row.id, detail: { name: row.name } });
        return true;
      });
    },
  };
}

// Postgres adapter of the webhook endpoints: lookups for intake and admin, the keyset list, create, delete and secret rotation (each audited).
import { and, eq, gt, isNull, ne, sql } from "drizzle-orm";
import { agents } from "../../schema/core.ts";
import type { DbAuditLog } from "../../schema/audit-log.ts";
import type { Db } from "../../schema/postgres.ts";
import { webhookEndpoints } from "../../schema/webhooks.ts";
import { newId } from "../../lib/ids.ts";
import type { WebhookStore } from "./store-types.ts";

export type EndpointStore = Pick<
  WebhookStore,
  "tenantOwnsLiveAgent" | "findIntakeEndpoint" | "findEndpoint" | "listEndpoints" | "createEndpoint" | "deleteEndpoint" | "rotateSecret"
>;

/** The hidden `.operations` endpoint of an agent (fleet-agent/operations/) takes no intake and is no admin's to see or change. */
const signedEndpoint = ne(webhookEndpoints.scheme, "operations");

export function createDbEndpointStore(db: Db, auditLog: DbAuditLog): EndpointStore {
  return {
    async tenantOwnsLiveAgent(tenantId, agentId) {
      const rows = await db
        .select({ id: agents.id })
        .from(agents)
        .where(and(eq(agents.id, agentId), eq(agents.tenantId, tenantId), isNull(agents.deletedAt)));
      return rows.length > 0;
    },

    async findIntakeEndpoint(agentId, name) {
      const rows = await db
        .select({ endpoint: webhookEndpoints })
        .from(webhookEndpoints)
        .innerJoin(agents, eq(agents.id, webhookEndpoints.agentId))
        .where(
          and(
            eq(webhookEndpoints.agentId, agentId),
            eq(webhookEndpoints.name, name),
            isNull(webhookEndpoints.deletedAt),
            isNull(agents.deletedAt),
            signedEndpoint,
          ),
        );
      return rows[0]?.endpoint;
    },

    async findEndpoint(agentId, name) {
      const rows = await db
        .select()
        .from(webhookEndpoints)
        .where(and(eq(webhookEndpoints.agentId, agentId), eq(webhookEndpoints.name, name), isNull(webhookEndpoints.deletedAt), signedEndpoint));
      return rows[0];
    },

    listEndpoints(agentId, opts) {
      return db
        .select()
        .from(webhookEndpoints)
        .where(
          and(
            eq(webhookEndpoints.agentId, agentId),
            isNull(webhookEndpoints.deletedAt),
            signedEndpoint,
            opts.afterName === undefined ? undefined : gt(webhookEndpoints.name, opts.afterName),
          ),
        )
        .orderBy(webhookEndpoints.name)
        .limit(opts.limit);
    },

    createEndpoint(input, by, now) {
      return db.transaction(async (tx) => {
        const rows = await tx
          .insert(webhookEndpoints)
          .values({ id: newId("webhook"), ...input, createdAt: now })
          .onConflictDoNothing({ target: [webhookEndpoints.agentId, webhookEndpoints.name], where: sql.raw(`"deleted_at" is null`) })
          .returning();
        const row = rows[0];
        if (!row) return undefined;
        await auditLog.within(tx).record({
          ...by,
          at: now,
          tenantId: input.tenantId,
          target: row.id,
          detail: { agentId: input.agentId, name: input.name, scheme: input.scheme, path: input.path },
        });
        return row;
      });
    },

    deleteEndpoint(endpoint, by, now) {
      return db.transaction(async (tx) => {
        const rows = await tx
          .update(webhookEndpoints)
          .set({ deletedAt: now })
          .where(and(eq(webhookEndpoints.id, endpoint.id), isNull(webhookEndpoints.deletedAt)))
          .returning({ id: webhookEndpoints.id });
        if (rows.length === 0) return false;
        await auditLog
          .within(tx)
          .record({ ...by, at: now, tenantId: endpoint.tenantId, target: endpoint.id, detail: { agentId: endpoint.agentId, name: endpoint.name } });
        return true;
      });
    },

    rotateSecret(endpoint, secret, previousExpiresAt, by, now) {
      return db.transaction(async (tx) => {
        const rows = await tx
          .update(webhookEndpoints)
          .set({ secret, previousSecret: sql`${webhookEndpoints.secret}`, previousSecretExpiresAt: previousExpiresAt, rotatedAt: now })
          .where(and(eq(webhookEndpoints.id, endpoint.id), isNull(webhookEndpoints.deletedAt)))
          .returning();
        const row = rows[0];
        if (!row) return undefined;
        await auditLog
          .within(tx)
          .record({ ...by, at: now, tenantId: endpoint.tenantId, target: endpoint.id, detail: { previousSecretExpiresAt: previousExpiresAt.toISOString() } });
        return row;
      });
    },
  };
}

// Postgres adapter of the deliveries as admins see them: the paged list, their attempts, one of the tenant's, and redelivery (dead letters included).
import { and, desc, eq, inArray, isNull, lt, or } from "drizzle-orm";
import { agents } from "../../schema/core.ts";
import type { DbAuditLog } from "../../schema/audit-log.ts";
import type { Db } from "../../schema/postgres.ts";
import { webhookAttempts, webhookDeliveries, webhookEndpoints } from "../../schema/webhooks.ts";
import type { AttemptRow, WebhookStore } from "./store-types.ts";

export function createDbDeliveryAdminStore(
  db: Db,
  auditLog: DbAuditLog,
): Pick<WebhookStore, "listDeliveries" | "attemptsOf" | "findTenantDelivery" | "redeliver"> {
  return {
    listDeliveries(endpointId, opts) {
      const b = opts.before;
      return db
        .select()
        .from(webhookDeliveries)
        .where(
          and(
            eq(webhookDeliveries.endpointId, endpointId),
            b
              ? or(lt(webhookDeliveries.receivedAt, b.receivedAt), and(eq(webhookDeliveries.receivedAt, b.receivedAt), lt(webhookDeliveries.id, b.id)))
              : undefined,
          ),
        )
        .orderBy(desc(webhookDeliveries.receivedAt), desc(webhookDeliveries.id))
        .limit(opts.limit);
    },

    async attemptsOf(deliveryIds) {
      const byDelivery = new Map<string, AttemptRow[]>(deliveryIds.map((id) => [id, []]));
      if (deliveryIds.length === 0) return byDelivery;
      const rows = await db
        .select()
        .from(webhookAttempts)
        .where(inArray(webhookAttempts.deliveryId, deliveryIds))
        .orderBy(webhookAttempts.deliveryId, webhookAttempts.attempt);
      for (const r of rows) byDelivery.get(r.deliveryId)?.push(r);
      return byDelivery;
    },

    async findTenantDelivery(tenantId, deliveryId) {
      const rows = await db
        .select({ delivery: webhookDeliveries, endpointName: webhookEndpoints.name })
        .from(webhookDeliveries)
        .innerJoin(webhookEndpoints, eq(webhookEndpoints.id, webhookDeliveries.endpointId))
        .innerJoin(agents, eq(agents.id, webhookDeliveries.agentId))
        .where(and(eq(webhookDeliveries.id, deliveryId), eq(webhookDeliveries.tenantId, tenantId), isNull(agents.deletedAt)));
      const r = rows[0];
      return r ? { ...r.delivery, endpointName: r.endpointName } : undefined;
    },

    redeliver(delivery, by, now) {
      return db.transaction(async (tx) => {
        const rows = await tx
          .update(webhookDeliveries)
          .set({ status: "pending", roundAttempts: 0, nextAttemptAt: now, leaseId: null, deadAt: null })
          .where(
            and(
              eq(webhookDeliveries.id, delivery.id),
              or(eq(webhookDeliveries.status, "pending"), eq(webhookDeliveries.status, "delivered"), eq(webhookDeliveries.status, "dead")),
            ),
          )
          .returning();
        const row = rows[0];
        if (!row) return undefined;
        await auditLog.within(tx).record({
          ...by,
          at: now,
          tenantId: delivery.tenantId,
          target: delivery.id,
          detail: { previousStatus: delivery.status, attempts: delivery.attempts },
        });
        return row;
      });
    },
  };
}

// Postgres adapter of the durable inbox: a verified delivery stored once per sender id, within the endpoint's rate.
import { and, eq } from "drizzle-orm";
import type { Db } from "../../schema/postgres.ts";
import { webhookDeliveries, webhookEndpoints } from "../../schema/webhooks.ts";
import { newId } from "../../lib/ids.ts";
import { decideRate } from "./rate-limit.ts";
import type { IntakeResult, WebhookStore } from "./store-types.ts";
class RateLimited {
  readonly retryAfterS: number;
  constructor(retryAfterS: number) {
    this.retryAfterS = retryAfterS;
  }
}
export function createDbIntakeStore(db: Db): Pick<WebhookStore, "storeDelivery"> {
  return {
    /**
     * In one transaction: the insert first (the unique (endpoint, sender id) index turns a replay into a no-op, so
     * replays cost no rate), then the endpoint's rate state under a row lock; a refused rate rolls the insert back.
     */
    async storeDelivery(input, ratePerMinute) {
      const deliveryId = newId("delivery");
      try {
        return await db.transaction(async (tx): Promise<IntakeResult> => {
          const inserted = await tx
            .insert(webhookDeliveries)
            .values({
              id: deliveryId,
              endpointId: input.endpoint.id,
              agentId: input.endpoint.agentId,
              tenantId: input.endpoint.tenantId,
              externalId: input.externalId,
              headers: input.headers,
              body: input.body,
              bodyBytes: input.body.byteLength,
              receivedAt: input.receivedAt,
              requestId: input.requestId,
              status: "pending",
              nextAttemptAt: input.receivedAt,
            })
            .onConflictDoNothing({ target: [webhookDeliveries.endpointId, webhookDeliveries.externalId] })
            .returning({ id: webhookDeliveries.id });
          if (inserted.length === 0) {
            const existing = await tx
              .select({ id: webhookDeliveries.id })
              .from(webhookDeliveries)
              .where(and(eq(webhookDeliveries.endpointId, input.endpoint.id), eq(webhookDeliveries.externalId, input.externalId)));
            return { kind: "replay", deliveryId: existing[0]?.id };
          }
          // NO KEY UPDATE, not UPDATE: the insert above holds a KEY SHARE lock on this row (the foreign key), and
          // FOR UPDATE would conflict with the KEY SHARE of a concurrent intake, deadlocking the two.
          const locked = await tx
            .select({ rateTat: webhookEndpoints.rateTat })
            .from(webhookEndpoints)
            .where(eq(webhookEndpoints.id, input.endpoint.id))
            .for("no key update");
          const decision = decideRate(locked[0]?.rateTat?.getTime(), input.receivedAt.getTime(), ratePerMinute);
          if (!decision.allowed) throw new RateLimited(decision.retryAfterS);
          await tx
            .update(webhookEndpoints)
            .set({ rateTat: new Date(decision.tatMs) })
            .where(eq(webhookEndpoints.id, input.endpoint.id));
          return { kind: "stored", deliveryId };
        });
      } catch (err) {
        if (err instanceof RateLimited) return { kind: "rate_limited", retryAfterS: err.retryAfterS };
        throw err;
      }
    },
  };
}

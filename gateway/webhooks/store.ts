// Postgres adapter of the webhook module: endpoints, the durable inbox, claims with leases, attempts, audit rows.
import { and, desc, eq, gt, inArray, isNull, lt, or, sql } from "drizzle-orm";
import { agents } from "../../schema/core.ts";
import type { AuditEntry, DbAuditLog } from "../../schema/audit-log.ts";
import type { Db } from "../../schema/postgres.ts";
import { queryRows } from "../../schema/postgres.ts";
import { webhookAttempts, webhookDeliveries, webhookEndpoints, type AttemptOutcome, type DeliveryStatus, type WebhookScheme } from "../../schema/webhooks.ts";
import { newId } from "../../lib/ids.ts";
import { decideRate } from "./rate-limit.ts";

export type EndpointRow = typeof webhookEndpoints.$inferSelect;
export type DeliveryRow = typeof webhookDeliveries.$inferSelect;
export type AttemptRow = typeof webhookAttempts.$inferSelect;

/** Who asked for an admin change, and as what action: the store adds tenant, target, detail and time to its audit row. */
export type AuditBy = Pick<AuditEntry, "actor" | "action" | "requestId">;

export interface NewEndpoint {
  tenantId: string;
  agentId: string;
  name: string;
  scheme: WebhookScheme;
  path: string;
  secret: string;
}

export interface IntakeDelivery {
  endpoint: EndpointRow;
  externalId: string;
  headers: [string, string][];
  body: Uint8Array;
  receivedAt: Date;
  requestId: string | null;
}

export type IntakeResult =
  | { kind: "stored"; deliveryId: string }
  | { kind: "replay"; deliveryId: string | undefined }
  | { kind: "rate_limited"; retryAfterS: number };

export interface ClaimedDelivery {
  delivery: DeliveryRow;
  endpoint: Pick<EndpointRow, "id" | "name" | "path" | "scheme">;
  agentDeleted: boolean;
  /** This attempt's number (1-based over the delivery's life), its id, and the lease that owns it. */
  attempt: number;
  attemptId: string;
  attemptRequestId: string;
  leaseId: string;
}

export interface AttemptResult {
  outcome: Exclude<AttemptOutcome, "in_flight" | "lease_expired">;
  statusCode: number | null;
  error: string | null;
  durationMs: number;
  finishedAt: Date;
}

/** What an attempt leaves the delivery as: delivered, due again at `nextAttemptAt`, or dead-lettered. */
export type Settlement = { status: "delivered" } | { status: "pending"; nextAttemptAt: Date } | { status: "dead" };

/** Where the webhook routes and the delivery worker keep endpoints, deliveries and attempts (and audit what changes them). */
export interface WebhookStore {
  /** True when the agent exists, is not deleted and belongs to the tenant: the only agents an admin may see. */
  tenantOwnsLiveAgent(tenantId: string, agentId: string): Promise<boolean>;
  /** The live endpoint `name` of a live agent, or undefined (intake answers 404 either way). */
  findIntakeEndpoint(agentId: string, name: string): Promise<EndpointRow | undefined>;
  findEndpoint(agentId: string, name: string): Promise<EndpointRow | undefined>;
  /** The agent's live endpoints by name: at most `limit` after `afterName` (keyset on the unique (agent, name) index). */
  listEndpoints(agentId: string, opts: { limit: number; afterName?: string }): Promise<EndpointRow[]>;
  /** Creates the endpoint with its audit row; undefined when the agent already has a live endpoint of that name. */
  createEndpoint(input: NewEndpoint, by: AuditBy, now: Date): Promise<EndpointRow | undefined>;
  /** Stops the endpoint accepting deliveries (audited); false when it was already deleted. */
  deleteEndpoint(endpoint: EndpointRow, by: AuditBy, now: Date): Promise<boolean>;
  /** Makes `secret` current; the one it replaces keeps verifying until `previousExpiresAt` (an earlier previous one is dropped). */
  rotateSecret(endpoint: EndpointRow, secret: string, previousExpiresAt: Date, by: AuditBy, now: Date): Promise<EndpointRow | undefined>;
  /** Stores a verified delivery durably, once per (endpoint, sender delivery id), within the endpoint's rate. */
  storeDelivery(input: IntakeDelivery, ratePerMinute: number): Promise<IntakeResult>;
  /** Claims up to `limit` due deliveries under a lease of `leaseMs`, each with a new attempt in flight. */
  claimDue(opts: { now: Date; limit: number; leaseMs: number; workerId: string }): Promise<ClaimedDelivery[]>;
  /**
   * Records an attempt's result and settles the delivery (delivered, retry later, dead letter), with `audit` when
   * given; only while the claim still holds the lease. False when the lease was lost and nothing was settled.
   */
  recordAttempt(claim: ClaimedDelivery, result: AttemptResult, settlement: Settlement, audit: AuditEntry | undefined): Promise<boolean>;
  /** A page, newest first: `before` continues after the last row of the previous page (same-millisecond rows ordered by id). */
  listDeliveries(endpointId: string, opts: { limit: number; before?: { receivedAt: Date; id: string } }): Promise<DeliveryRow[]>;
  /** The attempts of each delivery, in order (an empty list for one without any). */
  attemptsOf(deliveryIds: string[]): Promise<Map<string, AttemptRow[]>>;
  /** A delivery of the tenant's live agent, with its endpoint's name. */
  findTenantDelivery(tenantId: string, deliveryId: string): Promise<(DeliveryRow & { endpointName: string }) | undefined>;
  /**
   * Queues a delivery again now with a fresh retry budget (audited); refused (undefined) while an attempt is in
   * flight. A delivered delivery may be redelivered: the agent receives the same body and `x-webhook-delivery-id` again.
   */
  redeliver(delivery: DeliveryRow, by: AuditBy, now: Date): Promise<DeliveryRow | undefined>;
}

class RateLimited {
  readonly retryAfterS: number;
  constructor(retryAfterS: number) {
    this.retryAfterS = retryAfterS;
  }
}

/** `auditLog` writes each audit row in the transaction of the change it records. */
export function createDbWebhookStore(db: Db, auditLog: DbAuditLog): WebhookStore {
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
        .where(and(eq(webhookEndpoints.agentId, agentId), eq(webhookEndpoints.name, name), isNull(webhookEndpoints.deletedAt), isNull(agents.deletedAt)));
      return rows[0]?.endpoint;
    },

    async findEndpoint(agentId, name) {
      const rows = await db
        .select()
        .from(webhookEndpoints)
        .where(and(eq(webhookEndpoints.agentId, agentId), eq(webhookEndpoints.name, name), isNull(webhookEndpoints.deletedAt)));
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

    /**
     * Pending deliveries whose time has come and in-flight ones whose lease expired, claimed with `FOR UPDATE SKIP
     * LOCKED`, so gateways sharing the database never claim the same row twice. Each claim moves the row's deadline to
     * the lease end, records the attempt as in flight and closes an abandoned earlier attempt.
     */
    claimDue(opts) {
      const leaseUntil = new Date(opts.now.getTime() + opts.leaseMs);
      return db.transaction(async (tx) => {
        const claimed = await queryRows<{ id: string; attempts: number; lease_id: string }>(
          tx as unknown as Db,
          sql`
            with due as (
              select id from ${webhookDeliveries}
              where status in ('pending', 'in_flight') and next_attempt_at <= ${opts.now.toISOString()}::timestamptz
              order by next_attempt_at, id
              limit ${opts.limit}
              for update skip locked
            )
            update ${webhookDeliveries} d
            set status = 'in_flight',
                attempts = d.attempts + 1,
                round_attempts = d.round_attempts + 1,
                next_attempt_at = ${leaseUntil.toISOString()}::timestamptz,
                lease_id = ${opts.workerId} || ':' || (d.attempts + 1)
            from due where d.id = due.id
            returning d.id, d.attempts, d.lease_id`,
        );
        if (claimed.length === 0) return [];
        const ids = claimed.map((c) => c.id);
        await tx
          .update(webhookAttempts)
          .set({ outcome: "lease_expired", finishedAt: opts.now, error: "the worker holding the lease stopped before recording an outcome" })
          .where(and(inArray(webhookAttempts.deliveryId, ids), eq(webhookAttempts.outcome, "in_flight")));
        const attempts = claimed.map((c) => ({
          id: newId("attempt"),
          deliveryId: c.id,
          attempt: Number(c.attempts),
          worker: opts.workerId,
          requestId: newId("request"),
          startedAt: opts.now,
          outcome: "in_flight" as const,
        }));
        await tx.insert(webhookAttempts).values(attempts);
        const rows = await tx
          .select({
            delivery: webhookDeliveries,
            endpoint: { id: webhookEndpoints.id, name: webhookEndpoints.name, path: webhookEndpoints.path, scheme: webhookEndpoints.scheme },
            agentDeletedAt: agents.deletedAt,
          })
          .from(webhookDeliveries)
          .innerJoin(webhookEndpoints, eq(webhookEndpoints.id, webhookDeliveries.endpointId))
          .innerJoin(agents, eq(agents.id, webhookDeliveries.agentId))
          .where(inArray(webhookDeliveries.id, ids));
        const byId = new Map(rows.map((r) => [r.delivery.id, r]));
        return attempts.flatMap((a) => {
          const r = byId.get(a.deliveryId);
          if (!r?.delivery.leaseId) return [];
          return [
            {
              delivery: r.delivery,
              endpoint: r.endpoint,
              agentDeleted: r.agentDeletedAt !== null,
              attempt: a.attempt,
              attemptId: a.id,
              attemptRequestId: a.requestId,
              leaseId: r.delivery.leaseId,
            },
          ];
        });
      });
    },

    /** A worker that overran its lease must not overwrite the one that took over: settles only under its own lease. */
    recordAttempt(claim, result, settlement, audit) {
      return db.transaction(async (tx) => {
        await tx
          .update(webhookAttempts)
          .set({ outcome: result.outcome, statusCode: result.statusCode, error: result.error, durationMs: result.durationMs, finishedAt: result.finishedAt })
          .where(and(eq(webhookAttempts.id, claim.attemptId), eq(webhookAttempts.outcome, "in_flight")));
        const status: DeliveryStatus = settlement.status;
        const rows = await tx
          .update(webhookDeliveries)
          .set({
            status,
            leaseId: null,
            lastError: result.error,
            nextAttemptAt: settlement.status === "pending" ? settlement.nextAttemptAt : result.finishedAt,
            deliveredAt: settlement.status === "delivered" ? result.finishedAt : undefined,
            deadAt: settlement.status === "dead" ? result.finishedAt : undefined,
          })
          .where(and(eq(webhookDeliveries.id, claim.delivery.id), eq(webhookDeliveries.leaseId, claim.leaseId), eq(webhookDeliveries.status, "in_flight")))
          .returning({ id: webhookDeliveries.id });
        if (rows.length === 0) return false;
        if (audit) await auditLog.within(tx).record({ ...audit, at: result.finishedAt });
        return true;
      });
    },

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

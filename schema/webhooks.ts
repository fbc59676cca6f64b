// Webhook tables: signed endpoints per agent, the durable inbox of received deliveries, and every delivery attempt.
import { sql } from "drizzle-orm";
import { customType, index, integer, jsonb, pgTable, text, timestamp, uniqueIndex } from "drizzle-orm/pg-core";
import { agents } from "./core.ts";

const tz = (name: string) => timestamp(name, { withTimezone: true, mode: "date" });

/** Raw bytes, stored exactly as received (postgres.js hands back a Buffer, PGlite a Uint8Array: both are Uint8Arrays). */
const bytea = customType<{ data: Uint8Array; driverData: Uint8Array }>({
  dataType: () => "bytea",
  toDriver: (value) => (typeof Buffer === "undefined" ? value : Buffer.from(value.buffer, value.byteOffset, value.byteLength)),
  fromDriver: (value) => new Uint8Array(value.buffer, value.byteOffset, value.byteLength),
});

/**
 * standard / github: a sender's signed webhooks. operations: the hidden endpoint (one per agent, named `.operations`,
 * no intake) through which the outcomes of an agent's async upstream calls are delivered to it (fleet-agent/operations/).
 */
export type WebhookScheme = "standard" | "github" | "operations";
/** pending (due at nextAttemptAt) → in_flight (leased until nextAttemptAt) → delivered | pending (retry) | dead. */
export type DeliveryStatus = "pending" | "in_flight" | "delivered" | "dead";
/** in_flight while running; lease_expired when its worker vanished and another one took the delivery over. */
export type AttemptOutcome = "in_flight" | "ok" | "http_error" | "error" | "lease_expired";

export const webhookEndpoints = pgTable(
  "webhook_endpoints",
  {
    id: text("id").primaryKey(),
    tenantId: text("tenant_id").notNull(),
    agentId: text("agent_id")
      .notNull()
      .references(() => agents.id),
    /** URL segment: `/hooks/{agentId}/{name}`. */
    name: text("name").notNull(),
    scheme: text("scheme").$type<WebhookScheme>().notNull(),
    /** Path (and query) on the agent that deliveries are POSTed to. */
    path: text("path").notNull(),
    /** `whsec_<base64>` for standard, hex for github; needed in clear to compute HMACs. */
    secret: text("secret").notNull(),
    /** The secret before the last rotation, still accepted until `previousSecretExpiresAt`. */
    previousSecret: text("previous_secret"),
    previousSecretExpiresAt: tz("previous_secret_expires_at"),
    /** Per-endpoint rate limit state (GCRA "theoretical arrival time"); null before the first delivery. */
    rateTat: tz("rate_tat"),
    createdAt: tz("created_at").notNull().defaultNow(),
    rotatedAt: tz("rotated_at"),
    deletedAt: tz("deleted_at"),
  },
  (t) => [uniqueIndex("webhook_endpoints_agent_name_uq").on(t.agentId, t.name).where(sql`${t.deletedAt} is null`)],
);

export const webhookDeliveries = pgTable(
  "webhook_deliveries",
  {
    id: text("id").primaryKey(),
    endpointId: text("endpoint_id")
      .notNull()
      .references(() => webhookEndpoints.id),
    agentId: text("agent_id").notNull(),
    tenantId: text("tenant_id").notNull(),
    /** The sender's delivery id (`webhook-id` or `X-GitHub-Delivery`): unique per endpoint, so a replay is refused. */
    externalId: text("external_id").notNull(),
    /** Request headers as received (lower-case names, in order), minus hop-by-hop and credential headers. */
    headers: jsonb("headers").$type<[string, string][]>().notNull(),
    body: bytea("body").notNull(),
    bodyBytes: integer("body_bytes").notNull(),
    receivedAt: tz("received_at").notNull(),
    requestId: text("request_id"),
    status: text("status").$type<DeliveryStatus>().notNull().default("pending"),
    /** Attempts ever made, and attempts since the last (re)delivery request: the retry budget counts the latter. */
    attempts: integer("attempts").notNull().default(0),
    roundAttempts: integer("round_attempts").notNull().default(0),
    /** When pending: when it is due; when in flight: when the lease expires and another worker may take it. */
    nextAttemptAt: tz("next_attempt_at").notNull(),
    /** Who holds the current lease (`workerId:attempt`): only the holder may record the outcome. */
    leaseId: text("lease_id"),
    lastError: text("last_error"),
    deliveredAt: tz("delivered_at"),
    deadAt: tz("dead_at"),
  },
  (t) => [
    uniqueIndex("webhook_deliveries_endpoint_external_uq").on(t.endpointId, t.externalId),
    index("webhook_deliveries_due_idx").on(t.nextAttemptAt).where(sql`${t.status} in ('pending', 'in_flight')`),
    index("webhook_deliveries_endpoint_idx").on(t.endpointId, t.receivedAt),
  ],
);

export const webhookAttempts = pgTable(
  "webhook_attempts",
  {
    id: text("id").primaryKey(),
    deliveryId: text("delivery_id")
      .notNull()
      .references(() => webhookDeliveries.id, { onDelete: "cascade" }),
    /** 1-based over the delivery's whole life. */
    attempt: integer("attempt").notNull(),
    worker: text("worker").notNull(),
    requestId: text("request_id").notNull(),
    startedAt: tz("started_at").notNull(),
    finishedAt: tz("finished_at"),
    durationMs: integer("duration_ms"),
    outcome: text("outcome").$type<AttemptOutcome>().notNull(),
    statusCode: integer("status_code"),
    error: text("error"),
  },
  (t) => [uniqueIndex("webhook_attempts_delivery_attempt_uq").on(t.deliveryId, t.attempt)],
);

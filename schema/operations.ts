// Outbound calls of agents: a tenant's named upstreams (their secret headers encrypted at rest) and the operation record of every call through one.
import { sql } from "drizzle-orm";
import { bigint, index, integer, jsonb, pgTable, text, timestamp, uniqueIndex } from "drizzle-orm/pg-core";

const tz = (name: string) => timestamp(name, { withTimezone: true, mode: "date" });
const count = (name: string) => bigint(name, { mode: "number" });

/**
 * An outbound endpoint a tenant's agents reach as plain HTTP at their host's egress proxy (`/u/<name>/…`); the host
 * calls `base_url` with the secret headers added. Header values are never returned and never logged.
 */
export const upstreams = pgTable(
  "upstreams",
  {
    /** `ups_…`. */
    id: text("id").primaryKey(),
    tenantId: text("tenant_id").notNull(),
    /** Lower-case `[a-z0-9-]`, unique per tenant among live rows: the URL segment and `AGENTVM_UPSTREAM_<NAME>_URL`. */
    name: text("name").notNull(),
    /** `https://…` (or `http://` where the host's egress rules allow plain HTTP), no query, no fragment. */
    baseUrl: text("base_url").notNull(),
    /** The header names, in clear (what the API shows); their values only in `headers_sealed`. */
    headerNames: jsonb("header_names").$type<string[]>().notNull(),
    /** The headers `{name: value}` as JSON, sealed (AES-256-GCM, `v1.<iv>.<tag>.<ciphertext>` base64url) with the upstream key. */
    headersSealed: text("headers_sealed").notNull(),
    createdAt: tz("created_at").notNull().defaultNow(),
    updatedAt: tz("updated_at").notNull().defaultNow(),
    deletedAt: tz("deleted_at"),
  },
  (t) => [uniqueIndex("upstreams_tenant_name_uq").on(t.tenantId, t.name).where(sql`${t.deletedAt} is null`)],
);

/** sync: the agent waits on the call; async: `Prefer: respond-async`, made by a host and delivered later. */
export type OperationMode = "sync" | "async";
/** queued → in_flight → succeeded | failed (async); sync calls are written in_flight and end succeeded | failed. */
export type OperationState = "queued" | "in_flight" | "succeeded" | "failed";

/** One call of an agent through an upstream: what was asked, what came back, when, and what it cost in tokens. */
export const operations = pgTable(
  "operations",
  {
    /** `op_…`. */
    id: text("id").primaryKey(),
    tenantId: text("tenant_id").notNull(),
    agentId: text("agent_id").notNull(),
    /** The agent's run when the call was made (null: made while it slept, an async retry). */
    runId: text("run_id"),
    hostId: text("host_id").notNull(),
    upstream: text("upstream").notNull(),
    method: text("method").notNull(),
    /** The path and query below the upstream's base URL. */
    path: text("path").notNull(),
    /** sha256 (hex) of method, path, the body and the headers that shape the answer (content-type, accept). */
    requestHash: text("request_hash").notNull(),
    idempotencyKey: text("idempotency_key"),
    /** Async: the request's headers as the agent sent them (hop-by-hop and the secret headers' names removed), for the call made later. */
    requestHeaders: jsonb("request_headers").$type<[string, string][]>(),
    mode: text("mode").$type<OperationMode>().notNull(),
    state: text("state").$type<OperationState>().notNull(),
    /** The upstream's status (null: no answer: the error says why). */
    status: integer("status"),
    error: jsonb("error").$type<{ code: string; message: string }>(),
    sentAt: tz("sent_at"),
    firstByteAt: tz("first_byte_at"),
    endedAt: tz("ended_at"),
    requestBytes: count("request_bytes").notNull().default(0),
    responseBytes: count("response_bytes").notNull().default(0),
    /** The response's headers as sent to the agent (hop-by-hop removed), for a replay. */
    responseHeaders: jsonb("response_headers").$type<[string, string][]>(),
    /** Content digests in the shared artifact store of the bodies kept (up to the configured size), null when not kept. */
    requestBody: text("request_body"),
    responseBody: text("response_body"),
    /** An OpenAI- or Anthropic-style completion's model and token usage, when the body said. */
    model: text("model"),
    inputTokens: integer("input_tokens"),
    outputTokens: integer("output_tokens"),
    /** Async: attempts made, the deadline, who holds the call (a host or gateway id) and until when. */
    attempts: integer("attempts").notNull().default(0),
    deadlineAt: tz("deadline_at"),
    claimedBy: text("claimed_by"),
    claimExpiresAt: tz("claim_expires_at"),
    /** Async: when the outcome reached the agent (its callback answered 2xx), and the delivery that carries it. */
    deliveredAt: tz("delivered_at"),
    deliveryId: text("delivery_id"),
    createdAt: tz("created_at").notNull().defaultNow(),
  },
  (t) => [
    index("operations_agent_idx").on(t.agentId, t.createdAt),
    // A page of runs sums its runs' operations (billing/runs.ts): by run, not by reading the agent's whole history.
    index("operations_run_idx").on(t.runId).where(sql`${t.runId} is not null`),
    uniqueIndex("operations_agent_idempotency_uq").on(t.agentId, t.idempotencyKey).where(sql`${t.idempotencyKey} is not null`),
    index("operations_async_due_idx").on(t.claimExpiresAt).where(sql`${t.mode} = 'async' and ${t.state} in ('queued', 'in_flight')`),
  ],
);

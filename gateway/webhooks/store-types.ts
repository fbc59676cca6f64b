// The webhook store's contract: its rows, inputs and results, and the WebhookStore interface the routes and the worker use.
import type { AuditEntry } from "../../schema/audit-log.ts";
import type { AttemptOutcome, WebhookScheme, webhookAttempts, webhookDeliveries, webhookEndpoints } from "../../schema/webhooks.ts";
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

// The JSON the admin API answers with: endpoints (never their secrets), deliveries and their attempts.
import type { z } from "../../lib/api.ts";
import type { WebhookAttempt, WebhookDelivery, WebhookEndpoint } from "./api-schemas.ts";
import { base64Encode } from "./bytes.ts";
import type { AttemptRow, DeliveryRow, EndpointRow } from "./store-types.ts";

const iso = (d: Date | null): string | null => (d ? d.toISOString() : null);

export function intakePath(agentId: string, name: string): string {
  return `/hooks/${agentId}/${name}`;
}

export function endpointView(e: EndpointRow, nowMs: number): z.infer<typeof WebhookEndpoint> {
  const overlapActive = e.previousSecretExpiresAt !== null && e.previousSecretExpiresAt.getTime() > nowMs;
  return {
    id: e.id,
    agentId: e.agentId,
    name: e.name,
    scheme: e.scheme,
    path: e.path,
    url: intakePath(e.agentId, e.name),
    createdAt: iso(e.createdAt),
    rotatedAt: iso(e.rotatedAt),
    /** Until when the secret before the last rotation still verifies; null when only the current one does. */
    previousSecretExpiresAt: overlapActive ? iso(e.previousSecretExpiresAt) : null,
  };
}

export function attemptView(a: AttemptRow): z.infer<typeof WebhookAttempt> {
  return {
    id: a.id,
    attempt: a.attempt,
    outcome: a.outcome,
    statusCode: a.statusCode,
    error: a.error,
    durationMs: a.durationMs,
    startedAt: iso(a.startedAt),
    finishedAt: iso(a.finishedAt),
    requestId: a.requestId,
  };
}

export function deliveryView(d: DeliveryRow, attempts: AttemptRow[]): z.infer<typeof WebhookDelivery> {
  return {
    id: d.id,
    endpointId: d.endpointId,
    agentId: d.agentId,
    externalId: d.externalId,
    status: d.status,
    receivedAt: iso(d.receivedAt),
    requestId: d.requestId,
    attemptCount: d.attempts,
    nextAttemptAt: d.status === "pending" || d.status === "in_flight" ? iso(d.nextAttemptAt) : null,
    deliveredAt: iso(d.deliveredAt),
    deadAt: iso(d.deadAt),
    lastError: d.lastError,
    bodyBytes: d.bodyBytes,
    headers: d.headers,
    attempts: attempts.map(attemptView),
  };
}

/** One delivery as `GET /v1/webhook-deliveries/{id}` shows it: with its body, base64. */
export function deliveryDetailView(d: DeliveryRow, attempts: AttemptRow[], endpointName: string) {
  return { ...deliveryView(d, attempts), bodyBase64: base64Encode(d.body), endpointName };
}

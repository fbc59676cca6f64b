// The webhook API's parameters, bodies and answers as zod schemas: what validates a request is what /openapi.json shows.
import { NextCursor, PageQuery, z } from "../../lib/api.ts";

/** Admin bodies are a name, a scheme and a path, or an overlap: 64 KiB is far more than any of them needs. */
export const maxAdminBodyBytes = 64 * 1024;

export const maxOverlapS = 30 * 86_400;

const namePattern = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/;

/** An origin-relative path (and optional query) on the agent; never a URL that could leave it. */
function staysOnAgent(value: string): boolean {
  if (!value.startsWith("/") || value.startsWith("//") || /[\s\\#]/.test(value)) return false;
  return new URL(value, "http://agent.invalid").host === "agent.invalid";
}

export const NewEndpoint = z
  .strictObject({
    name: z
      .string()
      .regex(namePattern, "must be 1–63 letters, digits, '_', '-' or '.', starting with a letter or digit")
      .openapi({ description: "The URL segment: deliveries go to /hooks/{agentId}/{name}", example: "stripe" }),
    scheme: z.enum(["standard", "github"]).openapi({ description: "standard: Standard Webhooks signatures; github: X-Hub-Signature-256" }),
    path: z
      .string()
      .max(2048, "must be at most 2048 characters")
      .refine(staysOnAgent, "must be a path on the agent starting with a single / (no host, no fragment)")
      .default("/")
      .openapi({ description: "Path (and query) on the agent that deliveries are POSTed to", example: "/webhooks/stripe" }),
  })
  .openapi("NewWebhookEndpoint");

export const Rotation = z
  .strictObject({
    overlapS: z
      .number()
      .int(`must be a whole number of seconds from 0 to ${maxOverlapS}`)
      .min(0, `must be a whole number of seconds from 0 to ${maxOverlapS}`)
      .max(maxOverlapS, `must be a whole number of seconds from 0 to ${maxOverlapS}`)
      .optional()
      .openapi({ description: "Seconds the secret being replaced keeps verifying (default WEBHOOK_ROTATION_OVERLAP_S)" }),
  })
  .openapi("WebhookRotation");

export const AgentParams = z.object({ id: z.string().openapi({ description: "Agent id", example: "agt_V1StGXR8Z5jdHi6B" }) });
export const EndpointParams = AgentParams.extend({ name: z.string().openapi({ description: "Endpoint name", example: "stripe" }) });
export const DeliveryParams = z.object({ id: z.string().openapi({ description: "Delivery id", example: "dlv_V1StGXR8Z5jdHi6B" }) });
export const IntakeParams = z.object({ agentId: z.string(), endpointName: z.string() });

export const ListQuery = z.strictObject({ ...PageQuery.shape });

export const WebhookEndpoint = z
  .object({
    id: z.string(),
    agentId: z.string(),
    name: z.string(),
    scheme: z.enum(["standard", "github", "operations"]).openapi({
      description: "operations: the hidden endpoint that delivers an agent's async upstream outcomes (never listed)",
    }),
    path: z.string(),
    url: z.string().openapi({ description: "Where senders deliver: /hooks/{agentId}/{name}" }),
    createdAt: z.string().nullable(),
    rotatedAt: z.string().nullable(),
    previousSecretExpiresAt: z
      .string()
      .nullable()
      .openapi({ description: "Until when the secret before the last rotation still verifies; null when only the current one does" }),
  })
  .openapi("WebhookEndpoint");

export const WebhookEndpointWithSecret = WebhookEndpoint.extend({
  secret: z.string().openapi({ description: "Shown only in this answer" }),
}).openapi("WebhookEndpointWithSecret");

export const EndpointPage = z.object({ endpoints: z.array(WebhookEndpoint), nextCursor: NextCursor }).openapi("WebhookEndpointPage");

export const WebhookAttempt = z
  .object({
    id: z.string(),
    attempt: z.number().int(),
    outcome: z.enum(["in_flight", "ok", "http_error", "error", "lease_expired"]),
    statusCode: z.number().int().nullable(),
    error: z.string().nullable(),
    durationMs: z.number().int().nullable(),
    startedAt: z.string().nullable(),
    finishedAt: z.string().nullable(),
    requestId: z.string(),
  })
  .openapi("WebhookAttempt");

export const WebhookDelivery = z
  .object({
    id: z.string(),
    endpointId: z.string(),
    agentId: z.string(),
    externalId: z.string().openapi({ description: "The sender's delivery id (webhook-id or X-GitHub-Delivery)" }),
    status: z.enum(["pending", "in_flight", "delivered", "dead"]),
    receivedAt: z.string().nullable(),
    requestId: z.string().nullable(),
    attemptCount: z.number().int(),
    nextAttemptAt: z.string().nullable(),
    deliveredAt: z.string().nullable(),
    deadAt: z.string().nullable(),
    lastError: z.string().nullable(),
    bodyBytes: z.number().int(),
    headers: z
      .array(z.tuple([z.string(), z.string()]))
      .openapi({ description: "Request headers as received (lower-case names, in order), minus hop-by-hop and credential headers" }),
    attempts: z.array(WebhookAttempt),
  })
  .openapi("WebhookDelivery");

export const WebhookDeliveryDetail = WebhookDelivery.extend({
  bodyBase64: z.string().openapi({ description: "The body's bytes exactly as received" }),
  endpointName: z.string(),
}).openapi("WebhookDeliveryDetail");

export const DeliveryPage = z.object({ deliveries: z.array(WebhookDelivery), nextCursor: NextCursor }).openapi("WebhookDeliveryPage");

export const Redelivery = z.object({ deliveryId: z.string(), status: z.enum(["pending", "in_flight", "delivered", "dead"]) }).openapi("WebhookRedelivery");

export const IntakeAccepted = z.object({ deliveryId: z.string() }).openapi("WebhookAccepted");

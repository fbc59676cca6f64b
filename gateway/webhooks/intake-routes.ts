// `POST /hooks/:agentId/:endpointName`: verify the signature, refuse replays and floods, store durably, answer 202.
import { createRoute } from "@hono/zod-openapi";
import type { GatewayEnv } from "../../contracts/caller.ts";
import { apiRouter, errors, json, z } from "../../lib/api.ts";
import { AppError } from "../../lib/errors.ts";
import { isId } from "../../lib/ids.ts";
import { databaseRetryAfterS, isDatabaseUnavailable } from "../../schema/db-errors.ts";
import { IntakeAccepted, IntakeParams } from "./api-schemas.ts";
import { readBodyLimited } from "../../lib/body.ts";
import { headersToStore } from "./forward-headers.ts";
import { activeSecrets, verifyWebhook } from "./signature.ts";
import type { ResolvedWebhookDeps } from "./types.ts";

/** Sender delivery ids longer than this are refused rather than indexed. */
const maxExternalIdLength = 256;

const intakeRoute = createRoute({
  method: "post",
  path: "/hooks/{agentId}/{endpointName}",
  operationId: "deliverWebhook",
  summary: "A sender delivers a webhook: signed (Standard Webhooks or GitHub), stored durably, then delivered to the agent",
  description:
    "No bearer token: the signature is the credential (`webhook-id`, `webhook-timestamp`, `webhook-signature` for standard endpoints; `X-Hub-Signature-256` and `X-GitHub-Delivery` for github ones). The body is kept byte for byte, whatever its type.",
  tags: ["webhooks"],
  security: [],
  request: {
    params: IntakeParams,
    body: { required: true, content: { "*/*": { schema: z.string().openapi({ format: "binary" }) } } },
  },
  responses: {
    202: json(IntakeAccepted, "Stored; the agent is woken and the delivery attempted"),
    ...errors(400, 404, 405, 409, 413, 429),
  },
});

export function createIntakeRoutes(deps: ResolvedWebhookDeps, onQueued: () => void) {
  const app = apiRouter<GatewayEnv>();
  const { store, clock, config } = deps;

  app.openapi(intakeRoute, async (c) => {
    const { agentId, endpointName: name } = c.req.valid("param");
    const notFound = new AppError("not_found", "no such webhook endpoint");
    if (!isId("agent", agentId)) throw notFound;
    const endpoint = await orUnstored(store.findIntakeEndpoint(agentId, name));
    if (!endpoint) throw notFound;

    const body = await readBodyLimited(c.req.raw, config.maxBodyBytes, "webhook body");
    const now = clock.now();
    const verified = await verifyWebhook({
      scheme: endpoint.scheme,
      headers: c.req.raw.headers,
      body,
      secrets: activeSecrets(endpoint, now),
      nowMs: now,
      toleranceS: config.toleranceS,
    });
    if (verified.externalId.length > maxExternalIdLength)
      throw new AppError("bad_request", `the sender's delivery id is longer than ${maxExternalIdLength} characters`);

    const requestId = c.get("requestId") ?? null;
    const result = await orUnstored(
      store.storeDelivery(
        { endpoint, externalId: verified.externalId, headers: headersToStore(c.req.raw.headers), body, receivedAt: new Date(now), requestId },
        config.ratePerMinute,
      ),
    );
    if (result.kind === "replay") {
      throw new AppError("replay", `delivery ${verified.externalId} was already received by this endpoint`, { details: { deliveryId: result.deliveryId } });
    }
    if (result.kind === "rate_limited") {
      throw new AppError("rate_limited", `endpoint ${name} accepts ${config.ratePerMinute} deliveries per minute`, { retryAfterS: result.retryAfterS });
    }
    deps.log.info("webhook received", { requestId, deliveryId: result.deliveryId, agentId, endpoint: name, bytes: body.byteLength });
    onQueued();
    return c.json({ deliveryId: result.deliveryId }, 202);
  });

  /**
   * Intake needs Postgres twice (the endpoint's secrets, then storing the delivery): without it the sender is told
   * to come back (`503 database_unavailable` + Retry-After), which every webhook sender retries; nothing was stored.
   */
  async function orUnstored<T>(p: Promise<T>): Promise<T> {
    try {
      return await p;
    } catch (err) {
      if (!isDatabaseUnavailable(err)) throw err;
      throw new AppError("database_unavailable", "the webhook was not stored: the database is unavailable; retry shortly", {
        retryAfterS: databaseRetryAfterS,
        cause: err,
      });
    }
  }

  app.all("/hooks/:agentId/:endpointName", () => {
    throw new AppError("method_not_allowed", "webhooks are delivered with POST");
  });

  return app;
}

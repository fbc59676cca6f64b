// `POST /hooks/:agentId/:endpointName`: verify the signature, refuse replays and floods, store durably, answer 202.
import { Hono } from "hono";
import type { GatewayEnv } from "../../contracts/caller.ts";
import { AppError } from "../../lib/errors.ts";
import { isId } from "../../lib/ids.ts";
import { databaseRetryAfterS, isDatabaseUnavailable } from "../../schema/db-errors.ts";
import { readBodyLimited } from "./body.ts";
import { headersToStore } from "./forward-headers.ts";
import { activeSecrets, verifyWebhook } from "./signature.ts";
import type { ResolvedWebhookDeps } from "./types.ts";

/** Sender delivery ids longer than this are refused rather than indexed. */
const maxExternalIdLength = 256;

export function createIntakeRoutes(deps: ResolvedWebhookDeps, onQueued: () => void): Hono<GatewayEnv> {
  const app = new Hono<GatewayEnv>();
  const { store, clock, config } = deps;

  app.post("/hooks/:agentId/:endpointName", async (c) => {
    const agentId = c.req.param("agentId");
    const name = c.req.param("endpointName");
    const notFound = new AppError("not_found", "no such webhook endpoint");
    if (!isId("agent", agentId)) throw notFound;
    const endpoint = await orUnstored(store.findIntakeEndpoint(agentId, name));
    if (!endpoint) throw notFound;

    const body = await readBodyLimited(c.req.raw, config.maxBodyBytes);
    const now = clock.now();
    const verified = await verifyWebhook({
      scheme: endpoint.scheme,
      headers: c.req.raw.headers,
      body,
      secrets: activeSecrets(endpoint, now),
      nowMs: now,
      toleranceS: config.toleranceS,
    });
    if (verified.externalId.length > maxExternalIdLength) throw new AppError("bad_request", `the sender's delivery id is longer than ${maxExternalIdLength} characters`);

    const requestId = c.get("requestId") ?? null;
    const result = await orUnstored(
      store.storeDelivery({ endpoint, externalId: verified.externalId, headers: headersToStore(c.req.raw.headers), body, receivedAt: new Date(now), requestId }, config.ratePerMinute),
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
      throw new AppError("database_unavailable", "the webhook was not stored: the database is unavailable; retry shortly", { retryAfterS: databaseRetryAfterS, cause: err });
    }
  }

  app.all("/hooks/:agentId/:endpointName", () => {
    throw new AppError("method_not_allowed", "webhooks are delivered with POST");
  });

  return app;
}

// Admin API of webhooks (scope agents:admin, own tenant's live agents only): endpoints, secret rotation, deliveries, redelivery.
import { Hono, type Context } from "hono";
import { requireScope, type Caller, type GatewayEnv } from "../../contracts/caller.ts";
import { AppError } from "../../lib/errors.ts";
import type { WebhookScheme } from "../../schema/webhooks.ts";
import { generateSecret } from "./signature.ts";
import type { AuditBy, EndpointRow } from "./store.ts";
import { deliveryView, endpointView } from "./views.ts";
import type { ResolvedWebhookDeps } from "./types.ts";

const namePattern = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/;
const maxOverlapS = 30 * 86_400;

async function jsonBody(c: Context<GatewayEnv>): Promise<Record<string, unknown>> {
  let body: unknown;
  try {
    const text = await c.req.text();
    body = text === "" ? {} : JSON.parse(text);
  } catch {
    throw new AppError("bad_request", "the request body must be JSON");
  }
  if (typeof body !== "object" || body === null || Array.isArray(body)) throw new AppError("bad_request", "the request body must be a JSON object");
  return body as Record<string, unknown>;
}

/** An origin-relative path (and optional query) on the agent; never a URL that could leave it. */
function parsePath(value: unknown): string {
  if (typeof value !== "string" || !value.startsWith("/") || value.startsWith("//") || value.length > 2048 || /[\s\\#]/.test(value)) {
    throw new AppError("bad_request", "path must be a path on the agent starting with a single / (no host, no fragment)");
  }
  const url = new URL(value, "http://agent.invalid");
  if (url.host !== "agent.invalid") throw new AppError("bad_request", "path must stay on the agent");
  return value;
}

/** A page cursor: `<ISO time>~<delivery id>` as answered in `nextBefore` (a bare ISO time also works). */
function parseCursor(value: string): { receivedAt: Date; id: string } {
  const [time = "", id = ""] = value.split("~");
  const receivedAt = new Date(time);
  if (Number.isNaN(receivedAt.getTime())) throw new AppError("bad_request", "before must be a nextBefore cursor or an ISO 8601 time");
  return { receivedAt, id };
}

function parseNewEndpoint(body: Record<string, unknown>): { name: string; scheme: WebhookScheme; path: string } {
  const { name, scheme, path } = body;
  if (typeof name !== "string" || !namePattern.test(name)) throw new AppError("bad_request", "name must be 1–63 letters, digits, '_', '-' or '.', starting with a letter or digit");
  if (scheme !== "standard" && scheme !== "github") throw new AppError("bad_request", 'scheme must be "standard" or "github"');
  return { name, scheme, path: parsePath(path ?? "/") };
}

export function createAdminRoutes(deps: ResolvedWebhookDeps, onQueued: () => void): Hono<GatewayEnv> {
  const app = new Hono<GatewayEnv>();
  const { store, clock, config } = deps;
  const auditBy = (c: Context<GatewayEnv>, caller: Caller, action: string): AuditBy => ({ actor: caller.subject, action, requestId: c.get("requestId") ?? null });

  /** The caller (agents:admin) and an agent of their tenant that is not deleted; 404 for anything else. */
  async function callerAndAgent(c: Context<GatewayEnv>): Promise<{ caller: Caller; agentId: string }> {
    const caller = requireScope(c, "agents:admin");
    const agentId = c.req.param("id") ?? "";
    if (!(await store.tenantOwnsLiveAgent(caller.tenantId, agentId))) throw new AppError("not_found", "no such agent");
    return { caller, agentId };
  }

  async function endpointOf(c: Context<GatewayEnv>): Promise<{ caller: Caller; endpoint: EndpointRow }> {
    const { caller, agentId } = await callerAndAgent(c);
    const endpoint = await store.findEndpoint(agentId, c.req.param("name") ?? "");
    if (!endpoint) throw new AppError("not_found", "no such webhook endpoint");
    return { caller, endpoint };
  }

  app.post("/v1/agents/:id/webhooks", async (c) => {
    const { caller, agentId } = await callerAndAgent(c);
    const input = parseNewEndpoint(await jsonBody(c));
    const secret = generateSecret(input.scheme);
    const now = new Date(clock.now());
    const row = await store.createEndpoint({ tenantId: caller.tenantId, agentId, ...input, secret }, auditBy(c, caller, "webhook.endpoint.create"), now);
    if (!row) throw new AppError("conflict", `agent ${agentId} already has a webhook endpoint named ${input.name}`);
    // The only time the secret is shown: it is not in any other answer.
    return c.json({ ...endpointView(row, now.getTime()), secret }, 201);
  });

  app.get("/v1/agents/:id/webhooks", async (c) => {
    const { agentId } = await callerAndAgent(c);
    const now = clock.now();
    return c.json({ endpoints: (await store.listEndpoints(agentId)).map((e) => endpointView(e, now)) });
  });

  app.get("/v1/agents/:id/webhooks/:name", async (c) => {
    const { endpoint } = await endpointOf(c);
    return c.json(endpointView(endpoint, clock.now()));
  });

  app.delete("/v1/agents/:id/webhooks/:name", async (c) => {
    const { caller, endpoint } = await endpointOf(c);
    if (!(await store.deleteEndpoint(endpoint, auditBy(c, caller, "webhook.endpoint.delete"), new Date(clock.now())))) {
      throw new AppError("not_found", "no such webhook endpoint");
    }
    return c.body(null, 204);
  });

  app.post("/v1/agents/:id/webhooks/:name/rotate", async (c) => {
    const { caller, endpoint } = await endpointOf(c);
    const body = await jsonBody(c);
    const overlapS = body.overlapS ?? config.defaultRotationOverlapS;
    if (typeof overlapS !== "number" || !Number.isInteger(overlapS) || overlapS < 0 || overlapS > maxOverlapS) {
      throw new AppError("bad_request", `overlapS must be a whole number of seconds from 0 to ${maxOverlapS}`);
    }
    const now = new Date(clock.now());
    const secret = generateSecret(endpoint.scheme);
    const row = await store.rotateSecret(endpoint, secret, new Date(now.getTime() + overlapS * 1000), auditBy(c, caller, "webhook.endpoint.rotate"), now);
    if (!row) throw new AppError("not_found", "no such webhook endpoint");
    return c.json({ ...endpointView(row, now.getTime()), secret });
  });

  app.get("/v1/agents/:id/webhooks/:name/deliveries", async (c) => {
    const { endpoint } = await endpointOf(c);
    const limitRaw = c.req.query("limit") ?? "50";
    if (!/^\d+$/.test(limitRaw) || Number(limitRaw) < 1 || Number(limitRaw) > 200) throw new AppError("bad_request", "limit must be 1–200");
    const beforeRaw = c.req.query("before");
    const before = beforeRaw === undefined ? undefined : parseCursor(beforeRaw);
    const deliveries = await store.listDeliveries(endpoint.id, { limit: Number(limitRaw), ...(before ? { before } : {}) });
    const attempts = await store.attemptsOf(deliveries.map((d) => d.id));
    const last = deliveries.at(-1);
    return c.json({
      deliveries: deliveries.map((d) => deliveryView(d, attempts.get(d.id) ?? [], { withBody: false })),
      /** Pass as `before` for the next (older) page; null on the last page. */
      nextBefore: last && deliveries.length === Number(limitRaw) ? `${last.receivedAt.toISOString()}~${last.id}` : null,
    });
  });

  app.get("/v1/webhook-deliveries/:id", async (c) => {
    const caller = requireScope(c, "agents:admin");
    const delivery = await store.findTenantDelivery(caller.tenantId, c.req.param("id"));
    if (!delivery) throw new AppError("not_found", "no such webhook delivery");
    const attempts = await store.attemptsOf([delivery.id]);
    return c.json({ ...deliveryView(delivery, attempts.get(delivery.id) ?? [], { withBody: true }), endpointName: delivery.endpointName });
  });

  app.post("/v1/webhook-deliveries/:id/redeliver", async (c) => {
    const caller = requireScope(c, "agents:admin");
    const delivery = await store.findTenantDelivery(caller.tenantId, c.req.param("id"));
    if (!delivery) throw new AppError("not_found", "no such webhook delivery");
    const row = await store.redeliver(delivery, auditBy(c, caller, "webhook.delivery.redeliver"), new Date(clock.now()));
    if (!row) throw new AppError("conflict", "the delivery has an attempt in flight; try again when it has finished");
    onQueued();
    return c.json({ deliveryId: row.id, status: row.status }, 202);
  });

  return app;
}

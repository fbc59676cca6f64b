// Admin API of webhooks (scope agents:admin, own tenant's live agents only): endpoints, secret rotation, deliveries, redelivery.
import { createRoute } from "@hono/zod-openapi";
import type { Context } from "hono";
import { requireScope, scopeGate, type Caller, type GatewayEnv } from "../../contracts/caller.ts";
import { apiRouter, badCursor, decodeCursor, errors, json, jsonBody, jsonRequest, pageOf } from "../../lib/api.ts";
import { AppError } from "../../lib/errors.ts";
import {
  AgentParams,
  DeliveryPage,
  DeliveryParams,
  EndpointPage,
  EndpointParams,
  ListQuery,
  maxAdminBodyBytes,
  NewEndpoint,
  Redelivery,
  Rotation,
  WebhookDeliveryDetail,
  WebhookEndpoint,
  WebhookEndpointWithSecret,
} from "./api-schemas.ts";
import { generateSecret } from "./signature.ts";
import type { AuditBy, EndpointRow } from "./store-types.ts";
import { deliveryDetailView, deliveryView, endpointView } from "./views.ts";
import type { ResolvedWebhookDeps } from "./types.ts";

const tags = ["webhooks"];
const bounded = [scopeGate("agents:admin"), jsonBody(() => maxAdminBodyBytes)];

/** A deliveries cursor: the receive time (ms precision, as stored) and id of the last delivery shown. */
function deliveryPosition(cursor: string): { receivedAt: Date; id: string } {
  const [time, id] = decodeCursor(cursor, ["string", "string"]) as [string, string];
  const receivedAt = new Date(time);
  if (!/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/.test(time) || Number.isNaN(receivedAt.getTime())) throw badCursor();
  return { receivedAt, id };
}

const createEndpointRoute = createRoute({
  method: "post",
  middleware: [scopeGate("agents:admin")],
  path: "/v1/agents/{id}/webhooks",
  operationId: "createWebhookEndpoint",
  summary: "Create a signed webhook endpoint of the agent; the answer is the only one that shows its secret",
  tags,
  request: { params: AgentParams, ...jsonRequest(NewEndpoint) },
  responses: { 201: json(WebhookEndpointWithSecret, "The endpoint with its secret"), ...errors(400, 404, 409, 413) },
});

const listEndpointsRoute = createRoute({
  method: "get",
  middleware: [scopeGate("agents:admin")],
  path: "/v1/agents/{id}/webhooks",
  operationId: "listWebhookEndpoints",
  summary: "The agent's webhook endpoints, by name (never their secrets)",
  tags,
  request: { params: AgentParams, query: ListQuery },
  responses: { 200: json(EndpointPage, "A page of endpoints"), ...errors(400, 404) },
});

const getEndpointRoute = createRoute({
  method: "get",
  middleware: [scopeGate("agents:admin")],
  path: "/v1/agents/{id}/webhooks/{name}",
  operationId: "getWebhookEndpoint",
  summary: "One webhook endpoint",
  tags,
  request: { params: EndpointParams },
  responses: { 200: json(WebhookEndpoint, "The endpoint"), ...errors(404) },
});

const deleteEndpointRoute = createRoute({
  method: "delete",
  middleware: [scopeGate("agents:admin")],
  path: "/v1/agents/{id}/webhooks/{name}",
  operationId: "deleteWebhookEndpoint",
  summary: "Stop accepting deliveries (those already accepted are still delivered)",
  tags,
  request: { params: EndpointParams },
  responses: { 204: { description: "Deleted" }, ...errors(404) },
});

const rotateRoute = createRoute({
  method: "post",
  middleware: [scopeGate("agents:admin")],
  path: "/v1/agents/{id}/webhooks/{name}/rotate",
  operationId: "rotateWebhookSecret",
  summary: "A new secret; the one it replaces keeps verifying for overlapS seconds",
  tags,
  request: { params: EndpointParams, ...jsonRequest(Rotation) },
  responses: { 200: json(WebhookEndpointWithSecret, "The endpoint with its new secret"), ...errors(400, 404, 413) },
});

const listDeliveriesRoute = createRoute({
  method: "get",
  middleware: [scopeGate("agents:admin")],
  path: "/v1/agents/{id}/webhooks/{name}/deliveries",
  operationId: "listWebhookDeliveries",
  summary: "The endpoint's deliveries, newest first, each with its attempts (bodies: see getWebhookDelivery)",
  tags,
  request: { params: EndpointParams, query: ListQuery },
  responses: { 200: json(DeliveryPage, "A page of deliveries"), ...errors(400, 404) },
});

const getDeliveryRoute = createRoute({
  method: "get",
  middleware: [scopeGate("agents:admin")],
  path: "/v1/webhook-deliveries/{id}",
  operationId: "getWebhookDelivery",
  summary: "One delivery with its attempts, headers and body",
  tags,
  request: { params: DeliveryParams },
  responses: { 200: json(WebhookDeliveryDetail, "The delivery"), ...errors(404) },
});

const redeliverRoute = createRoute({
  method: "post",
  middleware: [scopeGate("agents:admin")],
  path: "/v1/webhook-deliveries/{id}/redeliver",
  operationId: "redeliverWebhook",
  summary: "Queue the delivery again now with a fresh attempt budget (also after delivery); 409 while an attempt runs",
  tags,
  request: { params: DeliveryParams },
  responses: { 202: json(Redelivery, "Queued"), ...errors(404, 409) },
});

export function createAdminRoutes(deps: ResolvedWebhookDeps, onQueued: () => void) {
  const app = apiRouter<GatewayEnv>();
  const { store, clock, config } = deps;
  const auditBy = (c: Context<GatewayEnv>, caller: Caller, action: string): AuditBy => ({
    actor: caller.subject,
    action,
    requestId: c.get("requestId") ?? null,
  });

  /** The caller (agents:admin) and an agent of their tenant that is not deleted; 404 for anything else. */
  async function callerAndAgent(c: Context<GatewayEnv>, agentId: string): Promise<{ caller: Caller; agentId: string }> {
    const caller = requireScope(c, "agents:admin");
    if (!(await store.tenantOwnsLiveAgent(caller.tenantId, agentId))) throw new AppError("not_found", "no such agent");
    return { caller, agentId };
  }

  async function endpointOf(c: Context<GatewayEnv>, params: { id: string; name: string }): Promise<{ caller: Caller; endpoint: EndpointRow }> {
    const { caller, agentId } = await callerAndAgent(c, params.id);
    const endpoint = await store.findEndpoint(agentId, params.name);
    if (!endpoint) throw new AppError("not_found", "no such webhook endpoint");
    return { caller, endpoint };
  }

  app.openapi({ ...createEndpointRoute, middleware: bounded }, async (c) => {
    const { caller, agentId } = await callerAndAgent(c, c.req.valid("param").id);
    const input = c.req.valid("json");
    const secret = generateSecret(input.scheme);
    const now = new Date(clock.now());
    const row = await store.createEndpoint({ tenantId: caller.tenantId, agentId, ...input, secret }, auditBy(c, caller, "webhook.endpoint.create"), now);
    if (!row) throw new AppError("conflict", `agent ${agentId} already has a webhook endpoint named ${input.name}`);
    // The only time the secret is shown: it is not in any other answer.
    return c.json({ ...endpointView(row, now.getTime()), secret }, 201);
  });

  app.openapi(listEndpointsRoute, async (c) => {
    const { agentId } = await callerAndAgent(c, c.req.valid("param").id);
    const { limit, cursor } = c.req.valid("query");
    const afterName = cursor === undefined ? undefined : (decodeCursor(cursor, ["string"])[0] as string);
    const rows = await store.listEndpoints(agentId, { limit: limit + 1, ...(afterName !== undefined ? { afterName } : {}) });
    const page = pageOf(rows, limit, (e) => [e.name]);
    const now = clock.now();
    return c.json({ endpoints: page.items.map((e) => endpointView(e, now)), nextCursor: page.nextCursor }, 200);
  });

  app.openapi(getEndpointRoute, async (c) => {
    const { endpoint } = await endpointOf(c, c.req.valid("param"));
    return c.json(endpointView(endpoint, clock.now()), 200);
  });

  app.openapi(deleteEndpointRoute, async (c) => {
    const { caller, endpoint } = await endpointOf(c, c.req.valid("param"));
    if (!(await store.deleteEndpoint(endpoint, auditBy(c, caller, "webhook.endpoint.delete"), new Date(clock.now())))) {
      throw new AppError("not_found", "no such webhook endpoint");
    }
    return c.body(null, 204);
  });

  app.openapi({ ...rotateRoute, middleware: bounded }, async (c) => {
    const { caller, endpoint } = await endpointOf(c, c.req.valid("param"));
    const overlapS = c.req.valid("json").overlapS ?? config.defaultRotationOverlapS;
    const now = new Date(clock.now());
    const secret = generateSecret(endpoint.scheme);
    const row = await store.rotateSecret(endpoint, secret, new Date(now.getTime() + overlapS * 1000), auditBy(c, caller, "webhook.endpoint.rotate"), now);
    if (!row) throw new AppError("not_found", "no such webhook endpoint");
    return c.json({ ...endpointView(row, now.getTime()), secret }, 200);
  });

  app.openapi(listDeliveriesRoute, async (c) => {
    const { endpoint } = await endpointOf(c, c.req.valid("param"));
    const { limit, cursor } = c.req.valid("query");
    const rows = await store.listDeliveries(endpoint.id, { limit: limit + 1, ...(cursor !== undefined ? { before: deliveryPosition(cursor) } : {}) });
    const page = pageOf(rows, limit, (d) => [d.receivedAt.toISOString(), d.id]);
    const attempts = await store.attemptsOf(page.items.map((d) => d.id));
    return c.json({ deliveries: page.items.map((d) => deliveryView(d, attempts.get(d.id) ?? [])), nextCursor: page.nextCursor }, 200);
  });

  app.openapi(getDeliveryRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const delivery = await store.findTenantDelivery(caller.tenantId, c.req.valid("param").id);
    if (!delivery) throw new AppError("not_found", "no such webhook delivery");
    const attempts = await store.attemptsOf([delivery.id]);
    return c.json(deliveryDetailView(delivery, attempts.get(delivery.id) ?? [], delivery.endpointName), 200);
  });

  app.openapi(redeliverRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const delivery = await store.findTenantDelivery(caller.tenantId, c.req.valid("param").id);
    if (!delivery) throw new AppError("not_found", "no such webhook delivery");
    const row = await store.redeliver(delivery, auditBy(c, caller, "webhook.delivery.redeliver"), new Date(clock.now()));
    if (!row) throw new AppError("conflict", "the delivery has an attempt in flight; try again when it has finished");
    onQueued();
    return c.json({ deliveryId: row.id, status: row.status }, 202);
  });

  return app;
}

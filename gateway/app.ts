// The gateway's Hono app, built only from injected dependencies: no runtime import here (Node and Workers adapt it).
import type { Context } from "hono";
import { matchedRoutes } from "hono/route";
import type { OpenAPIHono } from "@hono/zod-openapi";
import { createRoute } from "@hono/zod-openapi";
import { apiRouter, asAppError, ErrorEnvelope, json, refuseNul, z } from "../lib/api.ts";
import { AppError, logFailure, toErrorResponse } from "../lib/errors.ts";
import { newId } from "../lib/ids.ts";
import { readinessResponse } from "../lib/readiness.ts";
import { asDatabaseError } from "../schema/db-errors.ts";
import { bearerToken } from "./auth.ts";
import type { GatewayEnv } from "../contracts/caller.ts";
import { agentProxy } from "./proxy/route.ts";
import { createAdmission } from "./proxy/admission.ts";
import { agentTarget } from "./proxy/policy.ts";
import { createProxyCore, defaultProxyConfig } from "./proxy/core.ts";
import type { GatewayDeps } from "./deps.ts";
import { agentRoutes } from "./agents/routes.ts";
import { logRoutes } from "./logs/routes.ts";
import { auditRoutes } from "./audit/routes.ts";
import { templateRoutes } from "./templates/routes.ts";
import { execRoutes } from "./exec/routes.ts";
import { desktopRoutes } from "./desktop/routes.ts";
import { hookAgentId, skipsTenantCheck } from "./tenants/gate.ts";

export type { GatewayConfig, GatewayDeps } from "./deps.ts";

/** What the OpenAPI document says of itself; its paths and schemas come from the routes. */
export const apiDocumentHead = {
  openapi: "3.1.0",
  info: { title: "agentvm", version: "1", description: "Agents in microVMs that sleep between calls: the admin, billing, image and webhook API." },
  security: [{ bearer: [] }],
};

const healthRoute = createRoute({
  method: "get",
  path: "/healthz",
  operationId: "health",
  summary: "Liveness: the process answers (wakes nothing, needs no database)",
  tags: ["health"],
  security: [],
  responses: { 200: json(z.object({ ok: z.literal(true) }), "Alive") },
});

const readyRoute = createRoute({
  method: "get",
  path: "/readyz",
  operationId: "ready",
  summary: "Readiness: names each dependency up or down",
  tags: ["health"],
  security: [],
  responses: {
    200: json(z.object({ ok: z.literal(true) }).catchall(z.enum(["up", "down"])), "Ready"),
    503: { description: "A dependency is down (Retry-After)", content: { "application/json": { schema: ErrorEnvelope } } },
  },
});

export function createGateway(deps: GatewayDeps): OpenAPIHono<GatewayEnv> {
  const app = apiRouter<GatewayEnv>();
  const { log } = deps;
  const proxy = deps.proxy ?? createProxyCore({ ...deps, maxBodyBytes: deps.config.maxBodyBytes, proxy: deps.config.proxy ?? defaultProxyConfig });
  const proxyToAgent = agentProxy({ core: proxy, admission: createAdmission(proxy, deps.auth), clientIp: deps.clientIp });

  app.onError((thrown, c) => {
    const requestId = c.get("requestId") ?? newId("request");
    // A database outage is `503 database_unavailable` + Retry-After, whichever route met it (schema/db-errors.ts).
    const err = asDatabaseError(asAppError(thrown));
    logFailure(log, err, { requestId, method: c.req.method, path: c.req.path });
    return toErrorResponse(err, requestId);
  });
  // The path is shortened: a 15 KB path must not come back as a 15 KB error.
  app.notFound((c) =>
    toErrorResponse(
      new AppError("not_found", `no route for ${c.req.method.slice(0, 20)} ${c.req.path.length > 200 ? `${c.req.path.slice(0, 200)}…` : c.req.path}`),
      c.get("requestId") ?? newId("request"),
    ),
  );

  app.use(async (c, next) => {
    const requestId = newId("request");
    c.set("requestId", requestId);
    c.set("caller", undefined);
    await next();
    // A response passed through as fetched (a WebSocket's 101 on Workers) has immutable headers.
    try {
      c.res.headers.set("x-request-id", requestId);
    } catch {
      /* it goes without */
    }
  });

  // Agent traffic (`/a/{agentId}/…`, or any path of `{agentId}.{domain}`): routed by the rule every entry uses.
  const domain = deps.config.domain?.toLowerCase();
  app.use(async (c, next) => {
    const target = agentTarget(c.req.path, c.req.header("host"), domain);
    if (!target) return next();
    // The caller, its tenant and the agent are the admission's (proxy/admission.ts), as on every entry.
    return proxyToAgent(c, target.agentId, target.pathInside);
  });
  // A NUL in a path or query is 400 before any route or lookup sees it (an agent's own paths above are its business).
  app.use(refuseNul);

  // `GET /healthz` is the gateway's own and wakes nothing: a liveness check (the process answers), whatever Postgres does.
  app.openapi(healthRoute, (c) => c.json({ ok: true as const }, 200));
  // `GET /readyz` names what this gateway is missing: 200 {"ok":true,"database":"up"}, or 503 database_unavailable
  // with details {"database":"down"} and Retry-After. Agents whose host this gateway knows are still served meanwhile.
  app.openapi(readyRoute, (c) => readinessResponse(deps.readiness ?? {}, c.get("requestId")) as never);

  app.use(async (c, next) => {
    // Webhook intake authenticates by signature (a sender's own Authorization header is not ours to judge);
    // meter shipments carry a host's component token, which the billing route verifies itself.
    if (!c.req.path.startsWith("/hooks/") && c.req.path !== "/v1/meter-segments") await authenticate(c);
    else await refuseHookOfClosedTenant(c.req.path);
    return next();
  });

  app.route("/", agentRoutes(deps, proxy));
  app.route("/", logRoutes(deps));
  app.route("/", auditRoutes(deps));
  app.route("/", templateRoutes(deps));
  app.route("/", execRoutes(deps, proxy));
  app.route("/", desktopRoutes(deps, proxy));
  for (const routes of deps.routes ?? []) app.route("/", routes);

  // The API described by the schemas that validate it (every route above and in `deps.routes` that is an OpenAPI router).
  app.openAPIRegistry.registerComponent("securitySchemes", "bearer", { type: "http", scheme: "bearer", bearerFormat: "JWT" });
  app.doc31("/openapi.json", apiDocumentHead);

  /**
   * A verified token's tenant must exist and be active on every route, but for an operator token on the routes that
   * declare so (the operator's, whose scope gates say `tenantGate: "not-operators"`: its tenant claim need not exist):
   * 403 tenant_not_found / tenant_suspended / tenant_deleted otherwise (or, with TENANTS_AUTO_PROVISION, an unknown one
   * is created).
   */
  async function authenticate(c: Context<GatewayEnv>): Promise<void> {
    const token = bearerToken(c.req.header("authorization"));
    if (!token) return;
    const caller = await deps.auth.verify(token);
    c.set("caller", caller);
    if (deps.tenants && !skipsTenantCheck(caller, matchedRoutes(c))) await deps.tenants.admit(caller, c.get("requestId"));
  }

  /**
   * Webhook intake of a suspended or deleted tenant's agent is refused (403 tenant_*), not stored: holding deliveries
   * for a tenant that may never come back would keep its senders' data and our disk. An id that names no agent is left
   * to the intake route (its 404 says nothing of tenants).
   */
  async function refuseHookOfClosedTenant(path: string): Promise<void> {
    const agentId = hookAgentId(path);
    if (!deps.tenants || agentId === undefined) return;
    let agent;
    try {
      agent = await proxy.resolve(agentId);
    } catch (err) {
      if (err instanceof AppError && (err.code === "not_found" || err.code === "invalid_id")) return;
      throw err;
    }
    deps.tenants.assertActive(agent.row.tenantId);
  }

  return app;
}

// The gateway's Hono app, built only from injected dependencies: no runtime import here (Node and Workers adapt it).
import { Hono, type Context } from "hono";
import { AppError, toErrorResponse } from "../lib/errors.ts";
import { newId } from "../lib/ids.ts";
import type { Logger } from "../lib/log.ts";
import type { Fleet } from "../fleet-agent/fleet.ts";
import type { AgentRepo } from "./agent-repo.ts";
import { bearerToken, type Authenticator } from "./auth.ts";
import type { GatewayEnv } from "./auth-context.ts";
import { proxyToAgent } from "./proxy.ts";
import { createProxyCore, defaultProxyConfig, type ProxyConfig, type ProxyCore } from "./proxy-core.ts";
import type { AgentSettingsStore } from "./proxy-agents.ts";
import { agentRoutes } from "./routes/agents.ts";

export interface GatewayConfig {
  /** When set, `{agentId}.{domain}` hosts route to the agent like `/a/{agentId}/…`. */
  domain: string | undefined;
  /** Largest request body the proxy accepts, bytes. */
  maxBodyBytes: number;
  /** Largest JSON body of the admin API, bytes. */
  maxApiBodyBytes: number;
  /** Images an agent may be created with (what the hosts' driver can run). */
  images: readonly string[];
  agentDefaults: { vcpus: number; memMiB: number; idleTimeoutMs: number; streamIdleMs: number };
  /** Proxy timeouts and limits (gateway/proxy-core.ts); defaults when absent. */
  proxy?: ProxyConfig;
}

export interface GatewayDeps {
  agents: AgentRepo;
  fleet: Fleet;
  auth: Authenticator;
  log: Logger;
  config: GatewayConfig;
  /** The client's address as the runtime sees it (for X-Forwarded-For). */
  clientIp?: (c: Context<GatewayEnv>) => string | undefined;
  /** More routes mounted at the root (billing, webhooks); they see the same request id and caller. */
  routes?: Hono<GatewayEnv>[];
  /** Per-agent settings (PATCH /v1/agents/:id, per-agent limits); without it they are read-only defaults. */
  settings?: AgentSettingsStore;
  /** The proxy's shared state (agent cache, tenant limiter), when the Node fast path shares it; else one is made here. */
  proxy?: ProxyCore;
}

export function createGateway(deps: GatewayDeps): Hono<GatewayEnv> {
  const app = new Hono<GatewayEnv>();
  const { log } = deps;
  const proxy = deps.proxy ?? createProxyCore({ ...deps, maxBodyBytes: deps.config.maxBodyBytes, proxy: deps.config.proxy ?? defaultProxyConfig });
  const proxyDeps = { core: proxy, clientIp: deps.clientIp };

  app.onError((err, c) => {
    const requestId = c.get("requestId") ?? newId("request");
    const status = err instanceof AppError ? err.status : 500;
    const fields = { requestId, method: c.req.method, path: c.req.path, status, code: err instanceof AppError ? err.code : "internal", err: err.message };
    if (status >= 500) log.error("request failed", { ...fields, stack: err instanceof AppError ? undefined : err.stack });
    else log.info("request rejected", fields);
    return toErrorResponse(err, requestId);
  });
  app.notFound((c) => toErrorResponse(new AppError("not_found", `no route for ${c.req.method} ${c.req.path}`), c.get("requestId") ?? newId("request")));

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

  // `{agentId}.{domain}`: the whole path belongs to the agent.
  const domain = deps.config.domain?.toLowerCase();
  if (domain) {
    app.use(async (c, next) => {
      const host = (c.req.header("host") ?? "").toLowerCase().replace(/:\d+$/, "");
      if (!host.endsWith(`.${domain}`)) return next();
      const agentId = host.slice(0, -domain.length - 1);
      if (agentId.includes(".")) return next();
      await authenticate(c);
      return proxyToAgent(proxyDeps, c, agentId, c.req.path);
    });
  }

  // `GET /healthz` is the gateway's own and wakes nothing.
  app.get("/healthz", (c) => c.json({ ok: true }));

  app.use(async (c, next) => {
    // Webhook intake authenticates by signature (a sender's own Authorization header is not ours to judge);
    // meter shipments carry a host's component token, which the billing route verifies itself.
    if (!c.req.path.startsWith("/hooks/") && c.req.path !== "/v1/meter-segments") await authenticate(c);
    return next();
  });

  app.all("/a/:agentId", (c) => proxyToAgent(proxyDeps, c, c.req.param("agentId"), "/"));
  app.all("/a/:agentId/*", (c) => {
    const agentId = c.req.param("agentId");
    const prefix = `/a/${agentId}`;
    return proxyToAgent(proxyDeps, c, agentId, c.req.path.slice(prefix.length) || "/");
  });

  app.route("/", agentRoutes(deps, proxy));
  for (const routes of deps.routes ?? []) app.route("/", routes);

  async function authenticate(c: Context<GatewayEnv>): Promise<void> {
    const token = bearerToken(c.req.header("authorization"));
    if (token) c.set("caller", await deps.auth.verify(token));
  }

  return app;
}

// `npm run gateway`: a standalone Node gateway over Postgres that reaches fleet-agents on other processes or machines over HTTP.
import { join, resolve } from "node:path";
import { mkdirSync } from "node:fs";
import type { Hono } from "hono";
import { systemClock, type Clock } from "../lib/clock.ts";
import { AppError } from "../lib/errors.ts";
import { int, oneOf, optStr, str, type Env } from "../lib/env.ts";
import { componentKey } from "../lib/host-token.ts";
import { createLogger, type Logger } from "../lib/log.ts";
import { stopOnSignals } from "../lib/signals.ts";
import { openDatabase, type Database } from "../schema/db.ts";
import { createGateway, type GatewayConfig } from "../gateway/app.ts";
import { createBillingRoutes } from "../billing/routes.ts";
import { createNodeProxy } from "../gateway/fast-path/handler.ts";
import { createAgentSettingsStore } from "../gateway/proxy-agents.ts";
import { createProxyCore, defaultProxyConfig } from "../gateway/proxy-core.ts";
import { createAgentRepo } from "../gateway/agent-repo.ts";
import { createJwtAuthenticator } from "../gateway/auth.ts";
import type { GatewayEnv } from "../gateway/auth-context.ts";
import { parseGatewayConfig, type GatewayAuthConfig } from "../gateway/config.ts";
import { nodeClientIp, serveNode } from "../gateway/node.ts";
import { createDbPlacement } from "../gateway/placement.ts";
import { createRemoteFleet } from "../gateway/remote-fleet.ts";
import { createNodeHostFetch, createNodeHostUpgrade } from "../gateway/remote-fleet-node.ts";
import { createWebhookModule, fleetForward, webhookConfigFromEnv, type WebhookConfig } from "../gateway/webhooks/index.ts";
import { ensureDevKeys } from "./dev-keys.ts";

export interface StandaloneGatewayConfig {
  port: number;
  hostname: string;
  databaseUrl: string;
  /** Holds the dev signing key when no JWKS is configured. */
  dataDir: string;
  componentSecret: string;
  gateway: GatewayConfig;
  auth: GatewayAuthConfig;
  webhooks: WebhookConfig;
  placement: { liveWindowMs: number; cacheTtlMs: number };
  hosts: { connectTimeoutMs: number; headersTimeoutMs: number };
  /** How long shutdown lets calls in flight finish. */
  drainTimeoutMs: number;
}

/**
 * | variable | default | meaning |
 * | DATABASE_URL | (required) | the Postgres all gateways and hosts share |
 * | COMPONENT_SECRET | (required, ≥ 32 chars) | signs every call to a host (the hosts have the same secret) |
 * | PORT | 8080 | port of the gateway |
 * | BIND_ADDRESS | 127.0.0.1 | address it listens on |
 * | DATA_DIR | .data | where the dev signing key lives when neither JWKS_URL nor JWKS_JSON is set |
 * | AGENT_IMAGES | demo | images agents may be created with (what the hosts' drivers run), comma-separated |
 * | HOST_LIVE_WINDOW_MS | 30000 | a host without a heartbeat for this long gets no new agents |
 * | PLACEMENT_CACHE_MS | 2000 | how long an agent → host answer is reused |
 * | HOST_CONNECT_TIMEOUT_MS | 5000 | connecting to a host's ingress |
 * | HOST_HEADERS_TIMEOUT_MS | 400000 | from a call sent to the host's answer (longer than the host's own wake and agent limits) |
 * | DRAIN_TIMEOUT_MS | 10000 | how long shutdown lets calls in flight finish before cutting their connections |
 * | LOG_LEVEL | info | debug, info, warn or error |
 * plus the gateway's (gateway/config.ts) and the webhook module's (WEBHOOK_*) variables.
 */
export function parseStandaloneGatewayConfig(env: Env): StandaloneGatewayConfig {
  const databaseUrl = optStr(env, "DATABASE_URL");
  if (!databaseUrl) throw new AppError("bad_request", "configuration: DATABASE_URL is required (the Postgres that gateways and hosts share)");
  const componentSecret = optStr(env, "COMPONENT_SECRET");
  if (!componentSecret) throw new AppError("bad_request", "configuration: COMPONENT_SECRET is required (it signs every call to a host)");
  componentKey(componentSecret);
  const images = str(env, "AGENT_IMAGES", "demo").split(",").map((s) => s.trim()).filter(Boolean);
  const { gateway, auth } = parseGatewayConfig(env, images);
  return {
    port: int(env, "PORT", 8080, { min: 0, max: 65535 }),
    hostname: str(env, "BIND_ADDRESS", "127.0.0.1"),
    databaseUrl,
    dataDir: resolve(str(env, "DATA_DIR", ".data")),
    componentSecret,
    gateway,
    auth,
    webhooks: webhookConfigFromEnv(env),
    placement: { liveWindowMs: int(env, "HOST_LIVE_WINDOW_MS", 30_000, { min: 1000 }), cacheTtlMs: int(env, "PLACEMENT_CACHE_MS", 2000, { min: 0 }) },
    hosts: {
      connectTimeoutMs: int(env, "HOST_CONNECT_TIMEOUT_MS", 5000, { min: 100 }),
      headersTimeoutMs: int(env, "HOST_HEADERS_TIMEOUT_MS", 400_000, { min: 1000 }),
    },
    drainTimeoutMs: int(env, "DRAIN_TIMEOUT_MS", 10_000, { min: 0 }),
  };
}

export interface StandaloneGateway {
  url: string;
  port: number;
  app: Hono<GatewayEnv>;
  database: Database;
  stop(): Promise<void>;
}

export async function startGateway(cfg: StandaloneGatewayConfig, parts: { log: Logger; clock?: Clock; database?: Database }): Promise<StandaloneGateway> {
  const { log } = parts;
  const clock = parts.clock ?? systemClock;
  const database = parts.database ?? (await openDatabase({ url: cfg.databaseUrl }));
  const { db } = database;

  let jwks = cfg.auth.jwksJson ? JSON.parse(cfg.auth.jwksJson) : undefined;
  if (!cfg.auth.jwksUrl && !jwks) {
    mkdirSync(cfg.dataDir, { recursive: true });
    jwks = (await ensureDevKeys(cfg.dataDir)).jwks;
    log.warn(`no JWKS_URL or JWKS_JSON: accepting tokens of the dev key in ${join(cfg.dataDir, "keys")} (mint with npm run token)`);
  }
  const auth = createJwtAuthenticator({
    keys: cfg.auth.jwksUrl ? { jwksUrl: cfg.auth.jwksUrl } : { jwks },
    issuer: cfg.auth.issuer,
    audience: cfg.auth.audience,
    algorithms: cfg.auth.algorithms,
  });
  const hostFetch = createNodeHostFetch(cfg.hosts);
  const placement = createDbPlacement(db, { ...cfg.placement, clock });
  const remoteLog = log.child({ component: "remote-fleet" });
  // WebSockets: relayed by the agent's host (frames, 1001 before hibernating); this gateway joins the bytes.
  const hostUpgrade = createNodeHostUpgrade({ placement, key: componentKey(cfg.componentSecret), log: remoteLog, ...cfg.hosts });
  const fleet = {
    ...createRemoteFleet({ placement, key: componentKey(cfg.componentSecret), fetch: hostFetch, log: remoteLog }),
    upgrade: hostUpgrade,
  };
  const agents = createAgentRepo(db);
  const webhooks = createWebhookModule({ db, clock, log: log.child({ component: "webhooks" }), forward: fleetForward(agents, fleet), config: cfg.webhooks });
  const billing = createBillingRoutes({ db, clock, log: log.child({ component: "billing" }), componentKey: componentKey(cfg.componentSecret) });
  // One proxy core (agent cache, tenant limiter) shared by the Hono app and the Node fast path.
  const gatewayLog = log.child({ component: "gateway" });
  const settings = createAgentSettingsStore(db);
  const proxyConfig = cfg.gateway.proxy ?? defaultProxyConfig;
  const proxy = createProxyCore({ agents, settings, fleet, log: gatewayLog, maxBodyBytes: cfg.gateway.maxBodyBytes, proxy: proxyConfig });
  const app = createGateway({ agents, fleet, auth, log: gatewayLog, config: cfg.gateway, clientIp: nodeClientIp, routes: [webhooks.routes, billing], settings, proxy });
  const nodeProxy = createNodeProxy({ core: proxy, auth, domain: cfg.gateway.domain, log: gatewayLog });

  const server = await serveNode(app, { port: cfg.port, hostname: cfg.hostname, proxy: nodeProxy, maxHeaderBytes: proxyConfig.maxHeaderBytes, headersTimeoutMs: proxyConfig.clientHeadersTimeoutMs });
  webhooks.worker.start();
  const url = `http://${cfg.hostname === "0.0.0.0" ? "127.0.0.1" : cfg.hostname}:${server.port}`;

  let stopped: Promise<void> | undefined;
  return {
    url,
    port: server.port,
    app,
    database,
    /**
     * Shutdown order: stop accepting connections → finish webhook attempts in flight → let in-flight calls end
     * (at most DRAIN_TIMEOUT_MS, then their connections are cut) → close host connections → close the database.
     */
    stop() {
      stopped ??= (async () => {
        const closing = server.close();
        await webhooks.worker.stop();
        // Streams may run for hours: they get a grace period, then their connections are cut.
        const grace = new Promise<void>((done) => setTimeout(done, cfg.drainTimeoutMs).unref());
        await Promise.race([closing, grace]);
        server.server.closeAllConnections();
        hostUpgrade.close(); // joined WebSockets are the server's sockets too: closing waits for them
        await closing;
        nodeProxy.close();
        await hostFetch.close();
        if (!parts.database) await database.close();
      })();
      return stopped;
    },
  };
}

async function main(): Promise<void> {
  const env = process.env;
  const log = createLogger({ level: oneOf(env, "LOG_LEVEL", ["debug", "info", "warn", "error"] as const, "info") });
  const gateway = await startGateway(parseStandaloneGatewayConfig(env), { log });
  console.log(`gateway listening at ${gateway.url} (hosts: fleet-agents registered in the database)`);
  stopOnSignals(() => gateway.stop(), log);
}

if (import.meta.main) {
  main().catch((err: unknown) => {
    console.error(err instanceof Error ? err.message : String(err));
    process.exit(1);
  });
}

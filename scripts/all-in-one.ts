// The whole system in one process: database, one host (fleet-agent), gateway with billing and webhook routes.
import { mkdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { eq } from "drizzle-orm";
import type { Hono } from "hono";
import { systemClock, type Clock } from "../lib/clock.ts";
import type { Logger } from "../lib/log.ts";
import { openDatabase, type Database } from "../schema/db.ts";
import { agents, hosts } from "../schema/core.ts";
import { createGateway } from "../gateway/app.ts";
import { createAgentRepo } from "../gateway/agent-repo.ts";
import { createJwtAuthenticator } from "../gateway/auth.ts";
import type { GatewayEnv } from "../gateway/auth-context.ts";
import { parseGatewayConfig, type GatewayAuthConfig } from "../gateway/config.ts";
import type { GatewayConfig } from "../gateway/app.ts";
import { nodeClientIp, serveNode, type NodeServer } from "../gateway/node.ts";
import { createNodeProxy } from "../gateway/fast-path/handler.ts";
import { createAgentSettingsStore } from "../gateway/proxy-agents.ts";
import { createProxyCore, defaultProxyConfig } from "../gateway/proxy-core.ts";
import type { Host } from "../fleet-agent/host.ts";
import { resolveHostId, startHostRuntime } from "../fleet-agent/assemble.ts";
import { InProcessSink } from "../fleet-agent/meter/index.ts";
import { createBillingRoutes } from "../billing/routes.ts";
import { componentKey } from "../lib/host-token.ts";
import { parseFleetAgentConfig, type FleetAgentConfig } from "../fleet-agent/config.ts";
import type { VmDriver } from "../fleet-agent/drivers/driver.ts";
import { createWebhookModule, fleetForward, webhookConfigFromEnv, type WebhookConfig } from "../gateway/webhooks/index.ts";
import { int, optStr, str, type Env } from "../lib/env.ts";
import { ensureDevKeys, mintToken, type DevKeys } from "./dev-keys.ts";

export interface AllInOneConfig {
  port: number;
  hostname: string;
  dataDir: string;
  /** Postgres URL; embedded PGlite under the data directory when unset. */
  databaseUrl: string | undefined;
  gateway: GatewayConfig;
  auth: GatewayAuthConfig;
  fleet: FleetAgentConfig;
  webhooks: WebhookConfig;
  /** Key hosts sign meter shipments with (`COMPONENT_SECRET`); only HTTP shipments need it here. */
  componentKey: Uint8Array;
}

export interface AllInOneParts {
  driver: VmDriver;
  log: Logger;
  clock?: Clock;
  /** An already open database (tests pass one per test file). */
  database?: Database;
}

export interface System {
  url: string;
  port: number;
  database: Database;
  host: Host;
  app: Hono<GatewayEnv>;
  keys: DevKeys;
  demo: { tenantId: string; agentId: string; token: string };
  /**
   * Shutdown order: stop accepting connections → the webhook worker finishes its attempts (they are
   * stored, so what it leaves is retried at the next start) → the host runtime stops (drain in-flight
   * requests, hibernate the VMs, driver releases what it holds, meter ships what it can, pooled upstream
   * connections close) → the fast path's upstream pool closes → open connections are cut → the database closes.
   */
  stop(): Promise<void>;
}

export const demoTenantId = "ten_demo";
export const demoAgentId = "agt_demo";

export async function startAllInOne(cfg: AllInOneConfig, parts: AllInOneParts): Promise<System> {
  const { driver, log } = parts;
  const clock = parts.clock ?? systemClock;
  const dataDir = resolve(cfg.dataDir);
  mkdirSync(dataDir, { recursive: true });

  const database =
    parts.database ?? (await openDatabase(cfg.databaseUrl ? { url: cfg.databaseUrl } : { pgliteDir: join(dataDir, "db") }));
  const { db } = database;
  const keys = await ensureDevKeys(dataDir);

  const hostId = resolveHostId(cfg.fleet.hostId, dataDir);
  await db
    .insert(hosts)
    .values({ id: hostId, driver: driver.name, capacityMiB: 0 })
    .onConflictDoUpdate({ target: hosts.id, set: { driver: driver.name, lastHeartbeatAt: new Date(), startedAt: new Date() } });
  const hostLog = log.child({ component: "fleet-agent", hostId });
  // Billing runs in this process: meter segments go straight to its ingest, no HTTP hop.
  const sink = new InProcessSink(db, clock, log.child({ component: "billing" }));
  const runtime = await startHostRuntime({ cfg: cfg.fleet, hostId, dataDir, db, driver, sink, clock, log: hostLog });
  const { host, fleet } = runtime;
  const repo = createAgentRepo(db);
  const auth = createJwtAuthenticator({
    keys: cfg.auth.jwksUrl ? { jwksUrl: cfg.auth.jwksUrl } : { jwks: cfg.auth.jwksJson ? JSON.parse(cfg.auth.jwksJson) : keys.jwks },
    issuer: cfg.auth.issuer,
    audience: cfg.auth.audience,
    algorithms: cfg.auth.algorithms,
  });
  const webhooks = createWebhookModule({ db, clock, log: log.child({ component: "webhooks" }), forward: fleetForward(repo, fleet), config: cfg.webhooks });
  // One proxy core (agent cache, tenant limiter) shared by the Hono app and the Node fast path.
  const settings = createAgentSettingsStore(db);
  const proxyConfig = cfg.gateway.proxy ?? defaultProxyConfig;
  const gatewayLog = log.child({ component: "gateway" });
  const proxy = createProxyCore({ agents: repo, settings, fleet, log: gatewayLog, maxBodyBytes: cfg.gateway.maxBodyBytes, proxy: proxyConfig });
  const app = createGateway({
    agents: repo,
    fleet,
    auth,
    log: gatewayLog,
    config: cfg.gateway,
    clientIp: nodeClientIp,
    routes: [webhooks.routes, createBillingRoutes({ db, clock, log: log.child({ component: "billing" }), componentKey: cfg.componentKey })],
    settings,
    proxy,
  });
  const nodeProxy = createNodeProxy({ core: proxy, auth, domain: cfg.gateway.domain, log: gatewayLog });

  // The demo tenant and agent, created once and kept across restarts.
  await repo.ensureTenant(demoTenantId, "Demo tenant");
  const existing = await db.select({ id: agents.id }).from(agents).where(eq(agents.id, demoAgentId));
  if (existing.length === 0) {
    const d = cfg.gateway.agentDefaults;
    await repo.create({ id: demoAgentId, tenantId: demoTenantId, name: "demo", image: "demo", vcpus: d.vcpus, memMiB: d.memMiB, idleTimeoutMs: 15_000, streamIdleMs: d.streamIdleMs });
  }
  const token = await mintToken(keys.privateJwk, {
    tenant: demoTenantId,
    scopes: ["agents:invoke", "agents:admin", "usage:read"],
    subject: "demo",
    ttlS: 30 * 24 * 3600,
    issuer: cfg.auth.issuer,
    audience: cfg.auth.audience,
  });

  webhooks.worker.start();
  let server: NodeServer;
  try {
    server = await serveNode(app, { port: cfg.port, hostname: cfg.hostname, proxy: proxyConfig.fastPath ? nodeProxy : undefined, maxHeaderBytes: proxyConfig.maxHeaderBytes, headersTimeoutMs: proxyConfig.clientHeadersTimeoutMs });
  } catch (err) {
    nodeProxy.close();
    await webhooks.worker.stop();
    await runtime.stop();
    if (!parts.database) await database.close();
    throw err;
  }
  const url = `http://${cfg.hostname === "0.0.0.0" ? "127.0.0.1" : cfg.hostname}:${server.port}`;

  let stopped: Promise<void> | undefined;
  return {
    url,
    port: server.port,
    database,
    host,
    app,
    keys,
    demo: { tenantId: demoTenantId, agentId: demoAgentId, token },
    stop() {
      stopped ??= (async () => {
        const closing = server.close();
        await webhooks.worker.stop();
        await runtime.stop();
        nodeProxy.close();
        server.server.closeAllConnections();
        await closing;
        if (!parts.database) await database.close();
      })();
      return stopped;
    },
  };
}

/**
 * The all-in-one's configuration from the environment: its own variables (PORT, BIND_ADDRESS, DATA_DIR,
 * DATABASE_URL, COMPONENT_SECRET) plus the gateway's, the fleet-agent's and the webhooks' (see their config
 * modules). `images` are what the selected driver runs.
 */
export function parseAllInOneConfig(env: Env, images: readonly string[]): AllInOneConfig {
  const { gateway, auth } = parseGatewayConfig(env, images);
  const secret = optStr(env, "COMPONENT_SECRET");
  return {
    port: int(env, "PORT", 8080, { min: 0, max: 65535 }),
    hostname: str(env, "BIND_ADDRESS", "127.0.0.1"),
    dataDir: resolve(str(env, "DATA_DIR", ".data")),
    databaseUrl: optStr(env, "DATABASE_URL"),
    gateway,
    auth,
    fleet: parseFleetAgentConfig(env),
    webhooks: webhookConfigFromEnv(env),
    // With a secret, hosts elsewhere may ship meter segments here over HTTP; without, this process's own host
    // ships in-process and a random key closes the HTTP route.
    componentKey: secret ? componentKey(secret) : crypto.getRandomValues(new Uint8Array(32)),
  };
}

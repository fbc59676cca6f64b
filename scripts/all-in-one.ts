// The whole system in one process: database, one host (fleet-agent), gateway with billing and webhook routes.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { eq } from "drizzle-orm";
import type { Hono } from "hono";
import { systemClock, type Clock } from "../lib/clock.ts";
import { newId } from "../lib/ids.ts";
import type { Logger } from "../lib/log.ts";
import { openDatabase, type Database } from "../schema/db.ts";
import { agents, hosts } from "../schema/core.ts";
import { createGateway } from "../gateway/app.ts";
import { createAgentRepo } from "../gateway/agent-repo.ts";
import { createJwtAuthenticator } from "../gateway/auth.ts";
import type { GatewayEnv } from "../gateway/auth-context.ts";
import type { GatewayAuthConfig } from "../gateway/config.ts";
import type { GatewayConfig } from "../gateway/app.ts";
import { nodeClientIp, serveNode, type NodeServer } from "../gateway/node.ts";
import { Host } from "../fleet-agent/host.ts";
import { createDbHostStore } from "../fleet-agent/store.ts";
import { createLocalFleet } from "../fleet-agent/local-fleet.ts";
import type { FleetAgentConfig } from "../fleet-agent/config.ts";
import type { VmDriver } from "../fleet-agent/drivers/driver.ts";
import type { ActivityListener } from "../fleet-agent/types.ts";
import { createWebhookModule, fleetForward, type WebhookConfig } from "../gateway/webhooks/index.ts";
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
   * stored, so what it leaves is retried at the next start) → host drains in-flight requests and hibernates its VMs
   * → the driver releases what it holds → pooled upstream connections close → the database closes.
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

  const hostId = cfg.fleet.hostId ?? persistentId(join(dataDir, "host-id"), () => newId("host"));
  await db
    .insert(hosts)
    .values({ id: hostId, driver: driver.name, capacityMiB: 0 })
    .onConflictDoUpdate({ target: hosts.id, set: { driver: driver.name, lastHeartbeatAt: new Date(), startedAt: new Date() } });

  const activity: ActivityListener = { active() {}, inactive() {} };
  const host = new Host({
    config: {
      hostId,
      vmsDir: join(dataDir, "hosts", hostId, "vms"),
      wakeQueueLimit: cfg.fleet.wakeQueueLimit,
      wakeDeadlineMs: cfg.fleet.wakeDeadlineMs,
      reaperIntervalMs: cfg.fleet.reaperIntervalMs,
      cpuBusyThreshold: cfg.fleet.cpuBusyThreshold,
      drainTimeoutMs: cfg.fleet.drainTimeoutMs,
    },
    driver,
    store: createDbHostStore(db),
    clock,
    log: log.child({ component: "fleet-agent", hostId }),
    activity,
  });
  const fleet = createLocalFleet(host, cfg.fleet.upstream);
  const repo = createAgentRepo(db);
  const auth = createJwtAuthenticator({
    keys: cfg.auth.jwksUrl ? { jwksUrl: cfg.auth.jwksUrl } : { jwks: cfg.auth.jwksJson ? JSON.parse(cfg.auth.jwksJson) : keys.jwks },
    issuer: cfg.auth.issuer,
    audience: cfg.auth.audience,
    algorithms: cfg.auth.algorithms,
  });
  const webhooks = createWebhookModule({ db, clock, log: log.child({ component: "webhooks" }), forward: fleetForward(repo, fleet), config: cfg.webhooks });
  const app = createGateway({
    agents: repo,
    fleet,
    auth,
    log: log.child({ component: "gateway" }),
    config: cfg.gateway,
    clientIp: nodeClientIp,
    routes: [webhooks.routes],
  });

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

  host.start();
  webhooks.worker.start();
  let server: NodeServer;
  try {
    server = await serveNode(app, { port: cfg.port, hostname: cfg.hostname });
  } catch (err) {
    await webhooks.worker.stop();
    await host.stop();
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
        await host.stop();
        await fleet.close();
        server.server.closeAllConnections();
        await closing;
        if (!parts.database) await database.close();
      })();
      return stopped;
    },
  };
}

function persistentId(path: string, make: () => string): string {
  if (existsSync(path)) return readFileSync(path, "utf8").trim();
  const id = make();
  writeFileSync(path, id + "\n");
  return id;
}

// The whole system in one process: database, one host (fleet-agent), gateway with billing and webhook routes.
import { mkdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { eq } from "drizzle-orm";
import type { Hono } from "hono";
import type { GatewayEnv } from "../contracts/caller.ts";
import { systemClock, type Clock } from "../lib/clock.ts";
import { z } from "zod";
import { parseEnv, type Env } from "../lib/env.ts";
import { shutdownEnv } from "../lib/shared-env.ts";
import type { Logger } from "../lib/log.ts";
import { databaseEnv, dbTimeoutsOf, openDatabase, type Database, type DbTimeouts } from "../schema/db.ts";
import { agents } from "../schema/core.ts";
import { billingSink } from "../billing/sink.ts";
import { createAgentRepo } from "../gateway/agents/repo.ts";
import { fleetAgentConfigOf, fleetAgentEnv, type FleetAgentConfig } from "../fleet-agent/config.ts";
import { artifactStoreEnv } from "../fleet-agent/artifacts/config.ts";
import { driversEnv } from "../fleet-agent/drivers/select.ts";
import type { VmDriver } from "../fleet-agent/drivers/driver.ts";
import type { ExchangeObserver } from "../fleet-agent/egress/exchanges.ts";
import type { Host } from "../fleet-agent/host.ts";
import { registerHost, resolveHostId, startHostRuntime, type HostRuntime } from "../fleet-agent/assemble.ts";
import { openHostIdentity, type HostIdentity } from "../fleet-agent/host-identity.ts";
import { mintToken, type DevKeys } from "./dev-keys.ts";
import { createNodeImageBuilder } from "../images/node-builder.ts";
import { imageRunners, vmDrivers } from "../images/vm-build/index.ts";
import { builderPorts } from "../gateway/agents/builder-agent.ts";
import { nodeGatewayConfigOf, nodeGatewayProgramEnv, startNodeGateway, type NodeGatewayConfig } from "./node-gateway.ts";
import { logLevelEnv } from "./config/shared.ts";
import { composeHostImages } from "./host-images.ts";
import type { HostImages } from "../images/build/host-images.ts";
import type { ImageArtifact } from "../contracts/image.ts";
import { processMetrics, randomMetricsToken } from "./metrics.ts";
import { ensureUpstreamKey, upstreamKeyPath } from "./upstream-key.ts";
import type { DriverUpstreams } from "../fleet-agent/drivers/select.ts";

export interface AllInOneConfig extends NodeGatewayConfig {
  /** Postgres URL; embedded PGlite under the data directory when unset. */
  databaseUrl: string | undefined;
  /** Connect, statement and idle timeouts of the Postgres client (schema/postgres.ts: DB_*). */
  dbTimeouts: DbTimeouts;
  /** DATABASE_APP_ROLE: the role queries run as ('' = the URL's user; absent: agentvm_app; schema/postgres.ts). */
  dbAppRole?: string;
  fleet: FleetAgentConfig;
}

export interface AllInOneParts {
  driver: VmDriver;
  log: Logger;
  clock?: Clock;
  /** The driver's egress proxy's observer (drivers/select.ts `exchanges`): the host's doze is bound to it. */
  exchanges?: { bind(target: ExchangeObserver): void };
  /** An already open database (tests pass one per test file). */
  database?: Database;
  /** The driver's upstream path (drivers/select.ts `SelectedDriver.upstreams`); none: VMs here reach no upstreams. */
  upstreams?: DriverUpstreams;
}

export interface System {
  url: string;
  port: number;
  database: Database;
  host: Host;
  app: Hono<GatewayEnv>;
  keys: DevKeys;
  demo: { tenantId: string; agentId: string; token: string };
  /** A token with only the `operator` scope (tenants, rate cards), for the tenant claim `operatorTenantClaim` (which need not exist). */
  operatorToken: string;
  /** The bearer token of `GET /metrics` (METRICS_TOKEN, or the one made at start); its one registry serves gateway and host. */
  metricsToken: string | undefined;
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
/** The tenant claim of the operator token `npm start` mints: operator routes do not check it, tenant routes refuse it (it does not exist). */
export const operatorTenantClaim = "ten_operator";

export async function startAllInOne(cfg: AllInOneConfig, parts: AllInOneParts): Promise<System> {
  const { driver, log } = parts;
  const clock = parts.clock ?? systemClock;
  const dataDir = resolve(cfg.dataDir);
  mkdirSync(dataDir, { recursive: true });

  const database =
    parts.database ??
    (await openDatabase(
      cfg.databaseUrl
        ? { url: cfg.databaseUrl, timeouts: cfg.dbTimeouts, ...(cfg.dbAppRole !== undefined ? { appRole: cfg.dbAppRole } : {}) }
        : { pgliteDir: join(dataDir, "db") },
    ));
  const { db } = database;

  const hostId = resolveHostId(cfg.fleet.hostId, dataDir);
  // The host's lock and secret (fleet-agent/host-identity.ts), as for the daemon: one process per data directory, and
  // a hosts row in a shared Postgres that another data directory registered is refused. No heartbeat: capacity 0.
  let identity: HostIdentity | undefined;
  try {
    identity = openHostIdentity(dataDir, hostId);
    await registerHost(db, { id: hostId, driver: driver.name, capacityMiB: 0, secretHash: identity.secretHash }, { dataDir, clock });
  } catch (err) {
    identity?.release();
    if (!parts.database) await database.close();
    throw err;
  }
  // One registry for the process: the host, billing and the gateway count into it, the gateway's listener serves it.
  const metrics = processMetrics(cfg.metricsToken);
  // Billing runs in this process: meter segments go straight to its ingest, no HTTP hop.
  const sink = billingSink(db, clock, log.child({ component: "billing" }), metrics.metrics);
  let runtime: HostRuntime | undefined;
  let images: HostImages;
  try {
    const upstreams = parts.upstreams ? { ...parts.upstreams, key: await ensureUpstreamKey(cfg.upstreamKeyFile ?? upstreamKeyPath(dataDir)) } : undefined;
    // Built images: fetched from the shared store when this host lacks one, trimmed to IMAGE_CACHE_MAX_MIB.
    images = composeHostImages({
      dataDir: dataDir,
      artifacts: cfg.fleet.artifacts,
      db: db,
      log: log.child({ component: "images" }),
      inUse: () => runtime?.host.imagesInUse() ?? new Set(),
    });
    runtime = await startHostRuntime({
      ...(upstreams ? { upstreams } : {}),
      cfg: cfg.fleet,
      hostId,
      dataDir,
      db,
      driver,
      sink,
      images: (digest) => images.locate(digest),
      ...(cfg.fleet.artifacts.storeDir ? { fetchImage: (digest: string) => images.ensure(digest) } : {}),
      clock,
      log: log.child({ component: "fleet-agent", hostId }),
      metrics: metrics.metrics,
      ...(parts.exchanges ? { exchanges: parts.exchanges } : {}),
    });
  } catch (err) {
    identity.release();
    if (!parts.database) await database.close();
    throw err;
  }
  if (cfg.fleet.artifacts.storeDir) {
    // Images built before there was a store go into it; then this host's images are trimmed to their limit.
    void images
      .publishAll()
      .then(() => images.trim())
      .catch((err: unknown) => log.warn("publishing or trimming images failed", { err: err instanceof Error ? err.message : String(err) }));
  }
  const hostIdentity = identity;

  // The demo tenant and agent, created once and kept across restarts.
  const repo = createAgentRepo(db);
  await repo.ensureTenant(demoTenantId, "Demo tenant");
  const existing = await db.select({ id: agents.id }).from(agents).where(eq(agents.id, demoAgentId));
  if (existing.length === 0) {
    const d = cfg.gateway.agentDefaults;
    await repo.create({
      id: demoAgentId,
      tenantId: demoTenantId,
      name: "demo",
      image: "demo",
      vcpus: d.vcpus,
      memMiB: d.memMiB,
      idleTimeoutMs: 15_000,
      streamIdleMs: d.streamIdleMs,
    });
  }

  let gateway;
  try {
    // Images are built into this data directory, where this process's host reads them.
    const imageBuilder = createNodeImageBuilder({
      dataDir,
      cacheDir: cfg.imageCacheDir,
      clock,
      log: log.child({ component: "images" }),
      ...(cfg.fleet.artifacts.storeDir ? { publish: (artifact: ImageArtifact) => images.publish(artifact) } : {}),
      // Its agents are microVMs or not by its own driver (its host row gets no heartbeat to judge by).
      ...imageRunners(cfg, {
        ports: builderPorts(db, runtime.fleet),
        dataDir,
        ...(cfg.fleet.artifacts.storeDir ? { publish: (artifact: ImageArtifact) => images.publish(artifact) } : {}),
        microVms: async () => vmDrivers.includes(driver.name),
      }),
    });
    gateway = await startNodeGateway({ ...cfg, dataDir }, { db, fleet: runtime.fleet, log, clock, imageBuilder, metrics });
  } catch (err) {
    await runtime.stop();
    hostIdentity.release();
    if (!parts.database) await database.close();
    throw err;
  }
  const token = await mintToken(gateway.keys.privateJwk, {
    tenant: demoTenantId,
    scopes: ["agents:invoke", "agents:admin", "agents:exec", "images:read", "images:write", "usage:read"],
    subject: "demo",
    ttlS: 30 * 24 * 3600,
    issuer: cfg.auth.issuer,
    audience: cfg.auth.audience,
  });
  // The operator's token is another token: the demo tenant's never carries `operator`.
  const operatorToken = await mintToken(gateway.keys.privateJwk, {
    tenant: operatorTenantClaim,
    scopes: ["operator"],
    subject: "operator",
    ttlS: 30 * 24 * 3600,
    issuer: cfg.auth.issuer,
    audience: cfg.auth.audience,
  });

  let stopped: Promise<void> | undefined;
  return {
    url: gateway.url,
    port: gateway.port,
    database,
    host: runtime.host,
    app: gateway.app,
    keys: gateway.keys,
    demo: { tenantId: demoTenantId, agentId: demoAgentId, token },
    operatorToken,
    metricsToken: cfg.metricsToken,
    stop() {
      // The gateway's drain is this process's host: it drains in-flight calls, hibernates the VMs, stops its meter.
      stopped ??= (async () => {
        await gateway.stop({ drain: () => runtime.stop() });
        hostIdentity.release();
        if (!parts.database) await database.close();
      })();
      return stopped;
    },
  };
}

/**
 * `npm start`'s variables: a Node gateway's (compose/node-gateway.ts), the database's (DATABASE_URL optional: embedded
 * PGlite under the data directory when unset; schema/postgres.ts), the host's (fleet-agent/config.ts) and its drivers'
 * (fleet-agent/drivers/select.ts).
 */
export const allInOneEnv = z.object({
  ...logLevelEnv.shape,
  ...nodeGatewayProgramEnv.shape,
  ...databaseEnv.omit({ DB_MAX_CONNECTIONS: true }).shape,
  ...fleetAgentEnv.shape,
  ...artifactStoreEnv.shape,
  ...shutdownEnv.shape,
  ...driversEnv.shape,
});

export type AllInOneSettings = z.output<typeof allInOneEnv>;

/**
 * The all-in-one's configuration from its parsed variables. `images` are what the selected driver runs. Without
 * METRICS_TOKEN one is made for this start (printed by `npm start`): the all-in-one always serves `GET /metrics`.
 */
export function allInOneConfigOf(v: AllInOneSettings, images: readonly string[]): AllInOneConfig {
  const gateway = nodeGatewayConfigOf(v, images);
  return {
    ...gateway,
    metricsToken: gateway.metricsToken ?? randomMetricsToken(),
    databaseUrl: v.DATABASE_URL,
    dbTimeouts: dbTimeoutsOf(v),
    dbAppRole: v.DATABASE_APP_ROLE,
    fleet: fleetAgentConfigOf(v),
  };
}

/** The all-in-one's configuration from the environment (tests, benchmarks; `npm start` parses once and keeps the variables for the driver). */
export function parseAllInOneConfig(env: Env, images: readonly string[]): AllInOneConfig {
  return allInOneConfigOf(parseEnv(allInOneEnv, env), images);
}

// The standalone fleet-agent daemon (`npm run fleet-agent`): one per host; registers and heartbeats in Postgres, serves the ingress gateways call.
import { mkdirSync } from "node:fs";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { totalmem } from "node:os";
import { resolve } from "node:path";
import { serve } from "@hono/node-server";
import { systemClock, type Clock } from "../lib/clock.ts";
import { z } from "zod";
import { AppError } from "../lib/errors.ts";
import { parseEnv, required, vars, type Env } from "../lib/env.ts";
import { shutdownEnv, upstreamEnv } from "../lib/shared-env.ts";
import { componentKey } from "../lib/host-token.ts";
import type { Logger } from "../lib/log.ts";
import { databaseEnv, dbTimeoutsOf, openDatabase, type Database, type DbTimeouts } from "../schema/db.ts";
import { databaseCheck } from "../schema/db-errors.ts";
import { fleetAgentConfigOf, fleetAgentEnv, type FleetAgentConfig } from "../fleet-agent/config.ts";
import { artifactStoreEnv } from "../fleet-agent/artifacts/config.ts";
import { driversEnv } from "../fleet-agent/drivers/select.ts";
import type { VmDriver } from "../fleet-agent/drivers/driver.ts";
import type { ExchangeObserver } from "../fleet-agent/egress/exchanges.ts";
import type { Host } from "../fleet-agent/host.ts";
import { createIngress, createIngressUpgrade, type IngressUpgrade } from "../fleet-agent/ingress.ts";
import { claimHost, registerHost, resolveHostId, startHeartbeat, startHostRuntime, type HostRuntime } from "../fleet-agent/assemble.ts";
import { openHostIdentity, type HostIdentity } from "../fleet-agent/host-identity.ts";
import { HttpSink } from "../fleet-agent/meter/index.ts";
import { billingSink } from "../billing/sink.ts";
import { composeHostImages } from "./host-images.ts";
import type { HostImages } from "../images/build/host-images.ts";
import { metricsEnv, processMetrics } from "./metrics.ts";
import { proxyLimitsEnv } from "../gateway/config.ts";
import { defaultHostHealth } from "../gateway/hosts/routes.ts";
import { clockSkewEnv, componentEnv, logLevelEnv, processEnv, upstreamKeyEnv } from "./config/shared.ts";
import { ensureUpstreamKey, upstreamKeyPath } from "./upstream-key.ts";
import type { DriverUpstreams } from "../fleet-agent/drivers/select.ts";
import { createConnPolicy, defaultClientLimits, type BodyRule, type ConnPolicyConfig } from "../lib/node-conn-policy.ts";
import { clientLimitsEnv, clientLimitsOf } from "./client-limits.ts";
import { hostOpPaths } from "../contracts/host-protocol.ts";
import { newId } from "../lib/ids.ts";
import { errorResponseText } from "../lib/node-respond.ts";
import type { Duplex } from "node:stream";

export interface FleetAgentDaemonConfig {
  fleet: FleetAgentConfig;
  dataDir: string;
  databaseUrl: string;
  /** Connect, statement and idle timeouts of the Postgres client (schema/postgres.ts). */
  dbTimeouts: DbTimeouts;
  /** DATABASE_APP_ROLE: the role queries run as ('' = the URL's user; absent: agentvm_app; schema/postgres.ts). */
  dbAppRole?: string;
  /** Where the ingress listens. */
  port: number;
  hostname: string;
  /** The ingress base URL gateways use (registered in `hosts.url`); derived from the listen address when unset. */
  publicUrl: string | undefined;
  /** Shared with the gateways: they sign every call to this host with it. */
  componentSecret: string;
  /** UPSTREAM_KEY_FILE: the key upstreams' secret headers are opened with (the gateways seal with it). Unset: `<dataDir>/keys/upstream-key`. */
  upstreamKeyFile?: string;
  /** Memory this host offers to awake agents, MiB (placement's room). */
  capacityMiB: number;
  heartbeatIntervalMs: number;
  /** MAX_CLOCK_SKEW_MS: past this difference between the host's clock and the database's, every heartbeat logs an error (placement skips the host); default 2000. */
  maxClockSkewMs?: number;
  /** Where meter segments are shipped (a gateway serving billing); unset: written to the shared database directly. */
  billingUrl: string | undefined;
  /** Bearer token of the ingress's `GET /metrics` (METRICS_TOKEN, compose/metrics.ts); unset: metrics are off. */
  metricsToken?: string | undefined;
  /**
   * The ingress's head deadline and body floor (the gateway's CLIENT_HEADERS_TIMEOUT_MS, CLIENT_BODY_*), and the
   * total deadline of a host-op body; no connection bounds (its callers are gateways, few addresses, many streams).
   */
  ingressLimits?: IngressLimits;
}

export type IngressLimits = Pick<ConnPolicyConfig, "headTimeoutMs" | "bodyMinBytes" | "bodyWindowMs"> & { bodyTimeoutMs: number };

/** The daemon's own variables (beside the host's, the database's and the drivers' its program schema adds). */
export const daemonEnv = z.object({
  INGRESS_PORT: vars.int({ fallback: 8090, min: 0, max: 65535, doc: "port of the host ingress (what gateways call)" }),
  PUBLIC_URL: vars.optStr({
    type: "URL",
    default: "`http://<BIND_ADDRESS>:<port>`",
    doc: "the ingress URL gateways reach this host at (registered in `hosts.url`)",
  }),
  HOST_CAPACITY_MIB: vars.optInt({ min: 64, unit: "MiB", default: "the machine's memory", doc: "memory this host offers to awake agents (placement's room)" }),
  HEARTBEAT_INTERVAL_MS: vars.int({
    fallback: 10_000,
    min: 100,
    unit: "ms",
    doc: "how often the host refreshes its heartbeat row (with its clock's skew, its used memory and awake agents), then looks whether it drains and which agents it no longer owns",
  }),
  BILLING_URL: vars.optStr({
    type: "URL",
    default: "(unset: segments go straight into the shared database)",
    doc: "gateway base URL meter segments are shipped to",
  }),
});

/** `npm run fleet-agent`'s variables: one host's daemon over the shared Postgres, serving the ingress gateways call. */
export const fleetAgentDaemonEnv = z.object({
  ...logLevelEnv.shape,
  ...processEnv.shape,
  COMPONENT_SECRET: required(componentEnv.shape.COMPONENT_SECRET, "the secret gateways sign host calls with"),
  ...upstreamKeyEnv.shape,
  ...databaseEnv.omit({ DB_MAX_CONNECTIONS: true }).shape,
  DATABASE_URL: required(databaseEnv.shape.DATABASE_URL, "the Postgres that gateways and hosts share"),
  ...daemonEnv.shape,
  ...clockSkewEnv.shape,
  ...metricsEnv.shape,
  // The ingress's head deadline and body floor, as on the gateway (the connection bounds are the gateway's only).
  CLIENT_HEADERS_TIMEOUT_MS: proxyLimitsEnv.shape.CLIENT_HEADERS_TIMEOUT_MS,
  ...clientLimitsEnv.shape,
  ...fleetAgentEnv.shape,
  ...artifactStoreEnv.shape,
  ...upstreamEnv.shape,
  ...shutdownEnv.shape,
  ...driversEnv.shape,
});

export type FleetAgentDaemonSettings = z.output<typeof fleetAgentDaemonEnv>;

export function daemonConfigOf(v: FleetAgentDaemonSettings): FleetAgentDaemonConfig {
  componentKey(v.COMPONENT_SECRET);
  return {
    fleet: fleetAgentConfigOf(v),
    dataDir: resolve(v.DATA_DIR),
    databaseUrl: v.DATABASE_URL,
    dbTimeouts: dbTimeoutsOf(v),
    dbAppRole: v.DATABASE_APP_ROLE,
    port: v.INGRESS_PORT,
    hostname: v.BIND_ADDRESS,
    publicUrl: v.PUBLIC_URL,
    componentSecret: v.COMPONENT_SECRET,
    upstreamKeyFile: resolve(v.UPSTREAM_KEY_FILE ?? upstreamKeyPath(resolve(v.DATA_DIR))),
    capacityMiB: v.HOST_CAPACITY_MIB ?? Math.floor(totalmem() / 1024 / 1024),
    heartbeatIntervalMs: v.HEARTBEAT_INTERVAL_MS,
    maxClockSkewMs: v.MAX_CLOCK_SKEW_MS,
    billingUrl: v.BILLING_URL,
    metricsToken: v.METRICS_TOKEN,
    ingressLimits: ingressLimitsOf({ ...clientLimitsOf(v), headTimeoutMs: v.CLIENT_HEADERS_TIMEOUT_MS }),
  };
}

export function parseDaemonConfig(env: Env): FleetAgentDaemonConfig {
  return daemonConfigOf(parseEnv(fleetAgentDaemonEnv, env));
}

/** How far a host's clock may be from the database's, ms (MAX_CLOCK_SKEW_MS; the gateways' placement has the same default). */
export const defaultMaxClockSkewMs = defaultHostHealth.maxClockSkewMs;

const ingressLimitsOf = (l: IngressLimits): IngressLimits => ({
  headTimeoutMs: l.headTimeoutMs,
  bodyMinBytes: l.bodyMinBytes,
  bodyWindowMs: l.bodyWindowMs,
  bodyTimeoutMs: l.bodyTimeoutMs,
});

export interface FleetAgentParts {
  log: Logger;
  /** The VM driver (the edge selects it from DRIVER). */
  driver: VmDriver;
  clock?: Clock;
  /** The driver's egress proxy's observer (drivers/select.ts `exchanges`): the host's doze is bound to it. */
  exchanges?: { bind(target: ExchangeObserver): void };
  /** An already open database (tests); closed by its owner. */
  database?: Database;
  /** The driver's upstream path (drivers/select.ts `SelectedDriver.upstreams`); none: VMs here reach no upstreams. */
  upstreams?: DriverUpstreams;
}

export interface FleetAgentDaemon {
  hostId: string;
  /** The ingress URL registered for gateways. */
  url: string;
  port: number;
  host: Host;
  database: Database;
  stop(): Promise<void>;
}

export async function startFleetAgent(cfg: FleetAgentDaemonConfig, parts: FleetAgentParts): Promise<FleetAgentDaemon> {
  const { log } = parts;
  const clock = parts.clock ?? systemClock;
  mkdirSync(cfg.dataDir, { recursive: true });
  const database =
    parts.database ??
    (await openDatabase({ url: cfg.databaseUrl, timeouts: cfg.dbTimeouts, ...(cfg.dbAppRole !== undefined ? { appRole: cfg.dbAppRole } : {}) }));
  const { driver } = parts;
  const hostId = resolveHostId(cfg.fleet.hostId, cfg.dataDir);
  const hostLog = log.child({ component: "fleet-agent", hostId });
  // Before anything runs, meters or ships: this process must be the only one on the data directory (its lock), and
  // the data directory the one the hosts row was registered by (its secret). Either refusal ends the start here.
  let identity: HostIdentity | undefined;
  try {
    identity = openHostIdentity(cfg.dataDir, hostId);
    await claimHost(database.db, { id: hostId, driver: driver.name, capacityMiB: cfg.capacityMiB, secretHash: identity.secretHash }, { dataDir: cfg.dataDir });
  } catch (err) {
    identity?.release();
    if (!parts.database) await database.close();
    throw err;
  }
  const { secretHash } = identity;
  if (!driver.isolated) hostLog.warn(`driver ${driver.name}: agents run as plain host processes, NOT isolated`);
  const { metrics, endpoint: metricsEndpoint } = processMetrics(cfg.metricsToken);
  const sink = cfg.billingUrl
    ? new HttpSink({ billingUrl: cfg.billingUrl, hostId, key: componentKey(cfg.componentSecret) })
    : billingSink(database.db, clock, hostLog.child({ component: "billing" }), metrics);
  let runtime: HostRuntime | undefined;
  let images: HostImages;
  try {
    const upstreams = parts.upstreams ? { ...parts.upstreams, key: await ensureUpstreamKey(cfg.upstreamKeyFile ?? upstreamKeyPath(cfg.dataDir)) } : undefined;
    // Built images: fetched from the shared store when this host lacks one, trimmed to IMAGE_CACHE_MAX_MIB.
    images = composeHostImages({
      dataDir: cfg.dataDir,
      artifacts: cfg.fleet.artifacts,
      db: database.db,
      log: hostLog.child({ component: "images" }),
      inUse: () => runtime?.host.imagesInUse() ?? new Set(),
    });
    runtime = await startHostRuntime({
      cfg: cfg.fleet,
      hostId,
      dataDir: cfg.dataDir,
      db: database.db,
      driver,
      sink,
      images: (digest) => images.locate(digest),
      ...(cfg.fleet.artifacts.storeDir ? { fetchImage: (digest: string) => images.ensure(digest) } : {}),
      clock,
      log: hostLog,
      metrics,
      ...(upstreams ? { upstreams } : {}),
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
      .catch((err: unknown) => hostLog.warn("publishing or trimming images failed", { err: err instanceof Error ? err.message : String(err) }));
  }
  const { host, fleet } = runtime;
  const ingressDeps = {
    hostId,
    key: componentKey(cfg.componentSecret),
    fleet,
    log: hostLog.child({ component: "ingress" }),
    readiness: { database: databaseCheck(database.db) },
    metrics: metricsEndpoint,
  };
  const app = createIngress(ingressDeps);
  const upgrades = createIngressUpgrade(ingressDeps);
  let listening;
  try {
    listening = await listen(
      app.fetch,
      upgrades,
      cfg.port,
      cfg.hostname,
      cfg.ingressLimits ?? ingressLimitsOf(defaultClientLimits),
      hostLog.child({ component: "ingress" }),
    );
  } catch (err) {
    await runtime.stop();
    identity.release();
    if (!parts.database) await database.close();
    throw err;
  }
  const { server, port } = listening;
  const url = cfg.publicUrl ?? `http://${cfg.hostname === "0.0.0.0" || cfg.hostname === "::" ? "127.0.0.1" : cfg.hostname}:${port}`;

  // Registered only once the ingress answers, so placement never picks a host that cannot be reached yet.
  const { db } = database;
  try {
    await registerHost(db, { id: hostId, url, driver: driver.name, capacityMiB: cfg.capacityMiB, secretHash }, { dataDir: cfg.dataDir, clock });
  } catch (err) {
    // Taken between the claim and now: this process never served, so it stops as it would.
    await runtime.stop();
    await new Promise<void>((done) => server.close(() => done()));
    identity.release();
    if (!parts.database) await database.close();
    throw err;
  }
  const heartbeat = startHeartbeat(db, hostId, cfg.heartbeatIntervalMs, hostLog, {
    secretHash,
    clock,
    maxSkewMs: cfg.maxClockSkewMs ?? defaultMaxClockSkewMs,
    report: () => host.load(),
    // After each beat: drain if an operator asked, and stop what the database gave to another host (fencing).
    afterBeat: (beat) => host.afterHeartbeat(beat),
    onLost: () =>
      hostLog.error(
        `host ${hostId}: this process no longer owns its row; gateways do not reach it any more. Stop it (its agents belong to the other process now)`,
      ),
  });
  hostLog.info("fleet-agent ready", { url, driver: driver.name, capacityMiB: cfg.capacityMiB });

  let stopped: Promise<void> | undefined;
  return {
    hostId,
    url,
    port,
    host,
    database,
    /**
     * Shutdown order: stop heartbeating (after the live window, placement sends no new agents here) → the host
     * refuses new calls with `503 shutting_down` + `Retry-After` on the ingress, which keeps listening, drains
     * in-flight ones (bounded), hibernates its VMs, lets the driver release what it holds and flushes its event
     * log → the meter closes the open segments (reason shutdown) and ships what it can (the spool keeps the rest)
     * → pooled agent connections close → the ingress stops listening and connections still open (streams past the
     * drain) are cut → the database closes.
     */
    stop() {
      stopped ??= (async () => {
        await heartbeat.stop();
        await runtime.stop(); // hibernating closes the WebSockets still open with 1001
        const closing = new Promise<void>((done) => server.close(() => done()));
        server.closeAllConnections();
        await closing;
        identity.release();
        if (!parts.database) await database.close();
      })();
      return stopped;
    },
  };
}

function listen(
  fetch: (req: Request) => Response | Promise<Response>,
  upgrades: IngressUpgrade,
  port: number,
  hostname: string,
  limits: IngressLimits,
  log: Logger,
): Promise<{ server: Server; port: number }> {
  return new Promise((resolvePromise, reject) => {
    const server = serve({ fetch, port, hostname }, (info: AddressInfo) => resolvePromise({ server, port: info.port })) as Server;
    server.once("error", reject);
    // The head deadline and the body floor of the gateway's clients (lib/node-conn-policy.ts). Forwarded agent
    // traffic is left to the gateway in front (it holds the client to the floor; what it relays may come in bursts).
    const policy = createConnPolicy({ ...limits, maxConnectionsPerIp: 0, maxConnections: 0 }, log);
    policy.attach(server);
    const hostOpRule: BodyRule = { totalMs: limits.bodyTimeoutMs };
    server.prependListener("request", (req, res) => {
      const path = (req.url ?? "/").split("?")[0];
      if (path !== hostOpPaths.forward) policy.watchBody(req, res, hostOpRule);
    });
    // What Node's parser refuses, in the envelope (Node's own answers are plain text).
    server.on("clientError", (err: Error & { code?: string }, socket: Duplex) => {
      if (err.code === "ECONNRESET" || !socket.writable) return void socket.destroy();
      const requestId = newId("request");
      if (err.code === "ERR_HTTP_REQUEST_TIMEOUT") log.info("request head too slow: connection closed", { requestId, limitMs: limits.headTimeoutMs });
      const appErr =
        err.code === "ERR_HTTP_REQUEST_TIMEOUT"
          ? new AppError("request_timeout", `the request head did not arrive within ${limits.headTimeoutMs} ms`)
          : err.code === "HPE_HEADER_OVERFLOW"
            ? new AppError("headers_too_large", "request headers too large")
            : new AppError("bad_request", `malformed request (${err.code ?? "parse error"})`);
      socket.end(errorResponseText(appErr, requestId));
    });
    // WebSockets from gateways without a direct path to the VMs (`/v1/websocket`).
    server.on("upgrade", (req, socket, head: Buffer) => upgrades.handle(req, socket, head));
    // No total request timeout: long streams are bounded by idle rules, not by the server.
    server.requestTimeout = 0;
  });
}

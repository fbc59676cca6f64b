// The standalone fleet-agent daemon (`npm run fleet-agent`): one per host; registers and heartbeats in Postgres, serves the ingress gateways call.
import { mkdirSync } from "node:fs";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { totalmem } from "node:os";
import { resolve } from "node:path";
import { serve } from "@hono/node-server";
import { systemClock, type Clock } from "../lib/clock.ts";
import { AppError } from "../lib/errors.ts";
import { int, optStr, str, type Env } from "../lib/env.ts";
import { componentKey } from "../lib/host-token.ts";
import type { Logger } from "../lib/log.ts";
import { openDatabase, parseDatabaseAppRole, parseDbTimeouts, type Database, type DbTimeouts } from "../schema/db.ts";
import { databaseCheck } from "../schema/db-errors.ts";
import { parseFleetAgentConfig, type FleetAgentConfig } from "../fleet-agent/config.ts";
import type { VmDriver } from "../fleet-agent/drivers/driver.ts";
import type { Host } from "../fleet-agent/host.ts";
import { createIngress, createIngressUpgrade, type IngressUpgrade } from "../fleet-agent/ingress.ts";
import { claimHost, registerHost, resolveHostId, startHeartbeat, startHostRuntime } from "../fleet-agent/assemble.ts";
import { openHostIdentity, type HostIdentity } from "../fleet-agent/host-identity.ts";
import { HttpSink } from "../fleet-agent/meter/index.ts";
import { billingSink } from "../billing/sink.ts";
import { readArtifact } from "../images/build/store.ts";
import { parseMetricsToken, processMetrics } from "./metrics.ts";
import { clientHeadersTimeoutMs } from "../gateway/config.ts";
import { createConnPolicy, defaultClientLimits, type BodyRule, type ConnPolicyConfig } from "../lib/node-conn-policy.ts";
import { parseClientLimits } from "./client-limits.ts";
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

/**
 * | variable | default | meaning |
 * | DATABASE_URL | (required) | the Postgres all gateways and hosts share |
 * | DB_CONNECT_TIMEOUT_S | 5 | opening a Postgres connection, s |
 * | DB_STATEMENT_TIMEOUT_MS | 30000 | one statement on the server (`statement_timeout`), ms; 0: none |
 * | DB_IDLE_TIMEOUT_S | 60 | an idle pooled connection is closed after this long, s; 0: never |
 * | DB_RECONNECT_MAX_MS | 500 | longest wait between connection attempts while Postgres is down, ms (the event-log spool replays within ~2 s of its return) |
 * | DATABASE_APP_ROLE | agentvm_app | the role every pooled connection runs as (no UPDATE/DELETE on audit_log); migrations run as the URL's user; empty: the URL's user for everything |
 * | COMPONENT_SECRET | (required, ≥ 32 chars) | the secret gateways sign host calls with |
 * | DATA_DIR | .data | VM state (snapshots), the persistent host id, the host's secret (`hosts/<id>/host-secret`, made at the first start: the hosts row is this directory's only) and its lock (`hosts/<id>/host.lock`: one process per directory) |
 * | INGRESS_PORT | 8090 | port of the host ingress |
 * | BIND_ADDRESS | 127.0.0.1 | address the ingress listens on |
 * | PUBLIC_URL | http://<BIND_ADDRESS>:<port> | the ingress URL gateways reach this host at |
 * | HOST_CAPACITY_MIB | the machine's memory | memory offered to awake agents, MiB |
 * | HEARTBEAT_INTERVAL_MS | 10000 | how often the host row's heartbeat is refreshed (with the host's clock skew and load) |
 * | MAX_CLOCK_SKEW_MS | 2000 | largest difference between this host's clock and the database's, ms; past it each heartbeat logs an error, and gateways (their own MAX_CLOCK_SKEW_MS) place no new agents here |
 * | BILLING_URL | (unset: segments go straight into the shared database) | gateway base URL meter segments are shipped to |
 * | LOG_LEVEL | info | debug, info, warn or error |
 * plus METRICS_TOKEN (compose/metrics.ts), CLIENT_HEADERS_TIMEOUT_MS, CLIENT_BODY_MIN_BYTES, CLIENT_BODY_WINDOW_MS and CLIENT_BODY_TIMEOUT_MS for the ingress (as on the gateway: gateway/config.ts, compose/node-gateway.ts), and the fleet-agent variables of fleet-agent/config.ts (HOST_ID, DRIVER, WAKE_*, REAPER_INTERVAL_MS, …).
 */
export function parseDaemonConfig(env: Env): FleetAgentDaemonConfig {
  const databaseUrl = optStr(env, "DATABASE_URL");
  if (!databaseUrl) throw new AppError("bad_request", "configuration: DATABASE_URL is required (the Postgres that gateways and hosts share)");
  const componentSecret = optStr(env, "COMPONENT_SECRET");
  if (!componentSecret) throw new AppError("bad_request", "configuration: COMPONENT_SECRET is required (the secret gateways sign host calls with)");
  componentKey(componentSecret); // fails early when too short
  return {
    fleet: parseFleetAgentConfig(env),
    dataDir: resolve(str(env, "DATA_DIR", ".data")),
    databaseUrl,
    dbTimeouts: parseDbTimeouts(env),
    dbAppRole: parseDatabaseAppRole(env),
    port: int(env, "INGRESS_PORT", 8090, { min: 0, max: 65535 }),
    hostname: str(env, "BIND_ADDRESS", "127.0.0.1"),
    publicUrl: optStr(env, "PUBLIC_URL"),
    componentSecret,
    capacityMiB: int(env, "HOST_CAPACITY_MIB", Math.floor(totalmem() / 1024 / 1024), { min: 64 }),
    heartbeatIntervalMs: int(env, "HEARTBEAT_INTERVAL_MS", 10_000, { min: 100 }),
    maxClockSkewMs: int(env, "MAX_CLOCK_SKEW_MS", defaultMaxClockSkewMs, { min: 0 }),
    billingUrl: optStr(env, "BILLING_URL"),
    metricsToken: parseMetricsToken(env),
    ingressLimits: ingressLimitsOf({ ...parseClientLimits(env), headTimeoutMs: clientHeadersTimeoutMs(env) }),
  };
}

/** How far a host's clock may be from the database's, ms (MAX_CLOCK_SKEW_MS; the gateways' placement has the same default). */
export const defaultMaxClockSkewMs = 2000;

const ingressLimitsOf = (l: IngressLimits): IngressLimits => ({ headTimeoutMs: l.headTimeoutMs, bodyMinBytes: l.bodyMinBytes, bodyWindowMs: l.bodyWindowMs, bodyTimeoutMs: l.bodyTimeoutMs });

export interface FleetAgentParts {
  log: Logger;
  /** The VM driver (the edge selects it from DRIVER). */
  driver: VmDriver;
  clock?: Clock;
  /** An already open database (tests); closed by its owner. */
  database?: Database;
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
  const database = parts.database ?? (await openDatabase({ url: cfg.databaseUrl, timeouts: cfg.dbTimeouts, ...(cfg.dbAppRole !== undefined ? { appRole: cfg.dbAppRole } : {}) }));
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
  const sink = cfg.billingUrl
    ? new HttpSink({ billingUrl: cfg.billingUrl, hostId, key: componentKey(cfg.componentSecret) })
    : billingSink(database.db, clock, hostLog.child({ component: "billing" }));
  const { metrics, endpoint: metricsEndpoint } = processMetrics(cfg.metricsToken);
  let runtime;
  try {
    runtime = await startHostRuntime({ cfg: cfg.fleet, hostId, dataDir: cfg.dataDir, db: database.db, driver, sink, images: (digest) => readArtifact(cfg.dataDir, digest), clock, log: hostLog, metrics });
  } catch (err) {
    identity.release();
    if (!parts.database) await database.close();
    throw err;
  }
  const { host, fleet } = runtime;
  const ingressDeps = { hostId, key: componentKey(cfg.componentSecret), fleet, log: hostLog.child({ component: "ingress" }), readiness: { database: databaseCheck(database.db) }, metrics: metricsEndpoint };
  const app = createIngress(ingressDeps);
  const upgrades = createIngressUpgrade(ingressDeps);
  let listening;
  try {
    listening = await listen(app.fetch, upgrades, cfg.port, cfg.hostname, cfg.ingressLimits ?? ingressLimitsOf(defaultClientLimits), hostLog.child({ component: "ingress" }));
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
    afterBeat: () => host.afterHeartbeat(),
    onLost: () => hostLog.error(`host ${hostId}: this process no longer owns its row; gateways do not reach it any more. Stop it (its agents belong to the other process now)`),
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

function listen(fetch: (req: Request) => Response | Promise<Response>, upgrades: IngressUpgrade, port: number, hostname: string, limits: IngressLimits, log: Logger): Promise<{ server: Server; port: number }> {
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

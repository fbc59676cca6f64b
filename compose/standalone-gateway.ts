// `npm run gateway`: a standalone Node gateway over Postgres that reaches fleet-agents on other processes or machines over HTTP.
import type { Hono } from "hono";
import type { GatewayEnv } from "../contracts/caller.ts";
import { systemClock, type Clock } from "../lib/clock.ts";
import { AppError } from "../lib/errors.ts";
import { int, optStr, str, type Env } from "../lib/env.ts";
import { componentKey } from "../lib/host-token.ts";
import type { Logger } from "../lib/log.ts";
import { openDatabase, parseDatabaseAppRole, parseDbTimeouts, type Database, type DbTimeouts } from "../schema/db.ts";
import { createDbPlacement, expireHostLeases } from "../gateway/placement.ts";
import { createFetchProbe } from "../gateway/host-probe.ts";
import { createNodeRemoteFleet } from "../gateway/node/remote-fleet.ts";
import { parseNodeGatewayConfig, startNodeGateway, type NodeGatewayConfig } from "./node-gateway.ts";

export interface StandaloneGatewayConfig extends NodeGatewayConfig {
  databaseUrl: string;
  /** Connect, statement and idle timeouts of the Postgres client (schema/postgres.ts). */
  dbTimeouts: DbTimeouts;
  /** DATABASE_APP_ROLE: the role queries run as ('' = the URL's user; absent: agentvm_app; schema/postgres.ts). */
  dbAppRole?: string;
  /** maxClockSkewMs: a host whose last heartbeat reported a clock further than this from the database's gets no new agents (MAX_CLOCK_SKEW_MS). */
  placement: { liveWindowMs: number; cacheTtlMs: number; maxClockSkewMs: number };
  hosts: { connectTimeoutMs: number; headersTimeoutMs: number };
  /** How long shutdown lets calls in flight finish. */
  drainTimeoutMs: number;
}

/**
 * | variable | default | meaning |
 * | DATABASE_URL | (required) | the Postgres all gateways and hosts share |
 * | DB_CONNECT_TIMEOUT_S | 5 | opening a Postgres connection, s; past it a call that needs the database gets 503 database_unavailable |
 * | DB_STATEMENT_TIMEOUT_MS | 30000 | one statement on the server (`statement_timeout`), ms; 0: none |
 * | DB_IDLE_TIMEOUT_S | 60 | an idle pooled connection is closed after this long, s; 0: never |
 * | DB_RECONNECT_MAX_MS | 500 | longest wait between connection attempts while Postgres is down, ms |
 * | DATABASE_APP_ROLE | agentvm_app | the role every pooled connection runs as (no UPDATE/DELETE on audit_log); migrations run as the URL's user; empty: the URL's user for everything |
 * | COMPONENT_SECRET | (required, ≥ 32 chars) | signs every call to a host (the hosts have the same secret) |
 * | PORT | 8080 | port of the gateway |
 * | BIND_ADDRESS | 127.0.0.1 | address it listens on |
 * | DATA_DIR | .data | the signing key's default place (`<DATA_DIR>/keys/dev-signing-key.json`) |
 * | SIGNING_KEY_FILE | <DATA_DIR>/keys/dev-signing-key.json | the private key user tokens are verified with when no JWKS_URL, JWKS_JSON or JWKS_FILE is set (made at the first start; gateways starting at once agree on one): give every gateway and `npm run token` the same file and a token minted once is accepted by all |
 * | JWKS_FILE | (unset) | a JWKS document (public keys) user tokens are verified with, read at start: for gateways that only verify |
 * | AGENT_IMAGES | demo | images agents may be created with (what the hosts' drivers run), comma-separated |
 * | HOST_LIVE_WINDOW_MS | 30000 | a host without a heartbeat for this long gets no new agents |
 * | MAX_CLOCK_SKEW_MS | 2000 | a host whose clock (reported with each heartbeat) is further than this from the database's gets no new agents, ms; hosts log it on every heartbeat |
 * | PLACEMENT_CACHE_MS | 2000 | how long an agent → host answer is reused (while Postgres is down: the last one, however old) |
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
  return {
    ...parseNodeGatewayConfig(env, images),
    databaseUrl,
    dbTimeouts: parseDbTimeouts(env),
    dbAppRole: parseDatabaseAppRole(env),
    placement: {
      liveWindowMs: int(env, "HOST_LIVE_WINDOW_MS", 30_000, { min: 1000 }),
      cacheTtlMs: int(env, "PLACEMENT_CACHE_MS", 2000, { min: 0 }),
      maxClockSkewMs: int(env, "MAX_CLOCK_SKEW_MS", 2000, { min: 0 }),
    },
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
  const database = parts.database ?? (await openDatabase({ url: cfg.databaseUrl, timeouts: cfg.dbTimeouts, ...(cfg.dbAppRole !== undefined ? { appRole: cfg.dbAppRole } : {}) }));
  const { db } = database;
  const moves = log.child({ component: "placement" });
  const placement = createDbPlacement(db, {
    ...cfg.placement,
    clock,
    // A host counts for new agents only while this gateway reaches its ingress (its /healthz answers with its id).
    probe: createFetchProbe({ timeoutMs: Math.min(cfg.hosts.connectTimeoutMs, 2000) }),
    onMove: (m) => moves.warn(m.reason === "drain" ? "agent moved off a draining host" : "agent moved off a host whose lease ended", { ...m }),
  });
  // Calls and WebSockets go to the agent's host, which wakes the agent and relays the frames; this gateway joins bytes.
  const fleet = createNodeRemoteFleet({ placement, key: cfg.componentKey, log: log.child({ component: "remote-fleet" }), ...cfg.hosts });
  let gateway;
  try {
    gateway = await startNodeGateway(cfg, { db, fleet, log, clock, hostHealth: { liveWindowMs: cfg.placement.liveWindowMs, maxClockSkewMs: cfg.placement.maxClockSkewMs } });
  } catch (err) {
    await fleet.close();
    if (!parts.database) await database.close();
    throw err;
  }
  // Rows of hosts whose lease ended: their awake agents are stopped and their open runs end at the last heartbeat, a few
  // times per live window (every gateway may do it; it is idempotent). A failed pass is logged and tried at the next.
  const leaseLog = log.child({ component: "leases" });
  const leases = setInterval(() => {
    expireHostLeases(db, cfg.placement.liveWindowMs)
      .then((r) => (r.agents > 0 || r.runs > 0 ? leaseLog.warn("a host's lease ended: its awake agents' rows stopped, its open runs ended at its last heartbeat", r) : undefined))
      .catch((err: unknown) => leaseLog.warn("lease expiry pass failed", { err: err instanceof Error ? err.message : String(err) }));
  }, Math.max(1000, Math.floor(cfg.placement.liveWindowMs / 3)));
  leases.unref();
  let stopped: Promise<void> | undefined;
  return {
    url: gateway.url,
    port: gateway.port,
    app: gateway.app,
    database,
    stop() {
      stopped ??= (async () => {
        clearInterval(leases);
        // Streams may run for hours: they get DRAIN_TIMEOUT_MS, then their connections are cut.
        const grace = () => new Promise<void>((done) => setTimeout(done, cfg.drainTimeoutMs).unref());
        await gateway.stop({ drain: (callsDone) => Promise.race([callsDone, grace()]), afterCut: () => fleet.close() });
        if (!parts.database) await database.close();
      })();
      return stopped;
    },
  };
}

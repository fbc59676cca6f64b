// `npm run gateway`: a standalone Node gateway over Postgres that reaches fleet-agents on other processes or machines over HTTP.
import type { Hono } from "hono";
import type { GatewayEnv } from "../contracts/caller.ts";
import { systemClock, type Clock } from "../lib/clock.ts";
import { z } from "zod";
import { parseEnv, required, type Env } from "../lib/env.ts";
import { shutdownEnv } from "../lib/shared-env.ts";
import type { Logger } from "../lib/log.ts";
import { databaseEnv, dbTimeoutsOf, openDatabase, type Database, type DbTimeouts } from "../schema/db.ts";
import { createDbPlacement, expireHostLeases } from "../gateway/placement.ts";
import { createFetchProbe } from "../gateway/host-probe.ts";
import { createNodeRemoteFleet } from "../gateway/node/remote-fleet.ts";
import { nodeGatewayConfigOf, nodeGatewayProgramEnv, startNodeGateway, type NodeGatewayConfig } from "./node-gateway.ts";
import { clockSkewEnv, componentEnv, logLevelEnv, placementEnv, remoteHostsEnv } from "./config/shared.ts";
import { artifactStoreEnv } from "../fleet-agent/artifacts/config.ts";
import { createNodeImageBuilder } from "../images/node-builder.ts";
import { imageRunners, microVmHostLive } from "../images/vm-build/index.ts";
import { builderPorts } from "../gateway/agents/builder-agent.ts";
import { composeHostImages } from "./host-images.ts";

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
  /** The shared artifact store: with one, this gateway builds images (`POST /v1/images`) and puts them there for the hosts. */
  artifactStoreDir: string | undefined;
}

/** `npm run gateway`'s variables: a Node gateway's (compose/node-gateway.ts) over the shared Postgres, in front of hosts elsewhere. */
export const standaloneGatewayEnv = z.object({
  ...logLevelEnv.shape,
  ...nodeGatewayProgramEnv.shape,
  COMPONENT_SECRET: required(componentEnv.shape.COMPONENT_SECRET, "it signs every call to a host"),
  ...databaseEnv.omit({ DB_MAX_CONNECTIONS: true }).shape,
  DATABASE_URL: required(databaseEnv.shape.DATABASE_URL, "the Postgres that gateways and hosts share"),
  ...placementEnv.shape,
  ...clockSkewEnv.shape,
  ...remoteHostsEnv.shape,
  ...shutdownEnv.shape,
  ...artifactStoreEnv.pick({ ARTIFACT_STORE_DIR: true }).shape,
});

export type StandaloneGatewaySettings = z.output<typeof standaloneGatewayEnv>;

export function standaloneGatewayConfigOf(v: StandaloneGatewaySettings): StandaloneGatewayConfig {
  return {
    ...nodeGatewayConfigOf(v, v.AGENT_IMAGES),
    databaseUrl: v.DATABASE_URL,
    dbTimeouts: dbTimeoutsOf(v),
    dbAppRole: v.DATABASE_APP_ROLE,
    placement: { liveWindowMs: v.HOST_LIVE_WINDOW_MS, cacheTtlMs: v.PLACEMENT_CACHE_MS, maxClockSkewMs: v.MAX_CLOCK_SKEW_MS },
    hosts: { connectTimeoutMs: v.HOST_CONNECT_TIMEOUT_MS, headersTimeoutMs: v.HOST_HEADERS_TIMEOUT_MS },
    drainTimeoutMs: v.DRAIN_TIMEOUT_MS,
    artifactStoreDir: v.ARTIFACT_STORE_DIR,
  };
}

export function parseStandaloneGatewayConfig(env: Env): StandaloneGatewayConfig {
  return standaloneGatewayConfigOf(parseEnv(standaloneGatewayEnv, env));
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
  const database =
    parts.database ??
    (await openDatabase({ url: cfg.databaseUrl, timeouts: cfg.dbTimeouts, ...(cfg.dbAppRole !== undefined ? { appRole: cfg.dbAppRole } : {}) }));
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
  // With a shared store this gateway builds images: each goes into the store before its row exists, and the host an agent
  // of it lands on fetches it from there (without a store a host could not: `POST /v1/images` is then refused).
  const imageBuilder = cfg.artifactStoreDir
    ? (() => {
        const images = composeHostImages({
          dataDir: cfg.dataDir,
          artifacts: { storeDir: cfg.artifactStoreDir, imageCacheMaxBytes: Number.POSITIVE_INFINITY },
          db,
          log: log.child({ component: "images" }),
        });
        return createNodeImageBuilder({
          dataDir: cfg.dataDir,
          cacheDir: cfg.imageCacheDir,
          clock,
          log: log.child({ component: "images" }),
          publish: (artifact) => images.publish(artifact),
          ...imageRunners(cfg, {
            ports: builderPorts(db, fleet),
            dataDir: cfg.dataDir,
            publish: (artifact) => images.publish(artifact),
            microVms: () => microVmHostLive(db),
          }),
        });
      })()
    : undefined;
  let gateway;
  try {
    gateway = await startNodeGateway(cfg, {
      db,
      fleet,
      log,
      clock,
      ...(imageBuilder ? { imageBuilder } : {}),
      hostHealth: { liveWindowMs: cfg.placement.liveWindowMs, maxClockSkewMs: cfg.placement.maxClockSkewMs },
    });
  } catch (err) {
    await fleet.close();
    if (!parts.database) await database.close();
    throw err;
  }
  // Rows of hosts whose lease ended: their awake agents are stopped and their open runs end at the last heartbeat, a few
  // times per live window (every gateway may do it; it is idempotent). A failed pass is logged and tried at the next.
  const leaseLog = log.child({ component: "leases" });
  const leases = setInterval(
    () => {
      expireHostLeases(db, cfg.placement.liveWindowMs)
        .then((r) =>
          r.agents > 0 || r.runs > 0
            ? leaseLog.warn("a host's lease ended: its awake agents' rows stopped, its open runs ended at its last heartbeat", r)
            : undefined,
        )
        .catch((err: unknown) => leaseLog.warn("lease expiry pass failed", { err: err instanceof Error ? err.message : String(err) }));
    },
    Math.max(1000, Math.floor(cfg.placement.liveWindowMs / 3)),
  );
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

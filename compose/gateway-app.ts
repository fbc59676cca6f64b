// The gateway app with everything it mounts (webhooks, billing) over one database and fleet: the wiring Node and Workers share.
import type { Hono } from "hono";
import type { GatewayEnv } from "../contracts/caller.ts";
import type { Fleet } from "../contracts/fleet.ts";
import type { Clock } from "../lib/clock.ts";
import type { Logger } from "../lib/log.ts";
import type { Metrics } from "../lib/metrics.ts";
import { createDbAuditLog, createDbAuditReader } from "../schema/audit-log.ts";
import { databaseCheck } from "../schema/db-errors.ts";
import type { Db } from "../schema/db.ts";
import { createBillingRoutes } from "../billing/routes.ts";
import { createGateway, type GatewayConfig, type GatewayDeps } from "../gateway/app.ts";
import { createAgentRepo, type AgentRepo } from "../gateway/agents/repo.ts";
import { createCheckpointRepo } from "../gateway/checkpoints/repo.ts";
import { createPoolKeeper, type PoolKeeper } from "../gateway/pools/keeper.ts";
import { createPoolStore } from "../gateway/pools/store.ts";
import { createDesktopSessionStore } from "../gateway/desktop/session-store.ts";
import type { Authenticator } from "../gateway/auth.ts";
import { createAgentSettingsStore } from "../gateway/proxy/agents.ts";
import { createProxyCore, defaultProxyConfig, type ProxyCore } from "../gateway/proxy/core.ts";
import { createDbWebhookStore, createWebhookRoutes, fleetForward, type WebhookConfig, type WebhookDeps } from "../gateway/webhooks/index.ts";
import { createTenantGate, defaultTenantGateConfig, type TenantGate } from "../gateway/tenants/gate.ts";
import { createTenantRoutes } from "../gateway/tenants/routes.ts";
import { createTenantStore } from "../gateway/tenants/store.ts";
import { createHostRepo } from "../gateway/hosts/repo.ts";
import { defaultHostHealth, hostRoutes } from "../gateway/hosts/routes.ts";
import { createImageRepo } from "../images/repo.ts";
import { createImageRoutes } from "../images/routes.ts";
import type { ImageBuilder } from "../images/builds.ts";
import { createUpstreamStore } from "../gateway/upstreams/store.ts";
import { upstreamRoutes } from "../gateway/upstreams/routes.ts";
import { createOperationRepo } from "../gateway/operations/repo.ts";
import { operationRoutes } from "../gateway/operations/routes.ts";
import { importSealKey } from "../lib/seal.ts";

export interface GatewayAppDeps {
  db: Db;
  fleet: Fleet;
  auth: Authenticator;
  log: Logger;
  clock: Clock;
  config: GatewayConfig;
  webhooks: WebhookConfig;
  /** `componentKey(COMPONENT_SECRET)`: what hosts sign their meter shipments with. */
  componentKey: Uint8Array;
  clientIp?: GatewayDeps["clientIp"];
  /** Builds images (Node, beside the hosts that run them); without it the image routes list and delete only. */
  imageBuilder?: ImageBuilder;
  /** Largest image upload (build context or archive), bytes. */
  maxImageUploadBytes?: number;
  /** Where the proxy counts its calls (compose/metrics.ts); none: nowhere. */
  metrics?: Metrics;
  /** A webhook delivery was stored: attempt it soon (Node kicks its delivery worker; a Worker runs one after the answer). */
  onWebhookQueued: () => void;
  /** What `GET /v1/hosts` judges a host's health by (HOST_LIVE_WINDOW_MS and the allowed clock skew, ms); none: `defaultHostHealth`. */
  hostHealth?: { liveWindowMs: number; maxClockSkewMs: number };
  /** The 32-byte key upstreams' secret headers are sealed with (compose/upstream-key.ts); none: the upstream routes answer 501. */
  upstreamKey?: Uint8Array;
  /** Work that outlives a request (pools' top-ups, woken agents): a Worker keeps the request alive for it; none: it just runs. */
  background?: (work: Promise<unknown>) => void;
}

export interface GatewayApp {
  app: Hono<GatewayEnv>;
  /** The proxy's shared state (agent cache, tenant limiter), for a Node fast path beside the app. */
  proxy: ProxyCore;
  agents: AgentRepo;
  /** Tenant statuses this gateway checks (cached; changes through it apply here at once). */
  tenants: TenantGate;
  /** What a delivery worker of this gateway is built from. */
  webhookDeps: WebhookDeps;
  /** Warm pools: a Node program starts their top-up (`start`) and stops it at shutdown. */
  pools: PoolKeeper;
}

/** IMAGE_MAX_UPLOAD_BYTES's default: 4 GiB. */
export const defaultMaxImageUploadBytes = 4 * 1024 ** 3;

export function assembleGatewayApp(deps: GatewayAppDeps): GatewayApp {
  const { db, fleet, clock, log } = deps;
  const agents = createAgentRepo(db);
  const settings = createAgentSettingsStore(db);
  const gatewayLog = log.child({ component: "gateway" });
  // One audit log for the admin API and the webhook module (its rows written in the transaction of their change).
  const audit = createDbAuditLog(db);
  const tenantStore = createTenantStore(db);
  const tenants = createTenantGate({ store: tenantStore, audit, log: gatewayLog, config: deps.config.tenants ?? defaultTenantGateConfig });
  const proxy = createProxyCore({
    agents,
    settings,
    fleet,
    log: gatewayLog,
    maxBodyBytes: deps.config.maxBodyBytes,
    proxy: deps.config.proxy ?? defaultProxyConfig,
    metrics: deps.metrics,
    tenants,
  });
  // `db` too: the delivery worker counts its queue there when scraped.
  const webhookDeps: WebhookDeps = {
    store: createDbWebhookStore(db, audit),
    db,
    clock,
    log: log.child({ component: "webhooks" }),
    forward: fleetForward(agents, fleet, tenants),
    config: deps.webhooks,
  };
  const billing = createBillingRoutes({
    db,
    clock,
    log: log.child({ component: "billing" }),
    componentKey: deps.componentKey,
    ...(deps.metrics ? { metrics: deps.metrics } : {}),
  });
  const imageRepo = createImageRepo(db);
  const images = createImageRoutes({
    repo: imageRepo,
    ...(deps.imageBuilder ? { builder: deps.imageBuilder } : {}),
    audit,
    log: log.child({ component: "images" }),
    maxUploadBytes: deps.maxImageUploadBytes ?? defaultMaxImageUploadBytes,
  });
  const tenantRoutes = createTenantRoutes({
    store: tenantStore,
    gate: tenants,
    agents,
    fleet,
    audit,
    log: gatewayLog,
    invalidateAgent: (id) => proxy.invalidate(id),
    maxBodyBytes: deps.config.maxApiBodyBytes,
  });
  const upstreamKey = deps.upstreamKey;
  let sealKey: Promise<CryptoKey> | undefined;
  const upstreams = upstreamRoutes({
    store: upstreamKey ? createUpstreamStore(db, audit, () => (sealKey ??= importSealKey(upstreamKey))) : undefined,
    clock,
  });
  const operations = operationRoutes({ agents, operations: createOperationRepo(db) });
  const checkpoints = createCheckpointRepo(db);
  const pools = createPoolKeeper({
    store: createPoolStore(db),
    agents,
    checkpoints,
    fleet,
    log: log.child({ component: "pools" }),
    ...(deps.background ? { background: deps.background } : {}),
  });
  const health = deps.hostHealth ?? defaultHostHealth;
  const hosts = hostRoutes({ hosts: createHostRepo(db, { liveWindowMs: health.liveWindowMs }), audit, clock, maxClockSkewMs: health.maxClockSkewMs });
  const app = createGateway({
    agents,
    fleet,
    audit,
    auditReader: createDbAuditReader(db),
    auth: deps.auth,
    log: gatewayLog,
    config: deps.config,
    ...(deps.clientIp ? { clientIp: deps.clientIp } : {}),
    routes: [createWebhookRoutes(webhookDeps, { onQueued: deps.onWebhookQueued }), billing, images, tenantRoutes, hosts, upstreams, operations],
    imageCatalog: imageRepo,
    checkpoints,
    pools,
    desktopSessions: createDesktopSessionStore(db),
    settings,
    proxy,
    readiness: { database: databaseCheck(db) },
    tenants,
    ...(deps.metrics ? { metrics: deps.metrics } : {}),
  });
  return { app, proxy, agents, tenants, webhookDeps, pools };
}

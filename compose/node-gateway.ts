// The one Node gateway: the shared app, the fast path beside it, the webhook worker, on one node:http server; `npm start` and `npm run gateway` both run it.
import type { BuilderSize } from "../contracts/image.ts";
import type { ImageBuildsMode } from "../images/vm-build/index.ts";
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join, resolve } from "node:path";
import type { JSONWebKeySet, JWK } from "jose";
import type { Hono } from "hono";
import type { GatewayEnv } from "../contracts/caller.ts";
import type { Clock } from "../lib/clock.ts";
import { AppError } from "../lib/errors.ts";
import { z } from "zod";
import { vars } from "../lib/env.ts";
import { upstreamEnv } from "../lib/shared-env.ts";
import { componentKey } from "../lib/host-token.ts";
import type { Logger } from "../lib/log.ts";
import type { Db } from "../schema/db.ts";
import type { GatewayConfig } from "../gateway/app.ts";
import { createJwtAuthenticator, type Authenticator } from "../gateway/auth.ts";
import { gatewayConfigOf, gatewayEnv, proxyLimitsEnv, type GatewayAuthConfig } from "../gateway/config.ts";
import type { ProxyCore } from "../gateway/proxy/core.ts";
import { defaultProxyConfig } from "../gateway/proxy/core.ts";
import { createDeliveryWorker, type DeliveryWorker, type WebhookConfig } from "../gateway/webhooks/index.ts";
import { webhookConfigOf, webhookEnv } from "../gateway/webhooks/config.ts";
import { createNodeProxy } from "../gateway/node/fast-path/handler.ts";
import { dashboardRoutes } from "../gateway/node/dashboard.ts";
import type { NodeFleet } from "../gateway/node/fleet.ts";
import { nodeClientIp, serveNode, type NodeServer } from "../gateway/node/serve.ts";
import type { ClientLimits } from "../lib/node-conn-policy.ts";
import { clientLimitsEnv, clientLimitsOf } from "./client-limits.ts";
import { componentEnv, processEnv, upstreamKeyEnv } from "./config/shared.ts";
import { devKeyPath, ensureSigningKey, type DevKeys } from "./dev-keys.ts";
import { assembleGatewayApp, defaultMaxImageUploadBytes } from "./gateway-app.ts";
import { ensureUpstreamKey, upstreamKeyPath } from "./upstream-key.ts";
import type { ImageBuilder } from "../images/builds.ts";
import { metricsEnv, processMetrics, type ProcessMetrics } from "./metrics.ts";

export interface NodeGatewayConfig {
  port: number;
  hostname: string;
  /** The data directory (the signing key's default place, `<dataDir>/keys/dev-signing-key.json`). */
  dataDir: string;
  /**
   * SIGNING_KEY_FILE: the private key user tokens are verified with when no JWKS is configured (made there at the
   * first start), which `npm run token` / `agentvm token` mint with. Gateways that share it accept the same tokens.
   * Unset: `<dataDir>/keys/dev-signing-key.json`.
   */
  signingKeyFile?: string;
  /** UPSTREAM_KEY_FILE: the key upstreams' secret headers are sealed with (compose/upstream-key.ts). Unset: `<dataDir>/keys/upstream-key`. */
  upstreamKeyFile?: string;
  /** JWKS_FILE: a JWKS document (public keys only) user tokens are verified with, read at start; after JWKS_URL and JWKS_JSON. */
  jwksFile?: string;
  gateway: GatewayConfig;
  auth: GatewayAuthConfig;
  webhooks: WebhookConfig;
  /** `componentKey(COMPONENT_SECRET)`: hosts sign meter shipments (and gateways host calls) with it. */
  componentKey: Uint8Array;
  /** Image builds: the Debian bases and buildah's storage live here, outside any clone (IMAGE_CACHE_DIR). */
  imageCacheDir: string;
  /** Where Containerfile builds run and what a builder VM gets (IMAGE_BUILDS, IMAGE_BUILD_TIMEOUT_MS, IMAGE_BUILDER_*). */
  imageBuilds: { mode: ImageBuildsMode; timeoutMs: number; builder: BuilderSize };
  /** Largest image upload, bytes (IMAGE_MAX_UPLOAD_BYTES). */
  maxImageUploadBytes: number;
  /** Bearer token of `GET /metrics` (METRICS_TOKEN, compose/metrics.ts); unset: metrics are off. */
  metricsToken: string | undefined;
  /** Connection bounds and body deadlines (`clientLimitsOf`); the head deadline is CLIENT_HEADERS_TIMEOUT_MS. */
  clients: Omit<ClientLimits, "headTimeoutMs">;
}

/** A builder VM sleeps this long after its last build, ms: a tenant's next build soon after wakes it from its snapshot. */
const builderIdleMs = 60_000;

/** A Node gateway's own variables (beside the shared ones its program schema adds). */
export const nodeGatewayEnv = z.object({
  PORT: vars.int({ fallback: 8080, min: 0, max: 65535, doc: "port of the gateway (0: any free port)" }),
  SIGNING_KEY_FILE: vars.optStr({
    type: "path",
    default: "`DATA_DIR/keys/dev-signing-key.json`",
    doc: "the private ES256 key (a JWK) user tokens are verified with when no `JWKS_URL`, `JWKS_JSON` or `JWKS_FILE` is set; made there at the first start (mode 0600; gateways starting at once agree on one). Point every gateway and `npm run token` at one file (a shared volume) and they accept the same tokens",
  }),
  JWKS_FILE: vars.optStr({
    type: "path",
    default: "(unset)",
    doc: 'a JWKS document (`{"keys":[…]}`, public keys) to verify user tokens with, read at start: for gateways that only verify (after `JWKS_URL` and `JWKS_JSON`)',
  }),
  HOME: vars.optStr({ type: "path", default: "the user's home directory", doc: "where `IMAGE_CACHE_DIR` is by default" }),
  IMAGE_CACHE_DIR: vars.optStr({
    type: "path",
    default: "`$HOME/.cache/agentvm`",
    doc: "where image builds keep the Debian bases and buildah's storage (reused across runs and data directories)",
  }),
  IMAGE_BUILDS: vars.oneOf(["auto", "vm", "host"] as const, {
    fallback: "auto",
    doc: "where a Containerfile's steps run: `vm` in the tenant's builder agent (`image-builder`, a microVM of its own, its egress under the address policy, billed like any agent); `host` buildah on this machine, as root with chroot isolation and the host's network (only for builders you trust); `auto` `vm` whenever agents run in microVMs (the all-in-one: its driver is qemu or firecracker; a gateway over remote hosts: a live one runs them), else `host`",
  }),
  IMAGE_BUILD_TIMEOUT_MS: vars.int({
    fallback: 1_800_000,
    min: 1000,
    unit: "ms",
    default: "1800000 (30 min)",
    doc: "the longest a build's steps may run in its builder VM; past it the build is stopped (`build_failed`)",
  }),
  IMAGE_BUILDER_MEM_MIB: vars.int({ fallback: 1024, min: 256, unit: "MiB", doc: "memory of a tenant's builder VM (a build's memory limit)" }),
  IMAGE_BUILDER_DISK_MIB: vars.int({
    fallback: 8192,
    min: 1024,
    unit: "MiB",
    doc: "disk of a tenant's builder VM: its loaded bases, a build's layers and result (a build's disk limit)",
  }),
  IMAGE_BUILDER_VCPUS: vars.int({ fallback: 1, min: 1, max: 32, unit: "vCPUs", doc: "vCPUs of a tenant's builder VM (a build's CPU limit)" }),
  IMAGE_MAX_UPLOAD_BYTES: vars.int({
    fallback: defaultMaxImageUploadBytes,
    min: 1024,
    unit: "bytes",
    default: "4294967296 (4 GiB)",
    doc: "largest build context or image archive `POST /v1/images` accepts",
  }),
});

/** Every variable a Node gateway reads (the all-in-one and the standalone gateway add theirs). */
export const nodeGatewayProgramEnv = z.object({
  ...processEnv.shape,
  ...componentEnv.shape,
  ...upstreamKeyEnv.shape,
  ...nodeGatewayEnv.shape,
  ...metricsEnv.shape,
  ...clientLimitsEnv.shape,
  ...gatewayEnv.shape,
  ...proxyLimitsEnv.shape,
  ...upstreamEnv.shape,
  ...webhookEnv.shape,
});

export type NodeGatewaySettings = z.output<typeof nodeGatewayProgramEnv>;

/** A Node gateway's config from its program's parsed variables; `images` are those agents may be created with (what the hosts' drivers run). */
export function nodeGatewayConfigOf(v: NodeGatewaySettings, images: readonly string[]): NodeGatewayConfig {
  const { gateway, auth } = gatewayConfigOf(v, images);
  const dataDir = resolve(v.DATA_DIR);
  return {
    port: v.PORT,
    hostname: v.BIND_ADDRESS,
    dataDir,
    signingKeyFile: resolve(v.SIGNING_KEY_FILE ?? devKeyPath(dataDir)),
    upstreamKeyFile: resolve(v.UPSTREAM_KEY_FILE ?? upstreamKeyPath(dataDir)),
    ...(v.JWKS_FILE ? { jwksFile: resolve(v.JWKS_FILE) } : {}),
    gateway,
    auth,
    webhooks: webhookConfigOf(v),
    // Without a secret nothing outside this process can sign a shipment: a random key closes the HTTP route.
    componentKey: v.COMPONENT_SECRET ? componentKey(v.COMPONENT_SECRET) : crypto.getRandomValues(new Uint8Array(32)),
    imageCacheDir: resolve(v.IMAGE_CACHE_DIR ?? join(v.HOME ?? homedir(), ".cache", "agentvm")),
    imageBuilds: {
      mode: v.IMAGE_BUILDS,
      timeoutMs: v.IMAGE_BUILD_TIMEOUT_MS,
      builder: { vcpus: v.IMAGE_BUILDER_VCPUS, memMiB: v.IMAGE_BUILDER_MEM_MIB, diskMiB: v.IMAGE_BUILDER_DISK_MIB, idleTimeoutMs: builderIdleMs },
    },
    maxImageUploadBytes: v.IMAGE_MAX_UPLOAD_BYTES,
    metricsToken: v.METRICS_TOKEN,
    clients: clientLimitsOf(v),
  };
}

export interface NodeGateway {
  url: string;
  port: number;
  app: Hono<GatewayEnv>;
  proxy: ProxyCore;
  server: NodeServer;
  /** The signing key pair (SIGNING_KEY_FILE; tokens of it are accepted when no JWKS is configured). */
  keys: DevKeys;
  /**
   * Shutdown order: new calls are answered `503 shutting_down` + `Retry-After` on a listener that stays open → the
   * webhook worker finishes its attempts (what it leaves is stored and retried after the restart) → `drain` (the
   * caller's: a host in this process lets its calls finish and hibernates its agents; a gateway over remote hosts
   * gives calls a grace period, or less once `callsDone` says none is in flight) → the listener closes → the fast
   * path's sweep and pooled agent connections close → connections still open are cut → `afterCut` (the fleet's own
   * connections close).
   */
  stop(opts: { drain: (callsDone: Promise<void>) => Promise<void>; afterCut?: () => Promise<void> }): Promise<void>;
}

export interface NodeGatewayParts {
  db: Db;
  fleet: NodeFleet;
  log: Logger;
  clock: Clock;
  /** Builds images where this gateway's hosts read them (the all-in-one); none: the image routes only list and delete. */
  imageBuilder?: ImageBuilder;
  /** The process's metrics when a host in it counts into them too (the all-in-one); none: made from `metricsToken`. */
  metrics?: ProcessMetrics;
  /** What `GET /v1/hosts` calls healthy (the placement's live window and clock bound); none: their defaults. */
  hostHealth?: { liveWindowMs: number; maxClockSkewMs: number };
}

/** User tokens are verified against JWKS_URL, JWKS_JSON, JWKS_FILE, or else the signing key's public half (said once at start). */
async function authenticatorFor(
  cfg: GatewayAuthConfig,
  keys: DevKeys,
  files: { signingKeyFile: string; jwksFile: string | undefined },
  log: Logger,
): Promise<Authenticator> {
  const verify = { issuer: cfg.issuer, audience: cfg.audience, algorithms: cfg.algorithms };
  if (cfg.jwksUrl) return createJwtAuthenticator({ keys: { jwksUrl: cfg.jwksUrl }, ...verify });
  if (cfg.jwksJson) return createJwtAuthenticator({ keys: { jwks: JSON.parse(cfg.jwksJson) }, ...verify });
  if (files.jwksFile) {
    const jwks = readJwksFile(files.jwksFile);
    log.info(`accepting tokens of the ${jwks.keys.length} key(s) in JWKS_FILE ${files.jwksFile}`);
    return createJwtAuthenticator({ keys: { jwks }, ...verify });
  }
  log.info(
    `no JWKS_URL, JWKS_JSON or JWKS_FILE: accepting tokens of the signing key ${files.signingKeyFile} (kid ${keys.privateJwk.kid}; mint with npm run token, SIGNING_KEY_FILE=${files.signingKeyFile})`,
  );
  return createJwtAuthenticator({ keys: { jwks: keys.jwks }, ...verify });
}

/** A JWKS document from a file: public keys only (a private key there is a mistake that would spread it). */
export function readJwksFile(path: string): JSONWebKeySet {
  let doc: unknown;
  try {
    doc = JSON.parse(readFileSync(path, "utf8"));
  } catch (err) {
    throw new AppError("bad_request", `configuration: JWKS_FILE ${path} cannot be read as JSON (${err instanceof Error ? err.message : String(err)})`);
  }
  const keys = (doc as { keys?: unknown } | null)?.keys;
  if (!Array.isArray(keys) || keys.length === 0 || !keys.every((k) => typeof k === "object" && k !== null && typeof (k as JWK).kty === "string")) {
    throw new AppError("bad_request", `configuration: JWKS_FILE ${path} must be a JWKS document: {"keys":[…]} with at least one key`);
  }
  if (keys.some((k) => (k as JWK).d !== undefined))
    throw new AppError("bad_request", `configuration: JWKS_FILE ${path} holds a private key; it takes public keys only`);
  return { keys: keys as JWK[] };
}

export async function startNodeGateway(cfg: NodeGatewayConfig, parts: NodeGatewayParts): Promise<NodeGateway> {
  const { db, fleet, log, clock } = parts;
  const { metrics, endpoint: metricsEndpoint } = parts.metrics ?? processMetrics(cfg.metricsToken);
  const signingKeyFile = cfg.signingKeyFile ?? devKeyPath(cfg.dataDir);
  const keys = await ensureSigningKey(signingKeyFile);
  const auth = await authenticatorFor(cfg.auth, keys, { signingKeyFile, jwksFile: cfg.jwksFile }, log);
  const upstreamKey = await ensureUpstreamKey(cfg.upstreamKeyFile ?? upstreamKeyPath(cfg.dataDir));
  let worker: DeliveryWorker | undefined;
  const { app, proxy, webhookDeps, pools } = assembleGatewayApp({
    ...(parts.hostHealth ? { hostHealth: parts.hostHealth } : {}),
    db,
    fleet,
    auth,
    log,
    clock,
    config: cfg.gateway,
    webhooks: cfg.webhooks,
    componentKey: cfg.componentKey,
    upstreamKey,
    ...(parts.imageBuilder ? { imageBuilder: parts.imageBuilder } : {}),
    maxImageUploadBytes: cfg.maxImageUploadBytes,
    clientIp: nodeClientIp,
    metrics,
    // A stored delivery kicks this process's worker, so it is attempted at once, not at the next poll.
    onWebhookQueued: () => worker?.kick(),
  });
  worker = createDeliveryWorker(webhookDeps, { metrics });
  app.route("/", dashboardRoutes()); // the built dashboard at /dashboard/ (`/` redirects there); its API calls carry the token
  const proxyConfig = cfg.gateway.proxy ?? defaultProxyConfig;
  const nodeProxy = createNodeProxy({ core: proxy, fleet, auth, domain: cfg.gateway.domain, log: log.child({ component: "gateway" }) });
  let server: NodeServer;
  try {
    server = await serveNode(app, {
      port: cfg.port,
      hostname: cfg.hostname,
      ...(proxyConfig.fastPath ? { proxy: nodeProxy } : {}),
      rawFront: proxyConfig.rawFront,
      maxHeaderBytes: proxyConfig.maxHeaderBytes,
      clients: { ...cfg.clients, headTimeoutMs: proxyConfig.clientHeadersTimeoutMs },
      domain: cfg.gateway.domain,
      log: log.child({ component: "gateway" }),
      metrics: { endpoint: metricsEndpoint, domain: cfg.gateway.domain },
    });
  } catch (err) {
    nodeProxy.close();
    throw err;
  }
  worker.start();
  pools.start(); // keeps every live pool topped up (what an earlier process left half-made included)
  const url = `http://${cfg.hostname === "0.0.0.0" || cfg.hostname === "::" ? "127.0.0.1" : cfg.hostname}:${server.port}`;

  let stopped: Promise<void> | undefined;
  return {
    url,
    port: server.port,
    app,
    proxy,
    server,
    keys,
    stop(opts) {
      stopped ??= (async () => {
        server.refuseNew();
        await worker.stop();
        await pools.stop();
        await opts.drain(server.idle());
        const closing = server.close();
        nodeProxy.close();
        server.server.closeAllConnections();
        const fleetClosed = opts.afterCut?.();
        await closing;
        await fleetClosed;
      })();
      return stopped;
    },
  };
}

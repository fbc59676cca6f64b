// The Worker's bindings and variables, validated once into a typed config; every problem is named, none crashes the isolate.
import type { JSONWebKeySet } from "jose";
import { z } from "zod";
import { AppError } from "../lib/errors.ts";
import { envDocs, envProblems, envVar, required, vars, type Env } from "../lib/env.ts";
import { parseSealKey } from "../lib/seal.ts";
import { upstreamEnv } from "../lib/shared-env.ts";
import { databaseEnv } from "../schema/postgres.ts";
import type { LogLevel } from "../lib/log.ts";
import { componentKey } from "../lib/host-token.ts";
import type { GatewayConfig } from "../gateway/app.ts";
import { gatewayConfigOf, gatewayEnv, proxyLimitsEnv, type GatewayAuthConfig } from "../gateway/config.ts";
import { webhookConfigOf, webhookEnv } from "../gateway/webhooks/config.ts";
import { clockSkewEnv, componentEnv, logLevelEnv, placementEnv } from "./config/shared.ts";
import type { WebhookConfig } from "../gateway/webhooks/types.ts";

/** What wrangler.toml and `wrangler secret put` give the Worker (values are untrusted until parsed). */
export interface WorkerBindings {
  /** Hyperdrive in front of the shared Postgres. */
  HYPERDRIVE?: { connectionString?: unknown };
  /** Secret shared with the hosts: signs every gateway → host call. */
  COMPONENT_SECRET?: unknown;
  /** Where user tokens' keys come from: a JWKS URL, or the JWKS document itself (secret or var). */
  JWKS_URL?: unknown;
  JWKS_JSON?: unknown;
  GATEWAY_DOMAIN?: unknown;
  [name: string]: unknown;
}

export interface WorkerConfig {
  /** Hyperdrive's connection string (a new postgres.js client per request: Workers share no sockets across requests). */
  connectionString: string;
  componentKey: Uint8Array;
  /** UPSTREAM_KEY; none: the upstream routes answer 501. */
  upstreamKey: Uint8Array | undefined;
  gateway: GatewayConfig;
  auth: Omit<GatewayAuthConfig, "jwksUrl" | "jwksJson">;
  keys: { jwksUrl: string } | { jwks: JSONWebKeySet };
  webhooks: WebhookConfig;
  placement: { liveWindowMs: number; cacheTtlMs: number; maxClockSkewMs: number };
  /** Connections one request's client may open through Hyperdrive. */
  dbMaxConnections: number;
  /** Wall time a cron run spends delivering webhooks before it leaves the rest to the next run. */
  cronBudgetMs: number;
  logLevel: LogLevel;
}

export type ParsedWorkerEnv = { ok: true; config: WorkerConfig } | { ok: false; problems: string[] };

/** The Hyperdrive binding: an object, not a string (every other binding is one). */
const hyperdrive = z.unknown().transform((binding, ctx) => {
  const connectionString = typeof binding === "object" && binding !== null ? (binding as { connectionString?: unknown }).connectionString : undefined;
  if (typeof connectionString === "string" && connectionString !== "") return connectionString;
  ctx.addIssue({ code: "custom", message: "binding is missing (a [[hyperdrive]] binding named HYPERDRIVE in wrangler.toml)" });
  return z.NEVER;
});
envDocs.add(hyperdrive, {
  type: "Hyperdrive binding",
  default: "(required)",
  doc: "the shared Postgres through Hyperdrive (query caching off); a new postgres.js client per request",
});

/** The Worker's own variables. */
export const workerOnlyEnv = z.object({
  HYPERDRIVE: hyperdrive,
  UPSTREAM_KEY: envVar(
    {
      type: "secret (base64url)",
      default: "(unset: the upstream routes answer 501)",
      doc: "the 32-byte key upstreams' secret headers are sealed with: the content of the hosts' `UPSTREAM_KEY_FILE` (`wrangler secret put UPSTREAM_KEY`)",
    },
    (raw, fail) => {
      if (raw === undefined || raw === "") return undefined;
      return parseSealKey(raw) ?? fail("must be 32 bytes written as base64url (the content of UPSTREAM_KEY_FILE)");
    },
  ),
  WEBHOOK_CRON_BUDGET_MS: vars.int({
    fallback: 25_000,
    min: 1000,
    unit: "ms",
    doc: "wall time a cron run spends delivering webhooks before it leaves the rest to the next run",
  }),
});

/** The Worker's bindings and variables (wrangler.toml `[vars]`, `wrangler secret put`): the gateway's, over hosts elsewhere. */
export const workerEnv = z.object({
  ...workerOnlyEnv.shape,
  COMPONENT_SECRET: required(componentEnv.shape.COMPONENT_SECRET, "a secret: wrangler secret put COMPONENT_SECRET; the same value every fleet-agent has"),
  DB_MAX_CONNECTIONS: databaseEnv.shape.DB_MAX_CONNECTIONS,
  ...logLevelEnv.shape,
  ...placementEnv.shape,
  ...clockSkewEnv.shape,
  ...gatewayEnv.shape,
  ...proxyLimitsEnv.shape,
  ...upstreamEnv.shape,
  ...webhookEnv.shape,
});

export type WorkerSettings = z.output<typeof workerEnv>;

export function parseWorkerEnv(bindings: WorkerBindings): ParsedWorkerEnv {
  const parsed = workerEnv.safeParse({ ...stringVars(bindings), HYPERDRIVE: bindings.HYPERDRIVE });
  if (!parsed.success) {
    const problems = envProblems(parsed.error);
    // Reported with the others: neither key is a variable of its own that the schema could require.
    if (!keysConfigured(bindings)) problems.push("JWKS_URL or JWKS_JSON is missing (the keys user tokens are verified with)");
    return { ok: false, problems };
  }
  const problems: string[] = [];
  const attempt = <T>(fn: () => T): T | undefined => {
    try {
      return fn();
    } catch (err) {
      problems.push(err instanceof Error ? err.message.replace(/^configuration: /, "") : String(err));
      return undefined;
    }
  };
  const v = parsed.data;
  let keys: WorkerConfig["keys"] | undefined;
  if (v.JWKS_URL) {
    const jwksUrl = v.JWKS_URL;
    keys = attempt(() => {
      const url = new URL(jwksUrl);
      if (url.protocol !== "https:" && url.protocol !== "http:") throw new Error(`JWKS_URL must be an http(s) URL, got "${jwksUrl}"`);
      return { jwksUrl: url.href };
    });
  } else if (v.JWKS_JSON) {
    const text = v.JWKS_JSON;
    keys = attempt(() => ({ jwks: parseJwks(text) }));
  } else {
    problems.push("JWKS_URL or JWKS_JSON is missing (the keys user tokens are verified with)");
  }
  const webhooks = attempt(() => webhookConfigOf(v));
  if (problems.length > 0 || !keys || !webhooks) return { ok: false, problems };
  const { gateway, auth: allAuth } = gatewayConfigOf(v, v.AGENT_IMAGES);
  const { jwksUrl: _u, jwksJson: _j, ...auth } = allAuth;
  return {
    ok: true,
    config: {
      connectionString: v.HYPERDRIVE,
      componentKey: componentKey(v.COMPONENT_SECRET),
      upstreamKey: v.UPSTREAM_KEY,
      gateway,
      auth,
      keys,
      webhooks,
      placement: { liveWindowMs: v.HOST_LIVE_WINDOW_MS, cacheTtlMs: v.PLACEMENT_CACHE_MS, maxClockSkewMs: v.MAX_CLOCK_SKEW_MS },
      dbMaxConnections: v.DB_MAX_CONNECTIONS,
      cronBudgetMs: v.WEBHOOK_CRON_BUDGET_MS,
      logLevel: v.LOG_LEVEL,
    },
  };
}

function keysConfigured(bindings: WorkerBindings): boolean {
  const set = (value: unknown) => value !== undefined && value !== null && value !== "";
  return set(bindings.JWKS_URL) || set(bindings.JWKS_JSON);
}

/** Vars may be typed in wrangler.toml (numbers, booleans): read them as the strings the variables' schemas expect. */
function stringVars(bindings: WorkerBindings): Env {
  const env: Env = {};
  for (const [name, value] of Object.entries(bindings)) {
    if (typeof value === "string") env[name] = value;
    else if (typeof value === "number" || typeof value === "boolean") env[name] = String(value);
  }
  return env;
}

function parseJwks(text: string): JSONWebKeySet {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    throw new AppError("bad_request", "JWKS_JSON is not JSON");
  }
  const keys = (doc as { keys?: unknown } | null)?.keys;
  if (!Array.isArray(keys) || keys.length === 0) throw new AppError("bad_request", 'JWKS_JSON must be a JWKS document: {"keys":[…]} with at least one key');
  return doc as JSONWebKeySet;
}

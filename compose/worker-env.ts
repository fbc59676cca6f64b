// The Worker's bindings and variables, validated once into a typed config; every problem is named, none crashes the isolate.
import type { JSONWebKeySet } from "jose";
import { AppError } from "../lib/errors.ts";
import { int, oneOf, str, type Env } from "../lib/env.ts";
import type { LogLevel } from "../lib/log.ts";
import { componentKey } from "../lib/host-token.ts";
import type { GatewayConfig } from "../gateway/app.ts";
import { parseGatewayConfig, type GatewayAuthConfig } from "../gateway/config.ts";
import { webhookConfigFromEnv } from "../gateway/webhooks/config.ts";
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

/**
 * | binding / variable | kind | meaning |
 * | HYPERDRIVE | Hyperdrive binding (required) | the shared Postgres |
 * | COMPONENT_SECRET | secret (required, ≥ 32 chars) | signs gateway → host calls; the hosts have the same |
 * | JWKS_URL or JWKS_JSON | var or secret (one required) | keys of the user-token issuer |
 * | GATEWAY_DOMAIN | var (optional) | agents are also served at `{agentId}.{GATEWAY_DOMAIN}` |
 * | AGENT_IMAGES | var, default demo | images agents may be created with (what the hosts run), comma-separated |
 * | HOST_LIVE_WINDOW_MS | var, default 30000 | a host without a heartbeat for this long gets no new agents, and its agents move to other hosts at their next call (its lease) |
 * | MAX_CLOCK_SKEW_MS | var, default 2000 | a host whose clock differs from the database's by more than this (ms) gets no new agents |
 * | PLACEMENT_CACHE_MS | var, default 2000 | how long an isolate reuses an agent → host answer |
 * | DB_MAX_CONNECTIONS | var, default 5 | connections per request through Hyperdrive |
 * | WEBHOOK_CRON_BUDGET_MS | var, default 25000 | time one cron run spends delivering webhooks |
 * | LOG_LEVEL | var, default info | debug, info, warn or error |
 * plus JWT_ISSUER, JWT_AUDIENCE, JWT_ALGORITHMS, MAX_BODY_BYTES, AGENT_* (gateway/config.ts) and WEBHOOK_* (webhooks/config.ts).
 */
export function parseWorkerEnv(bindings: WorkerBindings): ParsedWorkerEnv {
  const problems: string[] = [];
  const env = stringVars(bindings);
  const attempt = <T>(fn: () => T): T | undefined => {
    try {
      return fn();
    } catch (err) {
      problems.push(err instanceof Error ? err.message.replace(/^configuration: /, "") : String(err));
      return undefined;
    }
  };

  const hyperdrive = bindings.HYPERDRIVE;
  const connectionString = typeof hyperdrive === "object" && hyperdrive !== null && typeof hyperdrive.connectionString === "string" ? hyperdrive.connectionString : undefined;
  if (!connectionString) problems.push("the HYPERDRIVE binding is missing (a [[hyperdrive]] binding named HYPERDRIVE in wrangler.toml)");

  const secret = env.COMPONENT_SECRET;
  let key: Uint8Array | undefined;
  if (!secret) problems.push("the COMPONENT_SECRET secret is missing (wrangler secret put COMPONENT_SECRET)");
  else key = attempt(() => componentKey(secret));

  let keys: WorkerConfig["keys"] | undefined;
  if (env.JWKS_URL) {
    keys = attempt(() => {
      const url = new URL(env.JWKS_URL!);
      if (url.protocol !== "https:" && url.protocol !== "http:") throw new Error(`JWKS_URL must be an http(s) URL, got "${env.JWKS_URL}"`);
      return { jwksUrl: url.href };
    });
  } else if (env.JWKS_JSON) {
    keys = attempt(() => ({ jwks: parseJwks(env.JWKS_JSON!) }));
  } else {
    problems.push("JWKS_URL or JWKS_JSON is missing (the keys user tokens are verified with)");
  }

  const images = str(env, "AGENT_IMAGES", "demo").split(",").map((s) => s.trim()).filter(Boolean);
  const parsed = attempt(() => parseGatewayConfig(env, images));
  const webhooks = attempt(() => webhookConfigFromEnv(env));
  const numbers = attempt(() => ({
    liveWindowMs: int(env, "HOST_LIVE_WINDOW_MS", 30_000, { min: 1000 }),
    cacheTtlMs: int(env, "PLACEMENT_CACHE_MS", 2000, { min: 0 }),
    maxClockSkewMs: int(env, "MAX_CLOCK_SKEW_MS", 2000, { min: 0 }),
    dbMaxConnections: int(env, "DB_MAX_CONNECTIONS", 5, { min: 1, max: 100 }),
    cronBudgetMs: int(env, "WEBHOOK_CRON_BUDGET_MS", 25_000, { min: 1000 }),
    logLevel: oneOf(env, "LOG_LEVEL", ["debug", "info", "warn", "error"] as const, "info"),
  }));

  if (problems.length > 0 || !connectionString || !key || !keys || !parsed || !webhooks || !numbers) return { ok: false, problems };
  const { jwksUrl: _u, jwksJson: _j, ...auth } = parsed.auth;
  return {
    ok: true,
    config: {
      connectionString,
      componentKey: key,
      gateway: parsed.gateway,
      auth,
      keys,
      webhooks,
      placement: { liveWindowMs: numbers.liveWindowMs, cacheTtlMs: numbers.cacheTtlMs, maxClockSkewMs: numbers.maxClockSkewMs },
      dbMaxConnections: numbers.dbMaxConnections,
      cronBudgetMs: numbers.cronBudgetMs,
      logLevel: numbers.logLevel,
    },
  };
}

/** Vars may be typed in wrangler.toml (numbers, booleans): read them as the strings the env readers expect. */
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

// The gateway's variables (one zod fragment; each with its type, unit, default and meaning) and the typed config built from them at a program's edge.
import { z } from "zod";
import { parseEnv, vars, type Env } from "../lib/env.ts";
import { upstreamEnv } from "../lib/shared-env.ts";
import type { GatewayConfig } from "./deps.ts";
import { defaultProxyConfig } from "./proxy/core.ts";

/** The `iss` and `aud` a gateway requires by default: those of the tokens `npm run token` and `npm start` mint. */
export const devIssuer = "agentvm-dev";
export const devAudience = "agentvm";

export interface GatewayAuthConfig {
  /** JWKS URL to verify user tokens with; when unset, a JWKS document or the dev key is used. */
  jwksUrl: string | undefined;
  /** A JWKS document (JSON) to verify user tokens with. */
  jwksJson: string | undefined;
  issuer: string;
  audience: string;
  algorithms: string[];
}

/** Routing, new agents' defaults, user-token verification. */
export const gatewayEnv = z.object({
  GATEWAY_DOMAIN: vars.optStr({ type: "domain", default: "(unset)", doc: "agents are also served at `{agentId}.{GATEWAY_DOMAIN}`" }),
  MAX_API_BODY_BYTES: vars.int({ fallback: 1024 ** 2, min: 1024, unit: "bytes", default: "1048576 (1 MiB)", doc: "largest admin API body" }),
  AGENT_IDLE_TIMEOUT_MS: vars.int({ fallback: 60_000, min: 100, unit: "ms", doc: "default idle timeout of new agents" }),
  AGENT_STREAM_IDLE_MS: vars.int({ fallback: 60_000, min: 100, unit: "ms", doc: "default stream idle window of new agents" }),
  AGENT_MEM_MIB: vars.int({ fallback: 256, min: 64, unit: "MiB", doc: "default guest memory of new agents" }),
  AGENT_VCPUS: vars.int({ fallback: 1, min: 1, max: 16, unit: "vCPUs", doc: "default vCPUs of new agents" }),
  AGENT_DISK_MIB: vars.int({
    fallback: 1024,
    min: 64,
    max: 1024 * 1024,
    unit: "MiB",
    doc: "an agent's persistent disk (the writable layer over a built image) unless its create call says",
  }),
  JWKS_URL: vars.optStr({
    type: "URL",
    default: "(unset)",
    doc: "JWKS endpoint of the token issuer; unset: `JWKS_JSON`, `JWKS_FILE` or the signing key in `SIGNING_KEY_FILE`",
  }),
  JWKS_JSON: vars.optStr({ type: "JSON", default: "(unset)", doc: "a JWKS document inline, instead of `JWKS_URL`" }),
  JWT_ISSUER: vars.str({ fallback: devIssuer, doc: "required `iss` of user tokens" }),
  JWT_AUDIENCE: vars.str({ fallback: devAudience, doc: "required `aud` of user tokens" }),
  JWT_ALGORITHMS: vars.list({ fallback: "ES256,EdDSA,RS256", doc: "accepted signature algorithms (anything else is refused)" }),
  TENANT_CACHE_TTL_MS: vars.int({
    fallback: 5000,
    min: 0,
    max: 3_600_000,
    unit: "ms",
    doc: "how long a tenant's status (active, suspended, deleted, missing) is trusted from memory; a change made through another gateway process is seen within this (plus one refresh); 0: every check reads it",
  }),
  TENANTS_AUTO_PROVISION: vars.bool({
    fallback: false,
    doc: "a verified token of a tenant that does not exist creates it (name = id, time zone UTC, audit `tenant.provision`) instead of `403 tenant_not_found`",
  }),
});

/** What the proxy holds every call and client to (with the upstream timeouts of lib/shared-env.ts). */
export const proxyLimitsEnv = z.object({
  MAX_BODY_BYTES: vars.int({
    fallback: 1024 ** 3,
    min: 0,
    unit: "bytes",
    default: "1073741824 (1 GiB)",
    doc: "largest proxied request body (per agent: `limits.maxBodyBytes`, which may only lower it); `413` beyond",
  }),
  MAX_HEADER_BYTES: vars.int({
    fallback: defaultProxyConfig.maxHeaderBytes,
    min: 1024,
    max: 1024 * 1024,
    unit: "bytes",
    doc: "largest request head (request line + headers) a client may send; `431` beyond",
  }),
  CLIENT_HEADERS_TIMEOUT_MS: vars.int({
    fallback: defaultProxyConfig.clientHeadersTimeoutMs,
    min: 100,
    unit: "ms",
    doc: "a request head must be complete this long after the connection opened (kept-alive: after the next request's first byte); `408` and the connection closed, at most a twentieth of it (≤ 0.5 s) late (Node: the fleet-agent's ingress too)",
  }),
  TENANT_MAX_CONCURRENT: vars.int({
    fallback: defaultProxyConfig.tenantMaxConcurrent,
    min: 1,
    unit: "calls",
    doc: "proxied calls and exec, processes and files calls in flight per tenant, one count per gateway process (a WebSocket counts while its handshake runs); `429` + `Retry-After` beyond",
  }),
  PROXY_IDLE_TIMEOUT_MS: vars.int({
    fallback: defaultProxyConfig.proxyIdleTimeoutMs,
    min: 100,
    unit: "ms",
    default: "600000 (10 min)",
    doc: "a proxied call, stream or WebSocket that moves no bytes either way for this long is ended (per agent: `limits.proxyIdleTimeoutMs`)",
  }),
  AGENT_CACHE_TTL_MS: vars.int({
    fallback: defaultProxyConfig.agentCacheTtlMs,
    min: 0,
    unit: "ms",
    default: "2000 (Workers: 0)",
    doc: "how long the proxy trusts an agent row from memory before re-reading it (in the background); 0: every call reads it",
  }),
  PROXY_FAST_PATH: vars.bool({
    fallback: defaultProxyConfig.fastPath,
    doc: "Node: agent traffic and WebSockets take the fast path (false: all through the Hono app, no WebSockets)",
  }),
  PROXY_RAW_FRONT: vars.bool({
    fallback: defaultProxyConfig.rawFront,
    doc: "Node, beside the host: simple bodiless agent calls (a whole GET/HEAD/DELETE/OPTIONS head in one read) are answered off the socket without node:http, everything else is handed to node:http (false: every request through node:http)",
  }),
});

export type GatewaySettings = z.output<typeof gatewayEnv> & z.output<typeof proxyLimitsEnv> & z.output<typeof upstreamEnv>;

/** The gateway's config from its parsed variables; `images` are those agents may be created with (what the hosts' drivers run). */
export function gatewayConfigOf(v: GatewaySettings, images: readonly string[]): { gateway: GatewayConfig; auth: GatewayAuthConfig } {
  return {
    gateway: {
      domain: v.GATEWAY_DOMAIN,
      maxBodyBytes: v.MAX_BODY_BYTES,
      maxApiBodyBytes: v.MAX_API_BODY_BYTES,
      images,
      agentDefaults: {
        vcpus: v.AGENT_VCPUS,
        memMiB: v.AGENT_MEM_MIB,
        idleTimeoutMs: v.AGENT_IDLE_TIMEOUT_MS,
        streamIdleMs: v.AGENT_STREAM_IDLE_MS,
        diskMiB: v.AGENT_DISK_MIB,
      },
      proxy: {
        maxHeaderBytes: v.MAX_HEADER_BYTES,
        clientHeadersTimeoutMs: v.CLIENT_HEADERS_TIMEOUT_MS,
        tenantMaxConcurrent: v.TENANT_MAX_CONCURRENT,
        proxyIdleTimeoutMs: v.PROXY_IDLE_TIMEOUT_MS,
        responseTimeoutMs: v.UPSTREAM_HEADERS_TIMEOUT_MS,
        connectTimeoutMs: v.UPSTREAM_CONNECT_TIMEOUT_MS,
        agentCacheTtlMs: v.AGENT_CACHE_TTL_MS,
        fastPath: v.PROXY_FAST_PATH,
        rawFront: v.PROXY_RAW_FRONT,
      },
      tenants: { cacheTtlMs: v.TENANT_CACHE_TTL_MS, autoProvision: v.TENANTS_AUTO_PROVISION, serveStale: true },
    },
    auth: { jwksUrl: v.JWKS_URL, jwksJson: v.JWKS_JSON, issuer: v.JWT_ISSUER, audience: v.JWT_AUDIENCE, algorithms: v.JWT_ALGORITHMS },
  };
}

const allGatewayEnv = z.object({ ...gatewayEnv.shape, ...proxyLimitsEnv.shape, ...upstreamEnv.shape });

/** The gateway's config from these variables alone (the API document over its defaults). */
export function parseGatewayConfig(env: Env, images: readonly string[]): { gateway: GatewayConfig; auth: GatewayAuthConfig } {
  return gatewayConfigOf(parseEnv(allGatewayEnv, env), images);
}

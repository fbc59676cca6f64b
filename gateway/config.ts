// The gateway's configuration, parsed once from the environment at a program's edge.
import { bool, int, optStr, str, type Env } from "../lib/env.ts";
import type { GatewayConfig } from "./deps.ts";

export interface GatewayAuthConfig {
  /** JWKS URL to verify user tokens with; when unset, a JWKS document or the dev key is used. */
  jwksUrl: string | undefined;
  /** A JWKS document (JSON) to verify user tokens with. */
  jwksJson: string | undefined;
  issuer: string;
  audience: string;
  algorithms: string[];
}

/**
 * | variable | default | meaning |
 * | GATEWAY_DOMAIN | (unset) | agents are also served at `{agentId}.{GATEWAY_DOMAIN}` |
 * | MAX_BODY_BYTES | 1073741824 (1 GiB) | largest proxied request body, bytes |
 * | MAX_API_BODY_BYTES | 1048576 (1 MiB) | largest admin API body, bytes |
 * | AGENT_IDLE_TIMEOUT_MS | 60000 | default idle timeout of new agents, ms |
 * | AGENT_STREAM_IDLE_MS | 60000 | default stream idle window of new agents, ms |
 * | AGENT_MEM_MIB | 256 | default guest memory of new agents, MiB |
 * | AGENT_VCPUS | 1 | default vCPUs of new agents |
 * | JWKS_URL | (unset) | JWKS endpoint of the token issuer |
 * | JWKS_JSON | (unset) | JWKS document, inline JSON (instead of JWKS_URL) |
 * | JWT_ISSUER | agentvm-dev | required `iss` of user tokens |
 * | JWT_AUDIENCE | agentvm | required `aud` of user tokens |
 * | JWT_ALGORITHMS | ES256,EdDSA,RS256 | accepted signature algorithms |
 * | MAX_HEADER_BYTES | 16384 | largest request head (request line + headers) a client may send, bytes; 431 beyond |
 * | CLIENT_HEADERS_TIMEOUT_MS | 10000 | a request head must be complete this long after the connection opened (kept-alive: after the next request's first byte), ms; 408 request_timeout and the connection closed after it, at most a twentieth of it (≤ 0.5 s) late (Node: the fleet-agent's ingress reads it too) |
 * | TENANT_MAX_CONCURRENT | 1000 | proxied calls in flight per tenant (a WebSocket counts while its handshake runs); 429 + Retry-After beyond |
 * | PROXY_IDLE_TIMEOUT_MS | 600000 (10 min) | a proxied call, stream or WebSocket that moves no bytes either way for this long is ended, ms (per agent: limits.proxyIdleTimeoutMs) |
 * | UPSTREAM_HEADERS_TIMEOUT_MS | 300000 | from the request sent to the agent's response headers, ms; 504 after (per agent: limits.responseTimeoutMs; the fleet-agent reads it too) |
 * | UPSTREAM_CONNECT_TIMEOUT_MS | 5000 | connecting to an agent's port, ms; 504 after (the fleet-agent reads it too) |
 * | AGENT_DISK_MIB | 1024 | an agent's persistent disk (the writable layer over a built image) unless its create call says, MiB |
 * | AGENT_CACHE_TTL_MS | 2000 (Workers: 0) | how long the proxy trusts an agent row from memory before re-reading it (in the background), ms; 0: every call reads it |
 * | PROXY_FAST_PATH | true | Node: agent traffic and WebSockets take the fast path (false: all through the Hono app, no WebSockets) |
 * | TENANT_CACHE_TTL_MS | 5000 | how long a tenant's status (active, suspended, deleted, missing) is trusted from memory, ms; a change made through another gateway process is seen within this (plus one refresh); 0: every check reads it |
 * | TENANTS_AUTO_PROVISION | false | a verified token of a tenant that does not exist creates it (name = id, time zone UTC, audit `tenant.provision`) instead of 403 tenant_not_found |
 */
/** CLIENT_HEADERS_TIMEOUT_MS (Node servers: the gateway and the fleet-agent's ingress), ms. */
export function clientHeadersTimeoutMs(env: Env): number {
  return int(env, "CLIENT_HEADERS_TIMEOUT_MS", 10_000, { min: 100 });
}

export function parseGatewayConfig(env: Env, images: readonly string[]): { gateway: GatewayConfig; auth: GatewayAuthConfig } {
  return {
    gateway: {
      domain: optStr(env, "GATEWAY_DOMAIN"),
      maxBodyBytes: int(env, "MAX_BODY_BYTES", 1024 ** 3, { min: 0 }),
      maxApiBodyBytes: int(env, "MAX_API_BODY_BYTES", 1024 ** 2, { min: 1024 }),
      images,
      agentDefaults: {
        vcpus: int(env, "AGENT_VCPUS", 1, { min: 1, max: 16 }),
        memMiB: int(env, "AGENT_MEM_MIB", 256, { min: 64 }),
        idleTimeoutMs: int(env, "AGENT_IDLE_TIMEOUT_MS", 60_000, { min: 100 }),
        streamIdleMs: int(env, "AGENT_STREAM_IDLE_MS", 60_000, { min: 100 }),
        diskMiB: int(env, "AGENT_DISK_MIB", 1024, { min: 64, max: 1024 * 1024 }),
      },
      proxy: {
        maxHeaderBytes: int(env, "MAX_HEADER_BYTES", 16_384, { min: 1024, max: 1024 * 1024 }),
        clientHeadersTimeoutMs: clientHeadersTimeoutMs(env),
        tenantMaxConcurrent: int(env, "TENANT_MAX_CONCURRENT", 1000, { min: 1 }),
        proxyIdleTimeoutMs: int(env, "PROXY_IDLE_TIMEOUT_MS", 600_000, { min: 100 }),
        responseTimeoutMs: int(env, "UPSTREAM_HEADERS_TIMEOUT_MS", 300_000, { min: 100 }),
        connectTimeoutMs: int(env, "UPSTREAM_CONNECT_TIMEOUT_MS", 5000, { min: 100 }),
        agentCacheTtlMs: int(env, "AGENT_CACHE_TTL_MS", 2000, { min: 0 }),
        fastPath: bool(env, "PROXY_FAST_PATH", true),
      },
      tenants: {
        cacheTtlMs: int(env, "TENANT_CACHE_TTL_MS", 5000, { min: 0, max: 3_600_000 }),
        autoProvision: bool(env, "TENANTS_AUTO_PROVISION", false),
        serveStale: true,
      },
    },
    auth: {
      jwksUrl: optStr(env, "JWKS_URL"),
      jwksJson: optStr(env, "JWKS_JSON"),
      issuer: str(env, "JWT_ISSUER", "agentvm-dev"),
      audience: str(env, "JWT_AUDIENCE", "agentvm"),
      algorithms: str(env, "JWT_ALGORITHMS", "ES256,EdDSA,RS256").split(",").map((s) => s.trim()).filter(Boolean),
    },
  };
}

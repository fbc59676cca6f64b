// The gateway's configuration, parsed once from the environment at a program's edge.
import { int, optStr, str, type Env } from "../lib/env.ts";
import type { GatewayConfig } from "./app.ts";

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
 */
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

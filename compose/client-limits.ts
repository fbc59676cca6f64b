// What every client connection and request body of a Node server is held to, parsed from the environment once (the gateway and the host ingress share it).
import { int, type Env } from "../lib/env.ts";
import { defaultClientLimits, type ClientLimits } from "../lib/node-conn-policy.ts";

/**
 * What every client connection and request body is held to (lib/node-conn-policy.ts, applied by gateway/node/serve.ts and the fleet-agent's ingress):
 * | variable | default | meaning |
 * | CLIENT_BODY_MIN_BYTES | 1024 | progress floor: a request body being received brings at least this many bytes per window (agent traffic until the agent answers, uploads, the API, webhooks), bytes; 408 and the connection closed below it |
 * | CLIENT_BODY_WINDOW_MS | 10000 | the window of that floor, ms |
 * | CLIENT_BODY_TIMEOUT_MS | 60000 | a control-API body (admin, meter ingest, …) arrives whole within this long of its head, ms; 408 after (not agent traffic, not image uploads) |
 * | CLIENT_WEBHOOK_BODY_TIMEOUT_MS | 10000 | a webhook body (`POST /hooks/…`) arrives whole within this long of its head, ms; 408 after |
 * | MAX_CONNECTIONS_PER_IP | 256 | open connections per client address (WebSockets count); the next is answered 429 too_many_connections + Retry-After and closed; 0: no bound |
 * | MAX_CONNECTIONS | 10000 | open connections in total; the next is answered 503 server_busy + Retry-After and closed; 0: no bound |
 */
export function parseClientLimits(env: Env): Omit<ClientLimits, "headTimeoutMs"> {
  const d = defaultClientLimits;
  return {
    bodyMinBytes: int(env, "CLIENT_BODY_MIN_BYTES", d.bodyMinBytes, { min: 1, max: 1024 * 1024 }),
    bodyWindowMs: int(env, "CLIENT_BODY_WINDOW_MS", d.bodyWindowMs, { min: 100 }),
    bodyTimeoutMs: int(env, "CLIENT_BODY_TIMEOUT_MS", d.bodyTimeoutMs, { min: 100 }),
    webhookBodyTimeoutMs: int(env, "CLIENT_WEBHOOK_BODY_TIMEOUT_MS", d.webhookBodyTimeoutMs, { min: 100 }),
    maxConnectionsPerIp: int(env, "MAX_CONNECTIONS_PER_IP", d.maxConnectionsPerIp, { min: 0 }),
    maxConnections: int(env, "MAX_CONNECTIONS", d.maxConnections, { min: 0 }),
  };
}


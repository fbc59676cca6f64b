// What every client connection and request body of a Node server is held to: the variables (the gateway and the host ingress share them) and the limits built from them.
import { z } from "zod";
import { vars } from "../lib/env.ts";
import { defaultClientLimits as d, type ClientLimits } from "../lib/node-conn-policy.ts";

/** What every client connection and request body is held to (lib/node-conn-policy.ts, applied by gateway/node/serve.ts and the fleet-agent's ingress). */
export const clientLimitsEnv = z.object({
  CLIENT_BODY_MIN_BYTES: vars.int({
    fallback: d.bodyMinBytes,
    min: 1,
    max: 1024 * 1024,
    unit: "bytes",
    doc: "progress floor: a request body being received brings at least this many bytes per window (agent traffic until the agent answers, uploads, the API, webhooks); `408` and the connection closed below it",
  }),
  CLIENT_BODY_WINDOW_MS: vars.int({ fallback: d.bodyWindowMs, min: 100, unit: "ms", doc: "the window of that floor" }),
  CLIENT_BODY_TIMEOUT_MS: vars.int({
    fallback: d.bodyTimeoutMs,
    min: 100,
    unit: "ms",
    doc: "a control-API body (admin, meter ingest, …; a host's ingress: host-op bodies) arrives whole within this long of its head; `408` after (not agent traffic, not image uploads)",
  }),
  CLIENT_WEBHOOK_BODY_TIMEOUT_MS: vars.int({
    fallback: d.webhookBodyTimeoutMs,
    min: 100,
    unit: "ms",
    doc: "a webhook body (`POST /hooks/…`) arrives whole within this long of its head; `408` after",
  }),
  MAX_CONNECTIONS_PER_IP: vars.int({
    fallback: d.maxConnectionsPerIp,
    min: 0,
    unit: "connections",
    doc: "Node gateway: open connections per client address (WebSockets count); the next is answered `429 too_many_connections` + `Retry-After` and closed; 0: no bound",
  }),
  MAX_CONNECTIONS: vars.int({
    fallback: d.maxConnections,
    min: 0,
    unit: "connections",
    doc: "Node gateway: open connections in total; the next is answered `503 server_busy` + `Retry-After` and closed; 0: no bound",
  }),
});

export function clientLimitsOf(v: z.output<typeof clientLimitsEnv>): Omit<ClientLimits, "headTimeoutMs"> {
  return {
    bodyMinBytes: v.CLIENT_BODY_MIN_BYTES,
    bodyWindowMs: v.CLIENT_BODY_WINDOW_MS,
    bodyTimeoutMs: v.CLIENT_BODY_TIMEOUT_MS,
    webhookBodyTimeoutMs: v.CLIENT_WEBHOOK_BODY_TIMEOUT_MS,
    maxConnectionsPerIp: v.MAX_CONNECTIONS_PER_IP,
    maxConnections: v.MAX_CONNECTIONS,
  };
}

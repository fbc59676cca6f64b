// Configuration variables more than one component reads (the gateway's proxy and the fleet-agent; a host and a gateway at shutdown), defined once here.
import { z } from "zod";
import { vars } from "./env.ts";

/** The upstream timeouts' defaults, for code built without a parsed configuration too (fleet-agent/local-fleet.ts). */
export const defaultUpstreamTimeouts = { connectTimeoutMs: 5000, headersTimeoutMs: 300_000 } as const;

/** Talking to an agent's port: the gateway's fast path and the fleet-agent's upstream pool hold the same limits. */
export const upstreamEnv = z.object({
  UPSTREAM_CONNECT_TIMEOUT_MS: vars.int({
    fallback: defaultUpstreamTimeouts.connectTimeoutMs,
    min: 100,
    unit: "ms",
    doc: "connecting to an agent's port (the gateway's fast path and the fleet-agent both); `504` after",
  }),
  UPSTREAM_HEADERS_TIMEOUT_MS: vars.int({
    fallback: defaultUpstreamTimeouts.headersTimeoutMs,
    min: 100,
    unit: "ms",
    doc: "from the request sent to the agent's response headers (per agent: `limits.responseTimeoutMs`); `504` after and the agent's connection closed",
  }),
});

export const shutdownEnv = z.object({
  DRAIN_TIMEOUT_MS: vars.int({
    fallback: 10_000,
    min: 0,
    unit: "ms",
    doc: "how long shutdown lets calls in flight finish (a host then hibernates its VMs; a gateway over remote hosts cuts the connections still open)",
  }),
});

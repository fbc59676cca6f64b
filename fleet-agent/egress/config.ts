// The egress proxy's variables (one zod fragment; its upstream path's too) and its configuration built from them at the program's edge.
import { z } from "zod";
import { envVar, parseEnv, vars, type Env } from "../../lib/env.ts";
import { parseRules, type EgressRules } from "./policy.ts";

export interface EgressConfig {
  rules: EgressRules;
  /** Resolving a name and connecting to it, each, ms. */
  connectTimeoutMs: number;
  /** A tunnel or forwarded request with no bytes either way for this long is cut, ms. */
  idleTimeoutMs: number;
  /** Connections one VM may hold open through the proxy at once; more are answered 429. */
  maxConnectionsPerVm: number;
  /** Calls through a tenant's upstreams (`/u/<name>/…`, upstreams.ts). */
  upstreams: UpstreamConfig;
}

export interface UpstreamConfig {
  /** From the request sent to the upstream's response head, ms; `504` after. */
  timeoutMs: number;
  /** The largest request body an agent may send through an upstream, bytes; `413` beyond. */
  maxBodyBytes: number;
  /** Request and response bodies up to this size are kept (content-addressed) with the operation, bytes; larger ones are not. */
  keepBodyBytes: number;
  /** How long a host trusts a tenant's upstream (its base URL and headers) from memory, ms. */
  cacheMs: number;
  /** Calls with `Prefer: respond-async`, made by the host (fleet-agent/operations/async-runner.ts). */
  async: {
    /** From the 202 to the outcome at most, ms: then the operation fails with `gateway_timeout`. */
    deadlineMs: number;
    /** Attempts of one call at most (a repeat only where it is safe). */
    maxAttempts: number;
    /** Calls one host makes at once. */
    concurrency: number;
  };
}

const rules = (doc: string) =>
  envVar({ type: "comma-separated addresses or CIDRs, each with an optional port", default: "(none)", doc }, (raw, fail) => {
    try {
      return parseRules(raw ?? "");
    } catch (err) {
      return fail(`is refused: ${(err as Error).message}`);
    }
  });

export const egressEnv = z.object({
  EGRESS_ALLOW: rules(
    "addresses or CIDRs, each optionally with one port (`10.1.2.3:8080`, `10.20.0.0/16`, `[fd00::5]:443`), that egress may reach although refused by default; an entry wins over every refusal, the host's own addresses and `EGRESS_DENY` included. Firecracker agents get the IPv4 entries on their tap's rules (no IPv6, and 127/8 is the guest's own: such entries are logged at start; docs/firecracker.md)",
  ),
  EGRESS_DENY: rules(
    "the same form: refused on top of the built-in refusals (add the host's public address if it sits behind NAT: it is not an interface address); on Firecracker agents' taps too, where an entry with a port refuses TCP and UDP to it",
  ),
  EGRESS_CONNECT_TIMEOUT_MS: vars.int({ fallback: 10_000, min: 100, unit: "ms", doc: "resolving a destination, and connecting to it, each; `504` after" }),
  EGRESS_IDLE_TIMEOUT_MS: vars.int({
    fallback: 600_000,
    min: 1000,
    unit: "ms",
    doc: "a connection through the proxy with no bytes either way for this long is cut",
  }),
  EGRESS_MAX_CONNECTIONS: vars.int({
    fallback: 256,
    min: 1,
    unit: "connections",
    doc: "connections one VM may hold open through the proxy at once (more: `429`)",
  }),
  UPSTREAM_TIMEOUT_MS: vars.int({
    fallback: 600_000,
    min: 100,
    unit: "ms",
    default: "600000 (10 min: a slow model's time to its first token)",
    doc: "a call through an upstream (`/u/<name>/…` at the egress proxy) waits this long for the upstream's response head; `504` after (the operation fails with `gateway_timeout`)",
  }),
  UPSTREAM_MAX_BODY_BYTES: vars.int({
    fallback: 32 * 1024 * 1024,
    min: 0,
    unit: "bytes",
    default: "33554432 (32 MiB)",
    doc: "the largest request body an agent may send through an upstream (it is spooled to the host's disk while it is hashed); `413` beyond",
  }),
  UPSTREAM_KEEP_BODY_BYTES: vars.int({
    fallback: 1024 * 1024,
    min: 0,
    unit: "bytes",
    default: "1048576 (1 MiB)",
    doc: "request and response bodies of upstream calls up to this size are kept with their operation (content-addressed: in the shared artifact store where there is one, else under `DATA_DIR`); a retry with the same `Idempotency-Key` is answered from the kept response. A larger body is not kept (0: none)",
  }),
  UPSTREAM_ASYNC_DEADLINE_MS: vars.int({
    fallback: 3_600_000,
    min: 1000,
    unit: "ms",
    default: "3600000 (1 h)",
    doc: "a call with `Prefer: respond-async` (answered `202 {operationId}` at once, made by the host) has this long, retries included, to get an answer; then its outcome is `gateway_timeout`",
  }),
  UPSTREAM_ASYNC_ATTEMPTS: vars.int({
    fallback: 5,
    min: 1,
    unit: "attempts",
    doc: "attempts of one async call at most, with backoff (1 s doubling to 5 min); only calls a repeat is safe for are retried: GET, HEAD, PUT, DELETE, OPTIONS, or any with an `Idempotency-Key`",
  }),
  UPSTREAM_ASYNC_CONCURRENCY: vars.int({
    fallback: 16,
    min: 1,
    unit: "calls",
    doc: "async calls one host makes at once (the rest wait their turn in Postgres, where any host may take them)",
  }),
  UPSTREAM_CACHE_MS: vars.int({
    fallback: 5000,
    min: 0,
    unit: "ms",
    doc: "how long a host uses a tenant's upstream (base URL, headers) from memory: a change through the API reaches calls within this",
  }),
});

export type EgressSettings = z.output<typeof egressEnv>;

export function egressConfigOf(v: EgressSettings): EgressConfig {
  return {
    rules: { allow: v.EGRESS_ALLOW, deny: v.EGRESS_DENY },
    connectTimeoutMs: v.EGRESS_CONNECT_TIMEOUT_MS,
    idleTimeoutMs: v.EGRESS_IDLE_TIMEOUT_MS,
    maxConnectionsPerVm: v.EGRESS_MAX_CONNECTIONS,
    upstreams: {
      timeoutMs: v.UPSTREAM_TIMEOUT_MS,
      maxBodyBytes: v.UPSTREAM_MAX_BODY_BYTES,
      keepBodyBytes: v.UPSTREAM_KEEP_BODY_BYTES,
      cacheMs: v.UPSTREAM_CACHE_MS,
      async: { deadlineMs: v.UPSTREAM_ASYNC_DEADLINE_MS, maxAttempts: v.UPSTREAM_ASYNC_ATTEMPTS, concurrency: v.UPSTREAM_ASYNC_CONCURRENCY },
    },
  };
}

/** The egress configuration from these variables alone (tests). */
export function parseEgressConfig(env: Env): EgressConfig {
  return egressConfigOf(parseEnv(egressEnv, env));
}

/** Defaults with no allow or deny entries (what a driver uses when nobody configured it). */
export const defaultEgressConfig: EgressConfig = parseEgressConfig({});

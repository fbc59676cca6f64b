// The egress proxy's variables (one zod fragment) and its configuration built from them at the program's edge.
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
    "addresses or CIDRs, each optionally with one port (`10.1.2.3:8080`, `10.20.0.0/16`, `[fd00::5]:443`), that egress may reach although refused by default; an entry wins over every refusal, the host's own addresses and `EGRESS_DENY` included",
  ),
  EGRESS_DENY: rules(
    "the same form: refused on top of the built-in refusals (add the host's public address if it sits behind NAT: it is not an interface address)",
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
});

export type EgressSettings = z.output<typeof egressEnv>;

export function egressConfigOf(v: EgressSettings): EgressConfig {
  return {
    rules: { allow: v.EGRESS_ALLOW, deny: v.EGRESS_DENY },
    connectTimeoutMs: v.EGRESS_CONNECT_TIMEOUT_MS,
    idleTimeoutMs: v.EGRESS_IDLE_TIMEOUT_MS,
    maxConnectionsPerVm: v.EGRESS_MAX_CONNECTIONS,
  };
}

/** The egress configuration from these variables alone (tests). */
export function parseEgressConfig(env: Env): EgressConfig {
  return egressConfigOf(parseEnv(egressEnv, env));
}

/** Defaults with no allow or deny entries (what a driver uses when nobody configured it). */
export const defaultEgressConfig: EgressConfig = parseEgressConfig({});

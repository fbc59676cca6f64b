// The egress proxy's configuration, parsed once from the environment at the program's edge (drivers/select.ts).
import { int, str, type Env } from "../../lib/env.ts";
import { AppError } from "../../lib/errors.ts";
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

/**
 * | variable | default | meaning |
 * | EGRESS_ALLOW | (none) | comma-separated addresses or CIDRs, each optionally with one port (`10.1.2.3:8080`, `10.20.0.0/16`, `[fd00::5]:443`), that egress may reach although they are refused by default; an entry wins over every refusal, the host's own addresses and EGRESS_DENY included |
 * | EGRESS_DENY | (none) | the same form: refused on top of the built-in refusals (e.g. the host's public address behind NAT) |
 * | EGRESS_CONNECT_TIMEOUT_MS | 10000 | resolving a destination, and connecting to it, each, ms (504 after) |
 * | EGRESS_IDLE_TIMEOUT_MS | 600000 | a connection through the proxy with no bytes either way for this long is cut, ms |
 * | EGRESS_MAX_CONNECTIONS | 256 | connections one VM may hold open through the proxy at once (more: 429) |
 */
export function parseEgressConfig(env: Env): EgressConfig {
  const rules = (name: string) => {
    try {
      return parseRules(str(env, name, ""));
    } catch (err) {
      throw new AppError("bad_request", `configuration: ${name}: ${(err as Error).message}`);
    }
  };
  return {
    rules: { allow: rules("EGRESS_ALLOW"), deny: rules("EGRESS_DENY") },
    connectTimeoutMs: int(env, "EGRESS_CONNECT_TIMEOUT_MS", 10_000, { min: 100 }),
    idleTimeoutMs: int(env, "EGRESS_IDLE_TIMEOUT_MS", 600_000, { min: 1000 }),
    maxConnectionsPerVm: int(env, "EGRESS_MAX_CONNECTIONS", 256, { min: 1 }),
  };
}

/** Defaults with no allow or deny entries (what a driver uses when nobody configured it). */
export const defaultEgressConfig: EgressConfig = parseEgressConfig({});

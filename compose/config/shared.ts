// Variables several programs read (the process, the component secret, placement and remote hosts), defined once; runtime-free, for the Worker too.
import { z } from "zod";
import { envVar, vars } from "../../lib/env.ts";
import { defaultHostHealth } from "../../gateway/hosts/routes.ts";

export const logLevelEnv = z.object({
  LOG_LEVEL: vars.oneOf(["debug", "info", "warn", "error"] as const, { fallback: "info", doc: "the lowest level logged (JSON lines on stderr)" }),
});

export const processEnv = z.object({
  DATA_DIR: vars.str({
    type: "path",
    fallback: ".data",
    doc: "database (PGlite), signing key, host id, the host's secret (`hosts/<id>/host-secret`, made at the first start: the hosts row is this directory's only) and lock (`hosts/<id>/host.lock`: one process per directory), VM state and snapshots, guest image",
  }),
  BIND_ADDRESS: vars.str({ type: "address", fallback: "127.0.0.1", doc: "address the program listens on (the gateway's port, or a fleet-agent's ingress)" }),
});

/** The shortest COMPONENT_SECRET: an HMAC key (lib/host-token.ts). */
const minComponentSecretChars = 32;

export const componentEnv = z.object({
  COMPONENT_SECRET: envVar(
    {
      type: "secret",
      default: "(random per start in `npm start`)",
      doc: `≥ ${minComponentSecretChars} characters shared by gateways and hosts: gateway → host calls and host → billing shipments are signed with it`,
    },
    (raw, fail) => {
      if (raw === undefined || raw === "") return undefined;
      if (raw.length < minComponentSecretChars) fail(`must be at least ${minComponentSecretChars} characters`);
      return raw;
    },
  ),
});

/** A gateway over hosts elsewhere (the standalone gateway, the Worker): where agents go, and which images they may run. */
export const placementEnv = z.object({
  AGENT_IMAGES: vars.list({ fallback: "demo", doc: "images agents may be created with (what the hosts' drivers run)" }),
  HOST_LIVE_WINDOW_MS: vars.int({
    fallback: defaultHostHealth.liveWindowMs,
    min: 1000,
    unit: "ms",
    doc: "a host's lease: one whose heartbeat is older gets no new agents, and its agents move to live hosts at their next call",
  }),
  PLACEMENT_CACHE_MS: vars.int({
    fallback: 2000,
    min: 0,
    unit: "ms",
    doc: "how long an agent → host answer is reused (while Postgres is down: the last one, however old)",
  }),
});

/** Gateways and hosts both: a host's clock against the database's. */
export const clockSkewEnv = z.object({
  MAX_CLOCK_SKEW_MS: vars.int({
    fallback: defaultHostHealth.maxClockSkewMs,
    min: 0,
    unit: "ms",
    doc: "a host whose clock differs from the database's by more than this logs an error at every heartbeat and gets no new agents",
  }),
});

/** A Node gateway's calls to hosts' ingresses. */
export const remoteHostsEnv = z.object({
  HOST_CONNECT_TIMEOUT_MS: vars.int({ fallback: 5000, min: 100, unit: "ms", doc: "connecting to a host's ingress" }),
  HOST_HEADERS_TIMEOUT_MS: vars.int({
    fallback: 400_000,
    min: 1000,
    unit: "ms",
    doc: "from a call sent to the host's answer (longer than the host's own wake and agent limits)",
  }),
});

/** Gateways (which seal upstreams' secret headers) and hosts (which open them to call the upstream) share one key. */
export const upstreamKeyEnv = z.object({
  UPSTREAM_KEY_FILE: vars.optStr({
    type: "path",
    default: "`DATA_DIR/keys/upstream-key`",
    doc: "the 32-byte key (base64url text) upstreams' secret headers are sealed with at rest (AES-256-GCM); made there at the first start (mode 0600; processes starting at once agree on one). Gateways and hosts on several machines must read the same file (a shared volume, or the same content deployed to each)",
  }),
});

// The fleet-agent's variables (one zod fragment; each with its type, unit, default and meaning) and the host's config built from them at a program's edge.
import { z } from "zod";
import { parseEnv, vars, type Env } from "../lib/env.ts";
import { shutdownEnv, upstreamEnv } from "../lib/shared-env.ts";
import type { LocalFleetOptions } from "./local-fleet.ts";
import type { DriverChoice } from "./drivers/select.ts";
import type { HibernateRetry } from "./reaper.ts";
import type { LogLimits } from "./agent-logs.ts";
import type { DozeConfig } from "./host/doze.ts";
import { artifactStoreConfigOf, artifactStoreEnv, type ArtifactStoreConfig } from "./artifacts/config.ts";

export interface FleetAgentConfig {
  hostId: string | undefined;
  driver: DriverChoice;
  wakeQueueLimit: number;
  wakeDeadlineMs: number;
  reaperIntervalMs: number;
  cpuBusyThreshold: number;
  drainTimeoutMs: number;
  /** Longest open meter segment: a host crash loses at most this much metered time, ms. */
  meterHeartbeatMs: number;
  /** The idle reaper's wait after a failed hibernate: doubling from `initialMs` up to `maxMs`. */
  hibernateRetry: HibernateRetry;
  /** When agents' logs (console + workload output) are rotated. */
  logs: LogLimits;
  upstream: LocalFleetOptions;
  /** When a VM whose open calls all wait on outbound calls stops its vCPUs, and for how long at most (host/doze.ts). */
  doze: DozeConfig;
  /** The artifact store shared by hosts and gateways (a directory every one mounts), its caches and its collector. */
  artifacts: ArtifactStoreConfig;
}

export const fleetAgentEnv = z.object({
  HOST_ID: vars.optStr({ type: "id (`host_…`)", default: "derived once from the data directory (`DATA_DIR/host-id`)", doc: "this host's id" }),
  DRIVER: vars.oneOf(["auto", "qemu", "process", "firecracker"] as const, {
    fallback: "auto",
    doc: "the VM driver; `auto`: qemu where QEMU and the guest image are usable (`npm start` first installs QEMU as root on Debian or Ubuntu and builds the image), else process; `process` skips all of that; `qemu` provisions the same way but stops where QEMU cannot be had",
  }),
  WAKE_QUEUE_LIMIT: vars.int({ fallback: 1000, min: 1, unit: "calls", doc: "calls that may wait for one agent's wake; beyond: `503 queue_full`" }),
  WAKE_DEADLINE_MS: vars.int({ fallback: 60_000, min: 100, unit: "ms", doc: "how long a call waits for a wake; then `503 wake_failed`" }),
  REAPER_INTERVAL_MS: vars.int({ fallback: 1000, min: 10, unit: "ms", doc: "how often the idle reaper looks at running VMs" }),
  CPU_BUSY_PERCENT: vars.int({
    fallback: 20,
    min: 1,
    max: 10_000,
    unit: "% of one core",
    doc: "guest CPU over the last reaper window that counts as work (keeps the VM awake)",
  }),
  METER_HEARTBEAT_MS: vars.int({
    fallback: 10_000,
    min: 100,
    unit: "ms",
    doc: "longest open meter segment: a host crash loses at most this much metered time",
  }),
  HIBERNATE_RETRY_MS: vars.int({
    fallback: 30_000,
    min: 10,
    unit: "ms",
    doc: "after a failed hibernate (a full disk, say) the VM stays awake and the idle reaper tries again after this; doubled per failure in a row",
  }),
  HIBERNATE_RETRY_MAX_MS: vars.int({
    fallback: 600_000,
    min: 10,
    unit: "ms",
    doc: "the longest wait between hibernate attempts; a successful hibernate resets it",
  }),
  LOG_MAX_BYTES: vars.int({
    fallback: 4_194_304,
    min: 4096,
    unit: "bytes",
    doc: "an agent's log (console + workload output) past this size is rotated: copied to `<log>.1` (the one older generation kept), then emptied in place",
  }),
  LOG_ROTATE_INTERVAL_MS: vars.int({
    fallback: 2000,
    min: 10,
    unit: "ms",
    doc: "how often the host looks at its awake agents' logs (and at one on every read); a log passes its limit by at most what the agent writes meanwhile",
  }),
  DOZE_AFTER_MS: vars.int({
    fallback: 200,
    min: 0,
    unit: "ms",
    doc: "a running VM dozes (its vCPUs stop, its connections stay) once, for this long, every call it has open waited on an outbound call through the egress proxy with no answer byte, no inbound byte, no lease and an idle guest CPU; `0`: VMs never doze",
  }),
  DOZE_MAX_MS: vars.int({
    fallback: 60_000,
    min: 100,
    unit: "ms",
    doc: "the longest doze: then the VM runs again (its own timers get a turn) and may doze again after `DOZE_AFTER_MS`",
  }),
});

export type FleetAgentSettings = z.output<typeof fleetAgentEnv> &
  z.output<typeof upstreamEnv> &
  z.output<typeof shutdownEnv> &
  z.output<typeof artifactStoreEnv>;

export function fleetAgentConfigOf(v: FleetAgentSettings): FleetAgentConfig {
  return {
    hostId: v.HOST_ID,
    driver: v.DRIVER,
    wakeQueueLimit: v.WAKE_QUEUE_LIMIT,
    wakeDeadlineMs: v.WAKE_DEADLINE_MS,
    reaperIntervalMs: v.REAPER_INTERVAL_MS,
    cpuBusyThreshold: v.CPU_BUSY_PERCENT / 100,
    drainTimeoutMs: v.DRAIN_TIMEOUT_MS,
    meterHeartbeatMs: v.METER_HEARTBEAT_MS,
    hibernateRetry: { initialMs: v.HIBERNATE_RETRY_MS, maxMs: v.HIBERNATE_RETRY_MAX_MS },
    logs: { maxBytes: v.LOG_MAX_BYTES, rotateIntervalMs: v.LOG_ROTATE_INTERVAL_MS },
    upstream: { connectTimeoutMs: v.UPSTREAM_CONNECT_TIMEOUT_MS, headersTimeoutMs: v.UPSTREAM_HEADERS_TIMEOUT_MS },
    doze: { afterMs: v.DOZE_AFTER_MS, maxMs: v.DOZE_MAX_MS },
    artifacts: artifactStoreConfigOf(v),
  };
}

const allFleetAgentEnv = z.object({ ...fleetAgentEnv.shape, ...upstreamEnv.shape, ...shutdownEnv.shape, ...artifactStoreEnv.shape });

/** The host's config from these variables alone (tests that assemble a host themselves). */
export function parseFleetAgentConfig(env: Env): FleetAgentConfig {
  return fleetAgentConfigOf(parseEnv(allFleetAgentEnv, env));
}

// The fleet-agent's configuration, parsed once from the environment at a program's edge.
import { int, oneOf, optStr, type Env } from "../lib/env.ts";
import type { LocalFleetOptions } from "./local-fleet.ts";
import type { DriverChoice } from "./drivers/select.ts";
import type { HibernateRetry } from "./reaper.ts";
import type { LogLimits } from "./agent-logs.ts";

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
  /** The artifact store shared by hosts (a directory every host mounts); no `storeDir`: snapshots stay on their host. */
  artifacts: { storeDir: string | undefined; cacheDir: string | undefined };
}

/**
 * | variable | default | meaning |
 * | HOST_ID | derived from the data directory | this host's id (`host_…`) |
 * | DRIVER | auto (qemu when QEMU and the guest image are usable, else process) | qemu, process or firecracker |
 * | WAKE_QUEUE_LIMIT | 1000 | requests that may wait for one agent's wake; more get 503 |
 * | WAKE_DEADLINE_MS | 60000 | how long a request waits for a wake before 503 |
 * | REAPER_INTERVAL_MS | 1000 | how often idle VMs are looked for, ms |
 * | CPU_BUSY_PERCENT | 20 | guest CPU (percent of one core) that counts as background work |
 * | DRAIN_TIMEOUT_MS | 10000 | how long shutdown waits for in-flight requests, ms |
 * | METER_HEARTBEAT_MS | 10000 | longest open meter segment: a host crash loses at most this much metered time, ms |
 * | HIBERNATE_RETRY_MS | 30000 | after a failed hibernate (a full disk) the VM stays awake; the idle reaper tries again after this, ms |
 * | HIBERNATE_RETRY_MAX_MS | 600000 | that wait doubles with each failure in a row up to this, ms; a successful hibernate resets it |
 * | LOG_MAX_BYTES | 4194304 | an agent's log (console + workload output) past this size is rotated: copied to `<log>.1` (the one older generation kept), then emptied in place; bytes |
 * | LOG_ROTATE_INTERVAL_MS | 2000 | how often the host looks at its awake agents' logs (and at one on every read), ms; a log passes its limit by at most what the agent writes meanwhile |
 * | UPSTREAM_CONNECT_TIMEOUT_MS | 5000 | connecting to an agent's port, ms (the gateway's fast path reads it too) |
 * | UPSTREAM_HEADERS_TIMEOUT_MS | 300000 | from request sent to the agent's response headers, ms (504 after; the gateway's fast path reads it too) |
 * | ARTIFACT_STORE_DIR | (unset: snapshots stay on their host) | a directory every host mounts (NFS, EFS, CephFS): each hibernation is committed there as content-addressed blobs, and an agent that moves to another host (failover, drain) starts from its last commit |
 * | ARTIFACT_CACHE_DIR | `<DATA_DIR>/artifact-cache` | this host's verified copies of blobs it read from the store |
 */
export function parseFleetAgentConfig(env: Env): FleetAgentConfig {
  return {
    hostId: optStr(env, "HOST_ID"),
    driver: oneOf(env, "DRIVER", ["auto", "qemu", "process", "firecracker"] as const, "auto"),
    wakeQueueLimit: int(env, "WAKE_QUEUE_LIMIT", 1000, { min: 1 }),
    wakeDeadlineMs: int(env, "WAKE_DEADLINE_MS", 60_000, { min: 100 }),
    reaperIntervalMs: int(env, "REAPER_INTERVAL_MS", 1000, { min: 10 }),
    cpuBusyThreshold: int(env, "CPU_BUSY_PERCENT", 20, { min: 1, max: 10_000 }) / 100,
    drainTimeoutMs: int(env, "DRAIN_TIMEOUT_MS", 10_000, { min: 0 }),
    meterHeartbeatMs: int(env, "METER_HEARTBEAT_MS", 10_000, { min: 100 }),
    hibernateRetry: {
      initialMs: int(env, "HIBERNATE_RETRY_MS", 30_000, { min: 10 }),
      maxMs: int(env, "HIBERNATE_RETRY_MAX_MS", 600_000, { min: 10 }),
    },
    logs: {
      maxBytes: int(env, "LOG_MAX_BYTES", 4_194_304, { min: 4096 }),
      rotateIntervalMs: int(env, "LOG_ROTATE_INTERVAL_MS", 2000, { min: 10 }),
    },
    upstream: {
      connectTimeoutMs: int(env, "UPSTREAM_CONNECT_TIMEOUT_MS", 5000, { min: 100 }),
      headersTimeoutMs: int(env, "UPSTREAM_HEADERS_TIMEOUT_MS", 300_000, { min: 100 }),
    },
    artifacts: { storeDir: optStr(env, "ARTIFACT_STORE_DIR"), cacheDir: optStr(env, "ARTIFACT_CACHE_DIR") },
  };
}

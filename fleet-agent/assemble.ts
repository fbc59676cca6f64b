// Builds one host's runtime (host core, its meter, the in-process fleet) and its row in the hosts table, the same way for the daemon and the all-in-one.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Clock } from "../lib/clock.ts";
import { newId } from "../lib/ids.ts";
import type { Logger } from "../lib/log.ts";
import type { Metrics } from "../lib/metrics.ts";
import type { Db } from "../schema/db.ts";
import type { FleetAgentConfig } from "./config.ts";
import type { VmDriver } from "./drivers/driver.ts";
import { eq, sql } from "drizzle-orm";
import type { SegmentSink } from "../contracts/meter.ts";
import { hosts } from "../schema/core.ts";
import { Host, vmIdFor } from "./host.ts";
import { createLocalFleet, type LocalFleet } from "./local-fleet.ts";
import { Meter } from "./meter/index.ts";
import { createDbHostStore } from "./store.ts";
import { createSpooledHostStore, eventSpoolDir } from "./store-spool.ts";
import { startCrashRecovery } from "./recovery.ts";
import { createDbCheckpointStore } from "./checkpoints.ts";
import type { ImageLocator } from "../contracts/image.ts";

export interface HostRuntime {
  hostId: string;
  host: Host;
  meter: Meter;
  fleet: LocalFleet;
  /**
   * Shutdown order: the host refuses new calls, drains in-flight ones (bounded), hibernates its VMs, lets the
   * driver release what it holds and flushes its event log (hibernating closes open WebSockets with 1001) → the
   * meter closes open segments (reason shutdown) and ships what it can (the spool keeps the rest for the next
   * start) → relayed WebSockets still open are closed, pooled agent connections close.
   */
  stop(): Promise<void>;
}

/** The host id configured, or the one this data directory got the first time (kept in `<dataDir>/host-id`). */
export function resolveHostId(configured: string | undefined, dataDir: string): string {
  if (configured) return configured;
  const path = join(dataDir, "host-id");
  if (existsSync(path)) return readFileSync(path, "utf8").trim();
  const id = newId("host");
  writeFileSync(path, id + "\n");
  return id;
}

export async function startHostRuntime(opts: {
  cfg: FleetAgentConfig;
  hostId: string;
  dataDir: string;
  db: Db;
  driver: VmDriver;
  /** Where meter segments go: billing in this process, or over HTTP. */
  sink: SegmentSink;
  /** Built images' files on this host (images/build's store under the data directory). */
  images: ImageLocator;
  clock: Clock;
  log: Logger;
  /** Where the host and its meter count (wakes, snapshots, VMs, the spool); none: nowhere. */
  metrics?: Metrics;
}): Promise<HostRuntime> {
  const { cfg, hostId, dataDir, clock, log } = opts;
  const startedAt = new Date(clock.now());
  const vmsDir = join(dataDir, "hosts", hostId, "vms");
  // Every active second is metered: segments are spooled on this host's disk, then shipped to billing.
  const meter = Meter.open({ hostId, dataDir, sink: opts.sink, clock, heartbeatMs: cfg.meterHeartbeatMs, log: log.child({ component: "meter" }), metrics: opts.metrics });
  meter.start();
  // The event log outlives the database: writes it refuses as unavailable wait on disk and are replayed in order.
  const store = createSpooledHostStore(createDbHostStore(opts.db), { dir: eventSpoolDir(dataDir, hostId), clock, log: log.child({ component: "event-log" }) });
  const host = new Host({
    config: {
      hostId,
      vmsDir,
      wakeQueueLimit: cfg.wakeQueueLimit,
      wakeDeadlineMs: cfg.wakeDeadlineMs,
      reaperIntervalMs: cfg.reaperIntervalMs,
      cpuBusyThreshold: cfg.cpuBusyThreshold,
      drainTimeoutMs: cfg.drainTimeoutMs,
      hibernateRetry: cfg.hibernateRetry,
      logs: cfg.logs,
    },
    driver: opts.driver,
    images: opts.images,
    store,
    clock,
    log,
    activity: meter,
    checkpoints: createDbCheckpointStore(opts.db),
    ...(opts.metrics ? { metrics: opts.metrics } : {}),
  });
  const fleet = createLocalFleet(host, log.child({ component: "relay" }), cfg.upstream);
  // Before the host takes calls: close what a crash of an earlier process left open (runs, awake agents' rows) and
  // learn which agents the next restore rolls back (fleet-agent/recovery.ts). Retried in the background when the
  // database cannot be read now. Through the host's store: what an earlier process spooled reaches the database first.
  const recovery = startCrashRecovery(
    {
      hostId,
      store,
      vmsDir,
      vmIdFor,
      lastAwakeAt: (vmId, runId) => meter.lastAwakeAt(vmId, runId),
      known: (agentId) => host.status(agentId) !== undefined,
      startedAt,
      clock,
      log: log.child({ component: "recovery" }),
    },
    (r) => host.expectRollbacks(r.rollbacks),
  );
  await recovery.firstAttempt;
  await host.start();
  return {
    hostId,
    host,
    meter,
    fleet,
    async stop() {
      recovery.stop();
      await host.stop();
      await meter.stop();
      await fleet.close();
    },
  };
}

export interface HostRow {
  id: string;
  driver: string;
  /** Memory offered to awake agents, MiB (placement's room). */
  capacityMiB: number;
  /** The ingress URL gateways reach this host at; unset for a host only its own process calls (the all-in-one). */
  url?: string;
}

/** Inserts or refreshes this host's row (a restart keeps its id): heartbeat and start time now. */
export async function registerHost(db: Db, row: HostRow): Promise<void> {
  const set = { driver: row.driver, capacityMiB: row.capacityMiB, lastHeartbeatAt: sql`now()`, startedAt: sql`now()`, ...(row.url !== undefined ? { url: row.url } : {}) };
  await db
    .insert(hosts)
    .values({ id: row.id, driver: row.driver, capacityMiB: row.capacityMiB, ...(row.url !== undefined ? { url: row.url } : {}) })
    .onConflictDoUpdate({ target: hosts.id, set });
}

/** Refreshes the host row's heartbeat every `intervalMs`; `stop()` waits for a beat in flight. */
export function startHeartbeat(db: Db, hostId: string, intervalMs: number, log: Logger): { stop(): Promise<void> } {
  let beating: Promise<unknown> = Promise.resolve();
  const timer = setInterval(() => {
    beating = db
      .update(hosts)
      .set({ lastHeartbeatAt: sql`now()` })
      .where(eq(hosts.id, hostId))
      .catch((err: unknown) => log.warn("heartbeat failed", { err: err instanceof Error ? err.message : String(err) }));
  }, intervalMs);
  return {
    async stop() {
      clearInterval(timer);
      await beating;
    },
  };
}

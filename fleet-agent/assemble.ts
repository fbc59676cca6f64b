// Builds one host's runtime (host core, its meter, the in-process fleet) the same way for the daemon and the all-in-one.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Clock } from "../lib/clock.ts";
import { newId } from "../lib/ids.ts";
import type { Logger } from "../lib/log.ts";
import type { Db } from "../schema/db.ts";
import type { FleetAgentConfig } from "./config.ts";
import type { VmDriver } from "./drivers/driver.ts";
import type { Fleet } from "./fleet.ts";
import { Host } from "./host.ts";
import { createLocalFleet } from "./local-fleet.ts";
import { Meter, type SegmentSink } from "./meter/index.ts";
import { createDbHostStore } from "./store.ts";

export interface HostRuntime {
  hostId: string;
  host: Host;
  meter: Meter;
  fleet: Fleet & { close(): Promise<void> };
  /**
   * Shutdown order: the host refuses new calls, drains in-flight ones (bounded), hibernates its VMs, lets the
   * driver release what it holds and flushes its event log → the meter closes open segments (reason shutdown)
   * and ships what it can (the spool keeps the rest for the next start) → pooled agent connections close.
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
  clock: Clock;
  log: Logger;
}): Promise<HostRuntime> {
  const { cfg, hostId, dataDir, clock, log } = opts;
  // Every active second is metered: segments are spooled on this host's disk, then shipped to billing.
  const meter = Meter.open({ hostId, dataDir, sink: opts.sink, clock, heartbeatMs: cfg.meterHeartbeatMs, log: log.child({ component: "meter" }) });
  meter.start();
  const host = new Host({
    config: {
      hostId,
      vmsDir: join(dataDir, "hosts", hostId, "vms"),
      wakeQueueLimit: cfg.wakeQueueLimit,
      wakeDeadlineMs: cfg.wakeDeadlineMs,
      reaperIntervalMs: cfg.reaperIntervalMs,
      cpuBusyThreshold: cfg.cpuBusyThreshold,
      drainTimeoutMs: cfg.drainTimeoutMs,
    },
    driver: opts.driver,
    store: createDbHostStore(opts.db),
    clock,
    log,
    activity: meter,
  });
  const fleet = createLocalFleet(host, cfg.upstream);
  await host.start();
  return {
    hostId,
    host,
    meter,
    fleet,
    async stop() {
      await host.stop();
      await meter.stop();
      await fleet.close();
    },
  };
}

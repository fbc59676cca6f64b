// Builds one host's runtime (host core, its meter, the in-process fleet) and its row in the hosts table, the same way for the daemon and the all-in-one.
import { existsSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { systemClock, type Clock } from "../lib/clock.ts";
import { AppError } from "../lib/errors.ts";
import { newId } from "../lib/ids.ts";
import type { Logger } from "../lib/log.ts";
import type { Metrics } from "../lib/metrics.ts";
import { queryRows, type Db } from "../schema/db.ts";
import type { FleetAgentConfig } from "./config.ts";
import type { VmDriver } from "./drivers/driver.ts";
import { sql } from "drizzle-orm";
import type { SegmentSink } from "../contracts/meter.ts";
import { Host, vmIdFor } from "./host.ts";
import { createLocalFleet, type LocalFleet } from "./local-fleet.ts";
import { Meter } from "./meter/index.ts";
import { createDbHostStore } from "./store.ts";
import { createSpooledHostStore, eventSpoolDir } from "./store-spool.ts";
import { startCrashRecovery } from "./recovery.ts";
import { createDbCheckpointStore } from "./checkpoints.ts";
import { createSnapshotShipper } from "./artifacts/shipper.ts";
import { createDirArtifactStore } from "./artifacts/dir-store.ts";
import { createDbCommitStore } from "./artifacts/commits.ts";
import { StoreCollector } from "./artifacts/gc.ts";
import { referencedDigests } from "./artifacts/references.ts";
import type { ImageArtifact, ImageLocator } from "../contracts/image.ts";
import { checkHostId, hostSecretPath } from "./host-identity.ts";
import { serveUpstreams, type HostUpstreams } from "./upstreams/serve.ts";
import type { ExchangeObserver } from "./egress/exchanges.ts";
import { startMallocTrim } from "../lib/node-malloc-trim.ts";

export interface HostRuntime {
  hostId: string;
  host: Host;
  meter: Meter;
  fleet: LocalFleet;
  /**
   * Shutdown order: the store's collector (its pass under way ends) → async upstream calls under way finish (bounded by the drain timeout) or lapse → the host refuses new calls, drains in-flight ones (bounded), hibernates its VMs, lets the
   * driver release what it holds and flushes its event log (hibernating closes open WebSockets with 1001) → the
   * meter closes open segments (reason shutdown) and ships what it can (the spool keeps the rest for the next
   * start) → relayed WebSockets still open are closed, pooled agent connections close.
   */
  stop(): Promise<void>;
}

/** The host id configured, or the one this data directory got the first time (kept in `<dataDir>/host-id`, written whole by rename). */
export function resolveHostId(configured: string | undefined, dataDir: string): string {
  if (configured) return checkHostId(configured);
  const path = join(dataDir, "host-id");
  if (existsSync(path)) return checkHostId(readFileSync(path, "utf8").trim());
  const id = newId("host");
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, `${id}\n`);
  renameSync(tmp, path);
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
  /** Fetches an image this host lacks from the shared store (absent: no store; compose builds it, images/build/host-images.ts). */
  fetchImage?(digest: string): Promise<ImageArtifact | undefined>;
  clock: Clock;
  log: Logger;
  /** Where the host and its meter count (wakes, snapshots, VMs, the spool); none: nowhere. */
  metrics?: Metrics;
  /** The driver's upstream path to serve (a qemu driver's egress proxy), with its key; none: VMs here reach no upstreams. */
  upstreams?: HostUpstreams;
  /** The driver's egress proxy's observer (drivers/select.ts), bound here to the host's doze once the host exists. */
  exchanges?: { bind(target: ExchangeObserver): void };
}): Promise<HostRuntime> {
  const { cfg, hostId, dataDir, clock, log } = opts;
  const startedAt = new Date(clock.now());
  const vmsDir = join(dataDir, "hosts", hostId, "vms");
  // Every active second is metered: segments are spooled on this host's disk, then shipped to billing.
  const meter = Meter.open({
    hostId,
    dataDir,
    sink: opts.sink,
    clock,
    heartbeatMs: cfg.meterHeartbeatMs,
    log: log.child({ component: "meter" }),
    metrics: opts.metrics,
  });
  meter.start();
  // The event log outlives the database: writes it refuses as unavailable wait on disk and are replayed in order.
  const store = createSpooledHostStore(createDbHostStore(opts.db), { dir: eventSpoolDir(dataDir, hostId), clock, log: log.child({ component: "event-log" }) });
  // Commits go through the host's per-agent queue, and only of a VM still hibernated: a wake never changes files a commit is copying.
  let hostRef: Host | undefined;
  const artifacts = cfg.artifacts.storeDir
    ? createDirArtifactStore({
        root: cfg.artifacts.storeDir,
        cacheDir: cfg.artifacts.cacheDir ?? join(dataDir, "artifact-cache"),
        log: log.child({ component: "artifacts" }),
      })
    : undefined;
  const shipper = artifacts
    ? createSnapshotShipper({
        store: artifacts,
        commits: createDbCommitStore(opts.db),
        driver: opts.driver,
        stagingDir: join(dataDir, "hosts", hostId, "artifact-staging"),
        hostId,
        log: log.child({ component: "shipper" }),
        clock,
        exclusive: (agentId, work) => hostRef!.whileHibernated(agentId, work),
      })
    : undefined;
  if (shipper) log.info("snapshots are committed to the shared artifact store", { dir: cfg.artifacts.storeDir });
  // What no row references any more goes, on every host that has the store (passes on several hosts at once are safe).
  const collector =
    artifacts && cfg.artifacts.gcIntervalMs > 0
      ? new StoreCollector({
          store: artifacts,
          referenced: () => referencedDigests(opts.db),
          graceMs: cfg.artifacts.gcGraceMs,
          intervalMs: cfg.artifacts.gcIntervalMs,
          clock,
          log: log.child({ component: "artifact-gc" }),
        })
      : undefined;
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
      doze: cfg.doze,
      meterHeartbeatMs: cfg.meterHeartbeatMs,
    },
    driver: opts.driver,
    images: opts.images,
    ...(opts.fetchImage ? { fetchImage: opts.fetchImage } : {}),
    store,
    clock,
    log,
    activity: meter,
    checkpoints: createDbCheckpointStore(opts.db),
    ...(shipper ? { shipper } : {}),
    ...(opts.metrics ? { metrics: opts.metrics } : {}),
  });
  hostRef = host;
  const upstreams = opts.upstreams
    ? serveUpstreams(opts.upstreams, {
        db: opts.db,
        owner: (vmId) => host.vmOwner(vmId),
        hostId,
        dataDir,
        artifactStoreDir: cfg.artifacts.storeDir,
        clock,
        log,
      })
    : undefined;
  opts.exchanges?.bind(host.exchanges);
  const fleet = createLocalFleet(host, log.child({ component: "relay" }), cfg.upstream);
  // Before the host takes calls: close what a crash of an earlier process left open (runs, awake agents' rows;
  // fleet-agent/recovery.ts). Retried in the background when the database cannot be read now. Through the host's store: what an earlier process spooled reaches the database first.
  const recovery = startCrashRecovery({
    hostId,
    store,
    vmIdFor,
    lastAwakeAt: (vmId, runId) => meter.lastAwakeAt(vmId, runId),
    known: (agentId) => host.status(agentId) !== undefined,
    startedAt,
    clock,
    log: log.child({ component: "recovery" }),
  });
  await recovery.firstAttempt;
  await host.start();
  upstreams?.runner.start();
  collector?.start();
  // The process's freed memory back to the kernel now and then (lib/node-malloc-trim.c: why glibc keeps it otherwise).
  const trimmer = startMallocTrim(log.child({ component: "memory" }));
  return {
    hostId,
    host,
    meter,
    fleet,
    async stop() {
      trimmer.stop();
      recovery.stop();
      await collector?.stop();
      // Async upstream calls get the drain's time to finish; the rest lapse and are taken over (async-runner.ts).
      await upstreams?.runner.stop(cfg.drainTimeoutMs);
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
  /** sha256 (hex) of the host's secret (host-identity.ts): the row is this host's only while `hosts.secret_hash` matches it. */
  secretHash: string;
}

/** The refusal of a start whose host id is registered with another secret: what happened, and the ways out. */
function identityTaken(hostId: string, dataDir: string): AppError {
  return new AppError(
    "conflict",
    `host ${hostId} is registered by another data directory (its secret differs from the one in ${hostSecretPath(dataDir, hostId)}). ` +
      `If that host is gone for good, delete its row: \`delete from hosts where id='${hostId}'\`, or start this one with another HOST_ID`,
  );
}

/**
 * The host's clock minus the database's, ms, computed in SQL from the host's time at send (`hostNowMs`); clamped to
 * the column (an int holds ±24 days).
 */
const skewSql = (hostNowMs: number) =>
  sql`greatest(-2147483648, least(2147483647, round(${hostNowMs}::float8 - extract(epoch from now())::float8 * 1000)))::int`;

/**
 * Claims the host id before the host does anything: inserts the row (no URL yet: placement skips it) or takes one
 * whose `secret_hash` is this host's or unset (a row of an older version). Another secret: refused (`conflict`),
 * nothing written. One statement, so two processes starting at once cannot both win.
 */
export async function claimHost(db: Db, row: Omit<HostRow, "url">, opts: { dataDir: string }): Promise<void> {
  const claimed = await queryRows<{ id: string }>(
    db,
    sql`insert into hosts (id, driver, capacity_mib, secret_hash) values (${row.id}, ${row.driver}, ${row.capacityMiB}, ${row.secretHash})
        on conflict (id) do update set secret_hash = excluded.secret_hash
        where hosts.secret_hash is null or hosts.secret_hash = excluded.secret_hash
        returning id`,
  );
  if (claimed.length === 0) throw identityTaken(row.id, opts.dataDir);
}

/**
 * Inserts or refreshes this host's row (a restart keeps its id): heartbeat and start time now, the clock skew from
 * `clock` (the host's own). The row must be free or this host's (`claimHost`'s rule, in the same statement):
 * otherwise refused with `conflict` and left as it was. Answers the skew recorded.
 */
export async function registerHost(db: Db, row: HostRow, opts: { dataDir: string; clock?: Clock }): Promise<{ clockSkewMs: number }> {
  const skew = skewSql((opts.clock ?? systemClock).now());
  const url = row.url ?? null;
  const rows = await queryRows<{ clock_skew_ms: number }>(
    db,
    sql`insert into hosts (id, driver, capacity_mib, url, secret_hash, clock_skew_ms)
        values (${row.id}, ${row.driver}, ${row.capacityMiB}, ${url}, ${row.secretHash}, ${skew})
        on conflict (id) do update set driver = excluded.driver, capacity_mib = excluded.capacity_mib,
          url = ${row.url !== undefined ? sql`excluded.url` : sql`hosts.url`},
          last_heartbeat_at = now(), started_at = now(), secret_hash = excluded.secret_hash, clock_skew_ms = excluded.clock_skew_ms
        where hosts.secret_hash is null or hosts.secret_hash = excluded.secret_hash
        returning clock_skew_ms`,
  );
  if (rows.length === 0) throw identityTaken(row.id, opts.dataDir);
  return { clockSkewMs: Number(rows[0]!.clock_skew_ms) };
}

export interface HeartbeatOptions {
  /** The host's secret hash: a beat refreshes the row only while it is this host's. */
  secretHash: string;
  /** The host's own clock: its time at each beat is what the skew is measured from. */
  clock: Clock;
  /** Past this |skew| (ms) every beat logs an error: placement sends such a host no new agents (MAX_CLOCK_SKEW_MS). */
  maxSkewMs: number;
  /** The memory and number of this host's awake agents, written with each beat (what placement weighs). */
  report?(): { usedMiB: number; awakeAgents: number };
  /**
   * Awaited after each beat that refreshed the row (drain, fencing checks), told whether the host's clock is off past
   * `maxSkewMs` (the host then drains itself: gateways cannot reach it with tokens it accepts); what it throws is logged.
   */
  afterBeat?(beat: { clockSkewed: boolean }): Promise<void>;
  /** Told once when a beat found the row taken by another secret; the heartbeat has stopped by then. */
  onLost?(): void;
}

export interface Heartbeat {
  /** Beats now (after the one in flight, if any); the timer keeps its cadence. */
  beat(): Promise<void>;
  /** Stops the timer and waits for a beat in flight. */
  stop(): Promise<void>;
}

/**
 * Refreshes the host row every `intervalMs`, once at start too: the heartbeat, the host's clock skew and its load.
 * The skew is the host's time at send plus half the previous beat's round trip (the moment the database most likely
 * read `now()`), minus the database's `now()`: within a few ms on a LAN. A beat that matches no row (another process
 * took the host id) logs an error, stops the heartbeat and calls `onLost`.
 */
export function startHeartbeat(db: Db, hostId: string, intervalMs: number, log: Logger, opts: HeartbeatOptions): Heartbeat {
  const { clock } = opts;
  let halfRttMs = 0;
  let skewed = false;
  let stopped = false;
  let inFlight: Promise<void> | undefined;
  let timer: { cancel(): void } | undefined;

  async function once(): Promise<void> {
    if (stopped) return;
    let load: { usedMiB: number; awakeAgents: number } | undefined;
    try {
      load = opts.report?.();
    } catch (err) {
      log.warn("heartbeat: the host's load could not be read (sent without it)", { err: err instanceof Error ? err.message : String(err) });
    }
    const loadSet = load ? sql`, used_mib = ${Math.round(load.usedMiB)}, awake_agents = ${Math.round(load.awakeAgents)}` : sql``;
    const sentAt = clock.monotonic();
    let rows: { clock_skew_ms: number }[];
    try {
      rows = await queryRows<{ clock_skew_ms: number }>(
        db,
        sql`update hosts set last_heartbeat_at = now(), clock_skew_ms = ${skewSql(clock.now() + halfRttMs)}${loadSet}
            where id = ${hostId} and secret_hash = ${opts.secretHash}
            returning clock_skew_ms`,
      );
    } catch (err) {
      log.warn("heartbeat failed", { err: err instanceof Error ? err.message : String(err) });
      return;
    }
    halfRttMs = Math.max(0, (clock.monotonic() - sentAt) / 2);
    if (rows.length === 0) {
      stopped = true;
      timer?.cancel();
      log.error(
        `another process took host ${hostId}'s row (its secret differs from this host's): this host stops heartbeating and gets no new agents; stop it, or restart it with another HOST_ID`,
        { hostId },
      );
      opts.onLost?.();
      return;
    }
    const skewMs = Number(rows[0]!.clock_skew_ms);
    if (Math.abs(skewMs) > opts.maxSkewMs) {
      skewed = true;
      log.error(
        `this host's clock is ${Math.abs(skewMs)} ms ${skewMs > 0 ? "ahead of" : "behind"} the database's (allowed ${opts.maxSkewMs} ms): it takes no new agents and drains its own until fixed`,
        { clockSkewMs: skewMs, maxClockSkewMs: opts.maxSkewMs },
      );
    } else if (skewed) {
      skewed = false;
      log.info(`this host's clock is back within ${opts.maxSkewMs} ms of the database's`, { clockSkewMs: skewMs });
    }
    try {
      await opts.afterBeat?.({ clockSkewed: skewed });
    } catch (err) {
      log.error("heartbeat: afterBeat failed", { err: err instanceof Error ? err.message : String(err) });
    }
  }

  function beat(): Promise<void> {
    const next = (inFlight ?? Promise.resolve())
      .then(once)
      .catch((err: unknown) => log.error("heartbeat: a beat failed unexpectedly", { err: err instanceof Error ? err.message : String(err) }));
    const mine = next.finally(() => {
      if (inFlight === mine) inFlight = undefined;
    });
    inFlight = mine;
    return mine;
  }

  // A fixed cadence; a beat still in flight (a slow database) is not doubled.
  function arm(): void {
    if (stopped) return;
    timer = clock.setTimeout(() => {
      if (!inFlight) void beat();
      arm();
    }, intervalMs);
  }

  void beat();
  arm();
  return {
    beat,
    async stop() {
      stopped = true;
      timer?.cancel();
      await inFlight;
    },
  };
}

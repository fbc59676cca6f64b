// Ships spooled segments to billing in batches, retrying with exponential backoff, and trims the spool only on acknowledgement.
import type { Clock } from "../../lib/clock.ts";
import { silentLogger, type Logger } from "../../lib/log.ts";
import { noopMetrics, type Metrics } from "../../lib/metrics.ts";
import type { IngestResult, MeterSegment, SegmentSink } from "../../contracts/meter.ts";

/** Billing's answer to a batch: every id accepted, a duplicate (already counted) or rejected for good. */
export type ShipResult = IngestResult;
export type { SegmentSink };

/** What the shipper needs from the spool. */
export interface ShippableSpool {
  shippable(limit: number): MeterSegment[];
  ack(ids: Iterable<string>): Promise<void>;
  synced(): Promise<void>;
  recordRejected?(rejections: ShipResult["rejected"], batch: readonly MeterSegment[]): void;
}

export interface ShipperOptions {
  spool: ShippableSpool;
  sink: SegmentSink;
  clock: Clock;
  log?: Logger;
  /** Segments per request (billing accepts up to 10,000). Default 1000. */
  batchSize?: number;
  /** Wait this long after new segments before shipping, to batch them. Default 1 s. */
  lingerMs?: number;
  /** First retry delay after a failure, doubled per consecutive failure up to `maxBackoffMs`. Defaults 1 s and 60 s. */
  minBackoffMs?: number;
  maxBackoffMs?: number;
  /** Jitter source in [0, 1); the delay is scaled by 0.5–1.0 so many hosts do not retry in lockstep. */
  random?: () => number;
  /** Failed shipments are counted here; none: `noopMetrics`. */
  metrics?: Metrics;
}

export interface ShipperStats {
  accepted: number;
  duplicates: number;
  rejected: number;
  failures: number;
  consecutiveFailures: number;
  lastError: string | undefined;
}

export class Shipper {
  private readonly o: Required<Omit<ShipperOptions, "log" | "metrics">> & { log: Logger; metrics: Metrics };
  private timer: { cancel(): void } | undefined;
  private timerAt = Number.POSITIVE_INFINITY;
  private running: Promise<boolean> | undefined;
  private started = false;
  readonly stats: ShipperStats = { accepted: 0, duplicates: 0, rejected: 0, failures: 0, consecutiveFailures: 0, lastError: undefined };

  constructor(opts: ShipperOptions) {
    this.o = {
      batchSize: 1000,
      lingerMs: 1000,
      minBackoffMs: 1000,
      maxBackoffMs: 60_000,
      random: Math.random,
      ...opts,
      log: opts.log ?? silentLogger,
      metrics: opts.metrics ?? noopMetrics,
    };
  }

  /** Ships what the spool already holds (a restart's leftovers), then whatever `notify` announces. */
  start(): void {
    this.started = true;
    this.schedule(0);
  }

  /** New segments are durable: ship them after the linger delay (unless a backoff is pending). */
  notify(): void {
    if (this.started && this.stats.consecutiveFailures === 0) this.schedule(this.o.lingerMs);
  }

  stop(): void {
    this.started = false;
    this.timer?.cancel();
    this.timer = undefined;
    this.timerAt = Number.POSITIVE_INFINITY;
  }

  /** Ships everything now, batch after batch, until the spool is empty (true) or a shipment fails (false). */
  async flush(): Promise<boolean> {
    if (this.running) await this.running;
    await this.o.spool.synced();
    return this.runOnce();
  }

  private schedule(delayMs: number): void {
    const at = this.o.clock.monotonic() + delayMs;
    if (this.timer && this.timerAt <= at) return; // an earlier run is already due
    this.timer?.cancel();
    this.timerAt = at;
    this.timer = this.o.clock.setTimeout(() => {
      this.timer = undefined;
      this.timerAt = Number.POSITIVE_INFINITY;
      void this.runOnce();
    }, delayMs);
  }

  private runOnce(): Promise<boolean> {
    if (this.running) return this.running;
    const run = this.shipAll().finally(() => {
      this.running = undefined;
    });
    this.running = run;
    return run;
  }

  private async shipAll(): Promise<boolean> {
    for (;;) {
      const batch = this.o.spool.shippable(this.o.batchSize);
      if (batch.length === 0) return true;
      let result: ShipResult;
      try {
        result = await this.o.sink.ship(batch);
      } catch (err) {
        this.failed(err, batch.length);
        return false;
      }
      const inBatch = new Set(batch.map((s) => s.id));
      const done = [...result.accepted, ...result.duplicates, ...result.rejected.map((r) => r.id)].filter((id) => inBatch.has(id));
      if (result.rejected.length > 0) {
        this.o.log.error("billing refused meter segments for good", { count: result.rejected.length, first: result.rejected[0] });
        this.o.spool.recordRejected?.(result.rejected, batch);
      }
      await this.o.spool.ack(done);
      this.stats.accepted += result.accepted.length;
      this.stats.duplicates += result.duplicates.length;
      this.stats.rejected += result.rejected.length;
      if (done.length === 0) {
        this.failed(new Error("billing acknowledged none of the batch"), batch.length);
        return false;
      }
      if (this.stats.consecutiveFailures > 0) this.o.log.info("meter shipping recovered", { afterFailures: this.stats.consecutiveFailures });
      this.stats.consecutiveFailures = 0;
      this.stats.lastError = undefined;
    }
  }

  private failed(err: unknown, batchSize: number): void {
    this.stats.failures++;
    this.o.metrics.inc("agentvm_meter_ship_failures_total", {});
    this.stats.consecutiveFailures++;
    this.stats.lastError = err instanceof Error ? err.message : String(err);
    const base = Math.min(this.o.maxBackoffMs, this.o.minBackoffMs * 2 ** (this.stats.consecutiveFailures - 1));
    const delay = Math.round(base * (0.5 + this.o.random() / 2));
    this.o.log.warn("meter shipping failed; will retry", {
      err: this.stats.lastError,
      batchSize,
      retryInMs: delay,
      consecutiveFailures: this.stats.consecutiveFailures,
    });
    if (this.started) {
      this.timer?.cancel();
      this.timer = undefined;
      this.timerAt = Number.POSITIVE_INFINITY;
      this.schedule(delay);
    }
  }
}

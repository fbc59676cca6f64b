// The host's meter: cuts every VM's awake time into heartbeat segments (wall-anchored, monotonic-measured), active or dozing, and spools them.
import type { Clock } from "../../lib/clock.ts";
import { silentLogger, type Logger } from "../../lib/log.ts";
import { noopMetrics, seconds, type Metrics } from "../../lib/metrics.ts";
import type { ActivityDoze, ActivityEnd, ActivityListener, ActivityStart } from "../activity.ts";
import { segmentId, type MeterSegment, type SegmentEndReason, type SegmentStartReason, type SegmentState } from "../../contracts/meter.ts";
import { Shipper, type SegmentSink, type ShipperOptions } from "./shipper.ts";
import { meterDir, SegmentSpool, type SegmentLog } from "./spool.ts";

export const defaultHeartbeatMs = 10_000;

/** What the meter drives besides the spool (the shipper, or nothing in unit tests). */
export interface MeterShipping {
  start(): void;
  stop(): void;
  flush(): Promise<boolean>;
}

export interface MeterOptions {
  hostId: string;
  /** The host's clock: the same monotonic source as the `mono` of activity events. */
  clock: Clock;
  spool: SegmentLog & { close?(): Promise<void> };
  shipping?: MeterShipping;
  /** A VM's open segment is closed at least this often, bounding what a crash can lose. Default 10 s. */
  heartbeatMs?: number;
  log?: Logger;
}

interface OpenRun {
  info: ActivityStart;
  /** Wall time of the run's start (ms) and the monotonic time it corresponds to. */
  wall: number;
  mono: number;
  /** Where the current segment starts, in whole ms after `wall`. */
  cut: number;
  startReason: SegmentStartReason;
  /** Whether the current segment is dozing time (the VM's vCPUs stopped) or active time. */
  state: SegmentState;
  /** True once a segment of this run was spooled: until then the next segment still starts with the wake reason. */
  cutOnce: boolean;
  timer: { cancel(): void } | undefined;
}

/**
 * Segments are `[wall + a, wall + b)` where `wall` is the wall clock at the run's start and `a`, `b` are
 * monotonic offsets rounded to the millisecond: consecutive segments of a run touch exactly, and setting
 * the wall clock mid-run neither invents nor loses a millisecond. The first segment of a run carries the
 * wake reason; every later one starts with why the one before it ended: `heartbeat`, or `doze`/`resume` where the
 * VM dozed (its vCPUs stopped while it waited on an outbound call) or ran again. A dozing segment carries
 * `state: "dozing"`; an active one carries no state at all, so its body is what it was before dozing existed.
 */
export class Meter implements ActivityListener {
  readonly hostId: string;
  private readonly clock: Clock;
  private readonly spool: MeterOptions["spool"];
  private readonly shipping: MeterShipping | undefined;
  private readonly heartbeatMs: number;
  private readonly log: Logger;
  private readonly open = new Map<string, OpenRun>();
  private stopped = false;
  /** Gauges read from this meter's spool: dropped when it closes. */
  private readonly unregisterGauges: (() => void)[] = [];

  constructor(opts: MeterOptions) {
    this.hostId = opts.hostId;
    this.clock = opts.clock;
    this.spool = opts.spool;
    this.shipping = opts.shipping;
    this.heartbeatMs = opts.heartbeatMs ?? defaultHeartbeatMs;
    this.log = opts.log ?? silentLogger;
    if (!(this.heartbeatMs > 0)) throw new Error("heartbeatMs must be positive");
  }

  /**
   * A meter with a file spool in `<dataDir>/hosts/<hostId>/meter/` and a shipper to `sink`; `start()` it.
   * Whatever a previous process left in the spool is shipped first.
   */
  static open(opts: {
    hostId: string;
    dataDir: string;
    sink: SegmentSink;
    clock: Clock;
    heartbeatMs?: number;
    log?: Logger;
    shipper?: Partial<Omit<ShipperOptions, "spool" | "sink" | "clock">>;
    /** The spool's depth and shipping lag (read when scraped, until the meter stops) and failed shipments. */
    metrics?: Metrics;
  }): Meter {
    const log = opts.log ?? silentLogger;
    const metrics = opts.metrics ?? noopMetrics;
    const spool = SegmentSpool.open(meterDir(opts.dataDir, opts.hostId), { log });
    const shipper = new Shipper({ ...opts.shipper, spool, sink: opts.sink, clock: opts.clock, log, metrics });
    spool.onSynced = () => shipper.notify();
    const meter = new Meter({
      hostId: opts.hostId,
      clock: opts.clock,
      spool,
      shipping: shipper,
      log,
      ...(opts.heartbeatMs !== undefined ? { heartbeatMs: opts.heartbeatMs } : {}),
    });
    const lagMs = () => {
      const oldest = spool.oldestPendingEndedAt();
      return oldest === undefined ? 0 : Math.max(0, opts.clock.now() - oldest);
    };
    meter.unregisterGauges.push(
      metrics.gauge("agentvm_meter_spool_segments", () => spool.pendingCount),
      metrics.gauge("agentvm_meter_shipping_lag_seconds", () => seconds(lagMs())),
    );
    return meter;
  }

  start(): void {
    this.stopped = false;
    this.shipping?.start();
  }

  /** Closes every open segment (`shutdown`), ships what billing will take now, and closes the spool. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    const mono = this.clock.monotonic();
    for (const vmId of [...this.open.keys()]) this.close(vmId, mono, "shutdown");
    this.stopped = true;
    if (this.shipping) {
      const empty = await this.shipping.flush().catch(() => false);
      if (!empty) this.log.warn("meter stopped with segments still spooled; the next start ships them");
      this.shipping.stop();
    }
    await this.spool.close?.();
    for (const unregister of this.unregisterGauges.splice(0)) unregister();
  }

  /** VMs with an open segment. */
  get activeVms(): string[] {
    return [...this.open.keys()];
  }

  /**
   * The last instant (ms since the epoch) the meter recorded `vmId` awake in run `runId`: the end of that run's last
   * spooled segment, kept across restarts and after shipping. Undefined when the spool has no segment of that run
   * (it crashed within its first heartbeat).
   */
  lastAwakeAt(vmId: string, runId: string): number | undefined {
    const last = this.spool.lastEnded?.(vmId);
    return last?.runId === runId ? last.endedAt : undefined;
  }

  active(e: ActivityStart): void {
    if (this.stopped) {
      this.log.warn("meter: activity after stop ignored", { vmId: e.vmId });
      return;
    }
    if (e.hostId !== this.hostId)
      this.log.warn("meter: activity reported for another host id; metering under this host", { vmId: e.vmId, eventHost: e.hostId, hostId: this.hostId });
    const prev = this.open.get(e.vmId);
    let wall = Math.round(e.at);
    if (prev) {
      if (prev.info.runId === e.runId && prev.info.vcpus === e.vcpus && prev.info.memMiB === e.memMiB && prev.info.agentId === e.agentId) return; // already active as such
      // the VM stayed active but its run or size changed: cut here and continue seamlessly
      const offset = this.cutAt(prev, e.mono, "heartbeat");
      prev.timer?.cancel();
      this.open.delete(e.vmId);
      wall = prev.wall + offset;
    }
    // a VM that dozes stays dozing across a change of run or size: only `doze({dozing: false})` says it runs again
    const run: OpenRun = { info: e, wall, mono: e.mono, cut: 0, startReason: e.reason, state: prev?.state ?? "active", cutOnce: false, timer: undefined };
    this.open.set(e.vmId, run);
    this.arm(e.vmId, run);
  }

  /**
   * The VM dozed (`dozing: true`) or runs again: the current segment ends here (`doze` or `resume`) and the run goes
   * on in the other state, the next segment touching it exactly. The heartbeat restarts from the cut. A repeated
   * report of the state the run is already in changes nothing.
   */
  doze(e: ActivityDoze): void {
    const run = this.open.get(e.vmId);
    if (!run) {
      this.log.debug("meter: doze for a VM without an open segment", { vmId: e.vmId, dozing: e.dozing });
      return;
    }
    const state: SegmentState = e.dozing ? "dozing" : "active";
    if (run.state === state) return;
    const reason = e.dozing ? "doze" : "resume";
    this.cutAt(run, e.mono, reason);
    run.state = state;
    // nothing spooled yet (a doze at the wake's own millisecond): the run's first segment keeps the wake reason
    if (run.cutOnce) run.startReason = reason;
    run.timer?.cancel();
    this.arm(e.vmId, run);
  }

  inactive(e: ActivityEnd): void {
    if (!this.open.has(e.vmId)) {
      this.log.debug("meter: inactive for a VM without an open segment", { vmId: e.vmId, reason: e.reason });
      return;
    }
    this.close(e.vmId, e.mono, e.reason);
    if (e.reason === "delete") this.spool.forget?.(e.vmId);
  }

  private close(vmId: string, mono: number, reason: SegmentEndReason): void {
    const run = this.open.get(vmId);
    if (!run) return;
    run.timer?.cancel();
    this.open.delete(vmId);
    this.cutAt(run, mono, reason);
  }

  private arm(vmId: string, run: OpenRun): void {
    run.timer = this.clock.setTimeout(() => {
      if (this.open.get(vmId) !== run) return;
      this.cutAt(run, this.clock.monotonic(), "heartbeat");
      this.arm(vmId, run);
    }, this.heartbeatMs);
  }

  /** Closes the run's current segment at monotonic time `mono`; returns the new cut offset. */
  private cutAt(run: OpenRun, mono: number, endReason: SegmentEndReason): number {
    const offset = Math.max(run.cut, Math.round(mono - run.mono));
    if (offset > run.cut) {
      const seq = this.spool.nextSeq(run.info.vmId);
      const segment: MeterSegment = {
        id: segmentId(this.hostId, run.info.vmId, seq),
        hostId: this.hostId,
        vmId: run.info.vmId,
        seq,
        tenantId: run.info.tenantId,
        agentId: run.info.agentId,
        runId: run.info.runId,
        startedAt: new Date(run.wall + run.cut).toISOString(),
        endedAt: new Date(run.wall + offset).toISOString(),
        vcpus: run.info.vcpus,
        memMiB: run.info.memMiB,
        startReason: run.startReason,
        endReason,
        // only dozing segments say their state: active ones stay byte-identical to those spooled before dozing existed
        ...(run.state === "dozing" ? { state: "dozing" as const } : {}),
      };
      try {
        this.spool.append(segment);
      } catch (err) {
        this.log.error("meter: could not spool a segment; it is lost", { err, id: segment.id });
      }
      run.startReason = "heartbeat";
      run.cutOnce = true;
    }
    run.cut = offset;
    return offset;
  }
}

// The doze (issue 30): a running VM whose every open call waits on an outbound call stops its vCPUs, keeping every connection, and runs again the moment anything needs it.
import type { Clock } from "../../lib/clock.ts";
import type { Logger } from "../../lib/log.ts";
import { seconds, type Metrics } from "../../lib/metrics.ts";
import type { ResumeReason } from "../../contracts/agent.ts";
import type { RunningVm, VmDriver } from "../drivers/driver.ts";
import type { ExchangeObserver } from "../egress/exchanges.ts";
import { liveLeases } from "../leases.ts";
import type { VmEntry } from "../vm-entry.ts";
import type { Lifecycle } from "./lifecycle.ts";
import type { Metering } from "./metering.ts";
import { round } from "./ms.ts";

export interface DozeConfig {
  /** How long everything must stay quiet before a VM dozes, ms; 0: VMs never doze. */
  afterMs: number;
  /** The longest doze, ms: then the VM runs (its own timers get a turn) and may doze again after `afterMs`. */
  maxMs: number;
}

export interface DozeDeps {
  clock: Clock;
  log: Logger;
  metrics: Metrics;
  driver: Pick<VmDriver, "pause" | "resume" | "cpuSeconds" | "guestLeases">;
  lifecycle: Pick<Lifecycle, "move">;
  metering: Pick<Metering, "doze">;
  config: DozeConfig;
  /** Guest CPU (fraction of one core over the quiet window) at or above which the VM is busy: no doze. */
  cpuBusyThreshold: number;
  /** The entry of the VM with this id, if this host has one. */
  entryOf(vmId: string): VmEntry | undefined;
  /** Whether something else is about to need the VM as it is (checkpoint work queued, the host stopping): no doze. */
  held(entry: VmEntry): boolean;
  /** A VM that could not run again is ended as a crash: run and meter ended, `failed`, its process stopped. */
  crashed(entry: VmEntry, vm: RunningVm, detail: Record<string, unknown>): void;
}

/** After a pause that failed, the VM is not paused again for this long, ms (the log is not flooded). */
const PAUSE_RETRY_MS = 10_000;

/** An exchange's state in a track: its request went out and no answer came yet, or its answer has started. */
const WAITING = 1;
const ANSWERING = 2;

/** What the controller knows of one VM with outbound exchanges. */
interface Track {
  readonly vmId: string;
  entry: VmEntry;
  /** Exchange id → WAITING | ANSWERING. */
  readonly exchanges: Map<string, number>;
  waiting: number;
  /** Monotonic ms of the last thing that ends a quiet window: answer bytes, the first exchange to wait, a resume. */
  busyAt: number;
  /** The one timer of the VM: the next look while it runs, the `maxMs` bound while it dozes. */
  timer: { cancel(): void } | undefined;
  /** Guest CPU seconds at the start of the window being judged (per window: `window` numbers them). */
  cpuFrom: { at: number; seconds: number; window: number } | undefined;
  window: number;
  checking: boolean;
  /** Monotonic ms of the last pause that failed (the retry waits `PAUSE_RETRY_MS`). */
  pauseFailedAt: number | undefined;
  pausing: Promise<void> | undefined;
  resuming: Promise<void> | undefined;
}

/**
 * The doze rule and its controller. A running, settled VM (no wake, snapshot or checkpoint work under way) dozes when,
 * continuously for `afterMs`: at least one outbound exchange waits (its request out, its answer not started), no
 * exchange got answer bytes, no inbound call moved a byte (a call waiting for the agent's answer is fine: that is the
 * point), no API or guest lease is held, and the guest's CPU stayed below the busy threshold. Everything is looked at
 * again right before the pause. The VM runs again on: an exchange's answer (`upstream`: the proxy writes the bytes
 * after the resume), an exchange that ends, a new inbound call or a byte of an open one (`request`/`webhook`), an API
 * wake or lease, work that needs it (a snapshot, a checkpoint, a drain, shutdown: `api`), and `maxMs` (`doze_max`).
 * One resume at a time per VM, shared by every trigger; a resume asked while the pause is in flight waits for it.
 */
export class DozeController implements ExchangeObserver {
  private readonly deps: DozeDeps;
  private readonly tracks = new Map<string, Track>();
  /** Whether VMs here may doze at all: the driver can pause and resume, and the rule is on. */
  readonly enabled: boolean;

  constructor(deps: DozeDeps) {
    this.deps = deps;
    this.enabled = deps.config.afterMs > 0 && deps.driver.pause !== undefined && deps.driver.resume !== undefined;
  }

  waiting(vmId: string, exchangeId: string): void {
    if (!this.enabled) return;
    let t = this.tracks.get(vmId);
    if (t === undefined) {
      const entry = this.deps.entryOf(vmId);
      if (entry === undefined) return;
      t = {
        vmId,
        entry,
        exchanges: new Map(),
        waiting: 0,
        busyAt: 0,
        timer: undefined,
        cpuFrom: undefined,
        window: 0,
        checking: false,
        pauseFailedAt: undefined,
        pausing: undefined,
        resuming: undefined,
      };
      this.tracks.set(vmId, t);
    }
    if (t.exchanges.get(exchangeId) === WAITING) return;
    t.exchanges.set(exchangeId, WAITING);
    if (++t.waiting > 1) return;
    t.busyAt = this.deps.clock.monotonic(); // the quiet window starts with the first exchange that waits
    if (t.timer === undefined && !t.checking && t.entry.state === "running") this.arm(t, this.deps.config.afterMs);
  }

  // On every chunk of every answer: a map look-up and a few field writes, nothing allocated.
  answer(vmId: string, exchangeId: string): Promise<void> | undefined {
    const t = this.tracks.get(vmId);
    if (t === undefined) return undefined;
    t.busyAt = this.deps.clock.monotonic();
    if (t.exchanges.get(exchangeId) === WAITING) {
      t.exchanges.set(exchangeId, ANSWERING);
      t.waiting--;
    }
    if (t.entry.state === "dozing" || t.pausing !== undefined) return this.resume(t, "upstream");
    return undefined;
  }

  ended(vmId: string, exchangeId: string): void {
    const t = this.tracks.get(vmId);
    if (t === undefined) return;
    const state = t.exchanges.get(exchangeId);
    if (state === undefined) return;
    t.exchanges.delete(exchangeId);
    if (state === WAITING) t.waiting--;
    // The far end closed (or failed): the guest must run to hear it.
    if (t.entry.state === "dozing" || t.pausing !== undefined) void this.resume(t, "upstream");
    else if (t.exchanges.size === 0 && t.resuming === undefined) this.drop(t);
  }

  /**
   * The VM is needed (an inbound call, an API wake or lease, a snapshot, a checkpoint, shutdown): resolves once it runs
   * (or has ended: a failed resume is a crash). Undefined, at the cost of a field read, when it neither dozes nor is
   * being paused: the caller goes on at once.
   */
  resumeFor(entry: VmEntry, reason: ResumeReason): Promise<void> | undefined {
    if (!this.enabled) return undefined;
    const t = this.tracks.get(entry.vmSpec.vmId);
    if (t === undefined || (entry.state !== "dozing" && t.pausing === undefined)) return undefined;
    return this.resume(t, reason);
  }

  /** A pause or resume under way on the VM: the idle reaper leaves it alone this pass. */
  busy(entry: VmEntry): boolean {
    const t = this.tracks.get(entry.vmSpec.vmId);
    return t !== undefined && (t.pausing !== undefined || t.resuming !== undefined);
  }

  /** The VM stopped without a resume (a crash, a delete, an eviction): its timer and doze end; the meter is the caller's. */
  left(entry: VmEntry): void {
    entry.dozed.end(this.deps.clock.monotonic());
    const t = this.tracks.get(entry.vmSpec.vmId);
    if (t && t.entry === entry) this.drop(t);
  }

  /** VMs being looked at (tests, the status): how many tracks the controller keeps. */
  tracked(): number {
    return this.tracks.size;
  }

  private drop(t: Track): void {
    t.timer?.cancel();
    t.timer = undefined;
    if (this.tracks.get(t.vmId) === t) this.tracks.delete(t.vmId);
  }

  /** The next look in `ms`, with the guest's CPU time taken now as the start of the window it judges. */
  private arm(t: Track, ms: number): void {
    t.timer?.cancel();
    t.timer = this.deps.clock.setTimeout(() => {
      t.timer = undefined;
      void this.check(t);
    }, ms);
    const vm = t.entry.running;
    if (!vm) return;
    const window = ++t.window;
    const at = this.deps.clock.monotonic();
    t.cpuFrom = undefined;
    this.deps.driver.cpuSeconds(vm).then(
      (s) => {
        if (t.window === window) t.cpuFrom = { at, seconds: s, window };
      },
      () => undefined,
    );
  }

  /** Looks again later while an exchange waits on a VM that may run (no timer for one that sleeps: its exchanges end). */
  private later(t: Track, ms: number): void {
    const s = t.entry.state;
    if (t.waiting > 0 && (s === "running" || s === "booting" || s === "restoring" || s === "snapshotting")) this.arm(t, Math.max(1, ms));
    else if (t.exchanges.size === 0) this.drop(t);
  }

  /**
   * What keeps the VM from dozing now, as the ms to wait before looking again (0: nothing does). Synchronous: it is
   * asked before the driver is, and again right before the pause.
   */
  private blockedFor(t: Track, now: number): number {
    const { entry } = t;
    const { afterMs } = this.deps.config;
    if (entry.state !== "running" || !entry.running || entry.wake || entry.hibernation || t.resuming || t.pausing || this.deps.held(entry)) return afterMs;
    if (t.waiting === 0) return afterMs;
    let wait = t.busyAt + afterMs - now;
    if (t.pauseFailedAt !== undefined) wait = Math.max(wait, t.pauseFailedAt + PAUSE_RETRY_MS - now);
    for (const ticket of entry.tickets) wait = Math.max(wait, ticket.lastByteAt + afterMs - now);
    if (wait > 0) return wait;
    if (liveLeases(entry, now) > 0) return afterMs;
    return 0;
  }

  private async check(t: Track): Promise<void> {
    const { clock, driver, config } = this.deps;
    const blocked = this.blockedFor(t, clock.monotonic());
    if (blocked > 0) return this.later(t, blocked);
    const vm = t.entry.running!;
    const from = t.cpuFrom;
    t.checking = true;
    let busyCpu = false;
    let guestLeases = 0;
    try {
      const cpuNow = await driver.cpuSeconds(vm).catch(() => undefined);
      const at = clock.monotonic();
      if (from && cpuNow !== undefined && at > from.at) busyCpu = (cpuNow - from.seconds) / ((at - from.at) / 1000) >= this.deps.cpuBusyThreshold;
      if (!busyCpu) guestLeases = await driver.guestLeases(vm).catch(() => 0);
    } finally {
      t.checking = false;
    }
    if (busyCpu || guestLeases > 0) return this.later(t, config.afterMs);
    // While the driver answered, an answer may have come, a call arrived, a snapshot begun: everything again.
    const again = this.blockedFor(t, clock.monotonic());
    if (again > 0 || t.entry.running !== vm) return this.later(t, again || config.afterMs);
    await this.pause(t, vm);
  }

  private pause(t: Track, vm: RunningVm): Promise<void> {
    const { clock, driver, log, metrics, lifecycle, metering } = this.deps;
    const { entry } = t;
    const startedAt = clock.monotonic();
    t.pausing = (async () => {
      try {
        await driver.pause!(vm);
      } catch (err) {
        log.warn("pausing a VM for a doze failed: it keeps running", { agentId: entry.spec.id, vmId: t.vmId, err: errorText(err) });
        metrics.inc("agentvm_doze_failures_total", { step: "pause" });
        t.pauseFailedAt = clock.monotonic();
        return this.later(t, PAUSE_RETRY_MS);
      }
      // It crashed, was deleted or evicted meanwhile (`left`): that path recorded it.
      if (entry.running !== vm || entry.state !== "running" || this.tracks.get(t.vmId) !== t) return;
      t.pauseFailedAt = undefined;
      const now = clock.monotonic();
      entry.dozed.begin(now, () => void this.resume(t, "request"));
      lifecycle.move(entry, "doze", "doze", undefined, { waiting: t.waiting, pauseMs: round(now - startedAt) });
      metering.doze(entry, true);
      metrics.inc("agentvm_dozes_total", {});
      t.timer?.cancel();
      t.timer = clock.setTimeout(() => {
        t.timer = undefined;
        void this.resume(t, "doze_max");
      }, this.deps.config.maxMs);
    })().finally(() => {
      t.pausing = undefined;
    });
    return t.pausing;
  }

  private resume(t: Track, reason: ResumeReason): Promise<void> {
    if (t.resuming) return t.resuming;
    const run = async () => {
      if (t.pausing) await t.pausing;
      const { entry } = t;
      const vm = entry.running;
      if (entry.state !== "dozing" || !vm) return;
      const { clock, driver, log, metrics, lifecycle, metering } = this.deps;
      t.timer?.cancel();
      t.timer = undefined;
      const startedAt = clock.monotonic();
      let clockFixMs: number;
      try {
        ({ clockFixMs } = await driver.resume!(vm));
      } catch (err) {
        log.error("a dozing VM could not run again: it is ended as a crash", { agentId: entry.spec.id, vmId: t.vmId, reason, err: errorText(err) });
        metrics.inc("agentvm_doze_failures_total", { step: "resume" });
        if (entry.running === vm && entry.state === "dozing") this.deps.crashed(entry, vm, { error: `resume failed: ${errorText(err)}`, resumeReason: reason });
        this.left(entry);
        return;
      }
      if (entry.running !== vm || entry.state !== "dozing") return; // crashed or deleted meanwhile: that path recorded it
      const now = clock.monotonic();
      const dozeMs = entry.dozed.end(now);
      lifecycle.move(entry, "resume", reason, { dozeMs: round(dozeMs), clockFixMs: round(clockFixMs) }, { resumeMs: round(now - startedAt) });
      metering.doze(entry, false);
      metrics.observe("agentvm_doze_seconds", { reason }, seconds(dozeMs));
      t.busyAt = now;
      if (t.waiting > 0) this.arm(t, this.deps.config.afterMs);
      else if (t.exchanges.size === 0) this.drop(t);
    };
    t.resuming = run().finally(() => {
      t.resuming = undefined;
    });
    return t.resuming;
  }
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

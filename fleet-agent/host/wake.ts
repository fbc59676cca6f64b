// Waking: a call's hold on a VM (its ticket), the bounded queue and deadline in front of one single-flight wake, and the wake itself (boot, restore, or the shared store's last commit).
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { Clock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import type { Logger } from "../../lib/log.ts";
import { seconds, type Metrics } from "../../lib/metrics.ts";
import type { AgentSpec, WakeInfo, WakeReason } from "../../contracts/agent.ts";
import type { RunningVm, VmDriver } from "../drivers/driver.ts";
import { rotatedLogPath } from "../drivers/common/vm-process.ts";
import type { SnapshotShipper } from "../artifacts/shipper.ts";
import { withDeadline } from "../deadline.ts";
import type { EventLog } from "../event-log.ts";
import type { HostFs } from "../host-fs.ts";
import { removeTicket, TicketImpl, type Ticket } from "../tickets.ts";
import type { VmEntry } from "../vm-entry.ts";
import { canHappen, type Lifecycle } from "./lifecycle.ts";
import type { Metering } from "./metering.ts";
import { round } from "./ms.ts";
import { rollbackOf, type Rollback, type RunRecords } from "./rollbacks.ts";
import type { VmTable } from "./vms.ts";

/** How much of the VM's console an operator's `boot_failed` or `crash` event carries. */
const CONSOLE_TAIL_BYTES = 2048;

export interface WakingDeps {
  hostId: string;
  clock: Clock;
  log: Logger;
  metrics: Metrics;
  fs: Pick<HostFs, "tail">;
  driver: Pick<VmDriver, "reap" | "boot" | "wake" | "logPath" | "onExit" | "restoreCheckpoint">;
  events: Pick<EventLog, "hold" | "runStarted" | "runTimings">;
  lifecycle: Pick<Lifecycle, "move">;
  metering: Pick<Metering, "startActivity" | "endActivity" | "endRun">;
  vms: Pick<VmTable, "attachImage">;
  /** What tells a rollback (host/rollbacks.ts): each VM's last run, recorded at each wake, and the meter's last instants. */
  rollbacks: RollbackSources;
  /** Requests that may wait for one agent's wake before new ones get 503 queue_full. */
  wakeQueueLimit: number;
  /** How long a request waits for a wake before it gets 503 wake_failed. */
  wakeDeadlineMs: number;
  /** Where checkpoints' files go: a commit of the shared store is fetched beside them. */
  checkpointsDir: string;
  /** The shared artifact store: an agent that moved here starts from its last commit. */
  shipper?: Pick<SnapshotShipper, "materialize">;
  /** Whether the host is shutting down (no new holds). */
  stopping(): boolean;
  /** The agent's entry under the lease generation the call carries (fencing.ts). */
  leased(spec: AgentSpec): Promise<VmEntry>;
  /** The agent's entry when the call's lease generation is the one it runs under here, without waiting (fencing.ts). */
  leasedNow(spec: AgentSpec): VmEntry | undefined;
  /** Refuses a wake of an agent the database gives another host (fencing.ts). */
  ownerCheck(entry: VmEntry): Promise<void>;
  /** Whether this host drains (an operator's drain, or its clock off): a wake a caller could take elsewhere is refused. */
  draining(): boolean;
  /** Before that refusal: the agent's row says it sleeps here (fencing.ts `handOff`). */
  handOff(entry: VmEntry): Promise<void>;
  /** Settles once the checkpoint work under way on the agent has (undefined: none). */
  checkpointBusy(agentId: string): Promise<void> | undefined;
  /** Whether the agent's deletion is under way here (host/eviction.ts): no wake starts meanwhile. */
  removing(agentId: string): boolean;
  /** A ticket was released (the drain waits for the last one). */
  released(): void;
  /** A dozing VM (or one being paused) runs again for this call; undefined when it runs already (host/doze.ts). */
  resumeDozing(entry: VmEntry, reason: WakeReason): Promise<void> | undefined;
  /** The VM stopped without a resume: its doze bookkeeping ends (host/doze.ts). */
  left(entry: VmEntry): void;
}

export interface RollbackSources {
  records: RunRecords;
  /** The meter's last awake instant of a run on a VM (ms since the epoch), if it recorded any. */
  meteredUntil(vmId: string, runId: string): number | undefined;
  /** When this host process started (ms since the epoch). */
  hostStartedAt: number;
  /** The meter's heartbeat, ms: recorded with each run, it bounds the estimate of a run the meter recorded nothing of. */
  heartbeatMs?: number;
}

export class Waking {
  private readonly deps: WakingDeps;

  constructor(deps: WakingDeps) {
    this.deps = deps;
  }

  /**
   * Holds the agent's VM awake for one request, waking it first if needed. Concurrent callers share one
   * wake; callers beyond the queue limit, or still waiting at the deadline, get a 503 with Retry-After. `requestId`: the
   * call that asked (the wake it starts records it, in the event log's detail and the audit log).
   */
  async acquire(spec: AgentSpec, reason: WakeReason, requestId?: string, opts: { handOff?: boolean } = {}): Promise<Ticket> {
    if (this.deps.stopping()) throw new AppError("shutting_down", "host is shutting down", { retryAfterS: 5 });
    const entry = await this.deps.leased(spec);
    const queuedAt = this.deps.clock.monotonic();
    let ownerChecked = false;
    for (;;) {
      // While the agent's removal stops and destroys its VM, a call would be held on a VM about to stop, or a wake
      // would boot it into a directory being removed: the agent is gone for every call from the removal's start.
      if (entry.state === "destroyed" || this.deps.removing(spec.id)) throw new AppError("not_found", `agent ${spec.id} was deleted`);
      const resumed = this.deps.resumeDozing(entry, reason);
      if (resumed) {
        await resumed; // a dozing VM runs again before the call reaches it; then look again
        continue;
      }
      if (entry.state === "running" && entry.running && !entry.hibernation) {
        return this.ticket(entry, { wake: "warm", runId: entry.runId!, timings: {} });
      }
      if (entry.hibernation) {
        entry.hibernation.abort.abort();
        await entry.hibernation.promise;
        continue;
      }
      const checkpointing = this.deps.checkpointBusy(spec.id);
      if (checkpointing) {
        await checkpointing; // a restore or a fork decides what the wake brings back
        continue;
      }
      if (entry.waiting >= this.deps.wakeQueueLimit) {
        throw new AppError("queue_full", `too many requests waiting for agent ${spec.id} to wake`, { retryAfterS: 2 });
      }
      if (!entry.wake && opts.handOff && this.deps.draining()) {
        // A drain gives sleeping agents to other hosts: waking one here for a call its gateway can repeat elsewhere
        // would keep it here for as long as calls come (and its row waking, which no move takes).
        await this.deps.handOff(entry);
        throw new AppError("host_draining", `host is draining: agent ${spec.id} sleeps and is not woken here; place it again`, { retryAfterS: 1 });
      }
      if (!entry.wake && !ownerChecked) {
        // A wake is to start: ask who owns the agent first, then look again (the state may have moved meanwhile).
        await this.deps.ownerCheck(entry);
        ownerChecked = true;
        continue;
      }
      entry.waiting++;
      let info: WakeInfo;
      try {
        const ms = this.deps.wakeDeadlineMs;
        info = await withDeadline(this.deps.clock, ms, this.wakeOnce(entry, reason, requestId), () => {
          throw new AppError("wake_failed", `agent ${spec.id} did not wake within ${ms} ms`, { retryAfterS: 5 });
        });
      } finally {
        entry.waiting--;
      }
      if (entry.state !== "running" || !entry.running) continue; // hibernated again in between: go round
      const queuedMs = this.deps.clock.monotonic() - queuedAt;
      this.deps.metrics.observe("agentvm_wake_queue_seconds", { mode: info.wake }, seconds(queuedMs));
      return this.ticket(entry, { ...info, timings: { ...info.timings, queuedMs: round(queuedMs) } });
    }
  }

  /**
   * `acquire`'s warm case without a promise (most proxied calls): the VM is leased here under the call's generation
   * and runs, neither dozing (nor being paused) nor hibernating. Otherwise undefined: the caller goes through `acquire`.
   */
  acquireWarm(spec: AgentSpec, reason: WakeReason): Ticket | undefined {
    if (this.deps.stopping() || this.deps.removing(spec.id)) return undefined;
    const entry = this.deps.leasedNow(spec);
    if (entry?.state !== "running" || !entry.running || entry.hibernation) return undefined;
    // Being paused for a doze: the resume it starts is the one `acquire` then waits on (the same promise).
    if (this.deps.resumeDozing(entry, reason)) return undefined;
    return this.ticket(entry, { wake: "warm", runId: entry.runId!, timings: {} });
  }

  private ticket(entry: VmEntry, wake: WakeInfo): Ticket {
    const t = new TicketImpl(
      entry.running!.endpoint,
      wake,
      this.deps.clock,
      (done) => {
        removeTicket(entry.tickets, done);
        entry.lastActivityAt = this.deps.clock.monotonic();
        this.deps.released();
      },
      () => this.recordFirstByte(entry, wake),
      entry.dozed,
    );
    t.slot = entry.tickets.length;
    entry.tickets.push(t);
    return t;
  }

  private recordFirstByte(entry: VmEntry, wake: WakeInfo): void {
    if (wake.wake === "warm" || entry.firstByteRecorded || entry.runId !== wake.runId || entry.wakeStartedAt === undefined) return;
    entry.firstByteRecorded = true;
    const firstByteMs = round(this.deps.clock.monotonic() - entry.wakeStartedAt);
    this.deps.metrics.observe("agentvm_wake_first_byte_seconds", { mode: wake.wake }, seconds(firstByteMs));
    this.deps.events.runTimings(wake.runId, { ...wake.timings, firstByteMs });
  }

  private wakeOnce(entry: VmEntry, reason: WakeReason, requestId: string | undefined): Promise<WakeInfo> {
    entry.wake ??= this.doWake(entry, reason, requestId).finally(() => {
      entry.wake = undefined;
    });
    return entry.wake;
  }

  private async doWake(entry: VmEntry, reason: WakeReason, requestId: string | undefined): Promise<WakeInfo> {
    const { driver, clock, events, lifecycle } = this.deps;
    const startedAt = clock.monotonic();
    try {
      await this.deps.vms.attachImage(entry);
      if (!entry.reaped) {
        entry.reaped = true;
        await driver.reap(entry.vmSpec);
      }
      let info: Omit<WakeInfo, "runId">;
      let detail: Record<string, unknown> | undefined;
      /** When the state a restore brought back was taken. */
      let snapshotAt: number | undefined;
      if (entry.state === "creating" && entry.generation > 0) detail = await this.fromStore(entry, reason);
      if (entry.state === "creating") {
        const release = events.hold(); // as for a hibernation: the log's writes after the driver's steps
        lifecycle.move(entry, "boot", reason);
        const booted = await driver.boot(entry.vmSpec).finally(release);
        entry.running = booted.vm;
        info = { wake: "boot", timings: { bootMs: round(booted.bootMs) } };
        // A clone of a warm template: the run's event says which one, so a slow or odd first run can be traced to it.
        if (booted.template) detail = { template: booted.template };
      } else {
        // The log's writes (this transition's among them) after the driver's steps: with an embedded database their CPU
        // time would run at the restore's first await, before QEMU starts (4.8 ms p50 of a restore in bench:wake).
        const release = events.hold();
        lifecycle.move(entry, "restore", reason);
        const woke = await driver.wake(entry.vmSpec).finally(release);
        entry.running = woke.vm;
        const t = woke.timings;
        const clockFix = { clockFixMs: round(t.clockFixMs), skewBeforeMs: round(t.skewBeforeMs), skewAfterMs: round(t.skewAfterMs) };
        // A fallback is a boot: `bootMs` in server-timing and the run's timings; the failed attempt's share is in the detail.
        info =
          woke.mode === "boot"
            ? { wake: "boot", timings: { bootMs: round(t.bootMs ?? t.restoreMs), ...clockFix } }
            : { wake: "restore", timings: { restoreMs: round(t.restoreMs), ...clockFix, ...(woke.tier ? { tier: woke.tier } : {}) } };
        if (woke.mode === "restore") snapshotAt = woke.snapshotAt;
        if (woke.fallbackReason) detail = { ...detail, fallbackReason: woke.fallbackReason, restoreAttemptMs: round(t.restoreMs) };
      }
      const runId = newId("run");
      const wokeAt = clock.now();
      const rollback = this.moveOn(entry, runId, wokeAt, snapshotAt);
      if (rollback) {
        info = { ...info, timings: { ...info.timings, rollbackMs: rollback.lostMs } };
        detail = { ...detail, rollback: rollbackDetail(rollback) };
      }
      entry.runId = runId;
      entry.wakeStartedAt = startedAt;
      entry.firstByteRecorded = false;
      entry.lastActivityAt = clock.monotonic();
      entry.lastWakeAt = wokeAt;
      entry.cpu.reset();
      const wakeMs = round(clock.monotonic() - startedAt);
      lifecycle.move(entry, "woke", reason, { ...info.timings, wakeMs }, { wake: info.wake, ...detail, ...(requestId ? { requestId } : {}) });
      this.countWake(info, reason, wakeMs);
      events.runStarted({
        id: runId,
        agentId: entry.spec.id,
        tenantId: entry.spec.tenantId,
        hostId: this.deps.hostId,
        vmId: entry.vmSpec.vmId,
        wokeAt: new Date(entry.lastWakeAt!),
        wakeReason: reason,
        wakeMode: info.wake,
        timings: info.timings,
      });
      this.deps.metering.startActivity(entry, reason);
      this.watchExit(entry, entry.running);
      return { ...info, runId };
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      // The image did not come up (entrypoint exited, never listened, image missing): the caller hears that, not a generic wake failure.
      const bootFailed = err instanceof AppError && err.code === "boot_failed";
      this.deps.log.error("wake failed", { agentId: entry.spec.id, err: message, ...(bootFailed ? { code: "boot_failed" } : {}) });
      const detail = { error: message, ...(bootFailed ? { bootFailed: true, consoleTail: this.consoleTail(entry) } : {}) };
      if (entry.state !== "failed" && canHappen(entry.state, "fail")) lifecycle.move(entry, "fail", reason, undefined, detail);
      entry.running = undefined;
      this.deps.metrics.inc("agentvm_wake_failures_total", { reason, code: bootFailed ? "boot_failed" : "wake_failed" });
      if (bootFailed) throw new AppError("boot_failed", `agent ${entry.spec.id} did not start: ${message}`, { retryAfterS: 5, cause: err });
      throw new AppError("wake_failed", `agent ${entry.spec.id} could not be started: ${message}`, { retryAfterS: 5, cause: err });
    }
  }

  /**
   * An agent that moved here (a lease generation above 0, nothing of it on this host) starts from its last commit in
   * the shared store: the committed files become its snapshot, as a checkpoint restore does, and the wake restores it.
   * Without a commit (or a store) it boots. A commit that cannot be read (a blob missing or corrupt) fails the wake:
   * booting instead would silently start the agent without its files.
   */
  private async fromStore(entry: VmEntry, reason: WakeReason): Promise<Record<string, unknown> | undefined> {
    const { shipper, driver } = this.deps;
    if (!shipper || !driver.restoreCheckpoint) return undefined;
    // A `.tmp-` parent (what a crash leaves is swept at start); the checkpoint's own name is what the guest is told it
    // came from (`clonedFrom` in /run/agentvm/identity): `moved-g<generation>`.
    const parent = join(this.deps.checkpointsDir, `store.tmp-${newId("request").slice(4)}`);
    const dir = join(parent, `moved-g${entry.generation}`);
    mkdirSync(parent, { recursive: true });
    const started = this.deps.clock.monotonic();
    try {
      const row = await shipper.materialize(entry.spec.id, dir);
      if (!row) return undefined;
      await driver.restoreCheckpoint(entry.vmSpec, dir);
      const ms = round(this.deps.clock.monotonic() - started);
      this.deps.lifecycle.move(
        entry,
        "placeSnapshot",
        reason,
        { snapshotBytes: row.bytes },
        { fromStore: { hostId: row.hostId, generation: row.generation, snapshotAt: row.snapshotAt.toISOString(), fetchMs: ms } },
      );
      this.deps.log.info("restoring from the shared store", { agentId: entry.spec.id, fromHost: row.hostId, bytes: row.bytes, fetchMs: ms });
      return { fromStore: row.hostId };
    } finally {
      rmSync(parent, { recursive: true, force: true });
    }
  }

  /**
   * The VM's state moves on in run `runId` from `wokeAt`: recorded in its state directory before any call reaches it
   * (a host killed from here on leaves the record, and the next restore tells what it lost). Answers whether the wake
   * rolled the agent back: it restored a snapshot (taken at `snapshotAt`) older than its last recorded run's wake.
   */
  private moveOn(entry: VmEntry, runId: string, wokeAt: number, snapshotAt: number | undefined): Rollback | undefined {
    const { records, meteredUntil, hostStartedAt, heartbeatMs } = this.deps.rollbacks;
    const stateDir = entry.vmSpec.stateDir;
    const rollback = rollbackOf({
      last: records.read(stateDir),
      snapshotAt,
      meteredUntil: (id) => meteredUntil(entry.vmSpec.vmId, id),
      hostStartedAt,
      now: this.deps.clock.now(),
    });
    try {
      records.write(stateDir, { runId, wokeAt, ...(heartbeatMs !== undefined ? { heartbeatMs } : {}) });
    } catch (err) {
      this.deps.log.warn("the run could not be recorded: a rollback to before it would not be told", { agentId: entry.spec.id, err });
    }
    if (rollback) {
      this.deps.log.warn("restored a snapshot older than the agent's last state: what it did since is lost", {
        agentId: entry.spec.id,
        rollbackMs: rollback.lostMs,
        lostRunId: rollback.lostRunId,
        ...(rollback.estimated ? { estimated: true } : {}),
      });
    }
    return rollback;
  }

  /** One completed wake: its count by mode and reason, its whole duration and the parts it had. */
  private countWake(info: Omit<WakeInfo, "runId">, reason: WakeReason, wakeMs: number): void {
    const { metrics } = this.deps;
    const mode = info.wake;
    const t = info.timings;
    metrics.inc("agentvm_wakes_total", { mode, reason });
    metrics.observe("agentvm_wake_seconds", { mode }, seconds(wakeMs));
    if (t.restoreMs !== undefined) metrics.observe("agentvm_wake_restore_seconds", {}, seconds(t.restoreMs));
    if (t.bootMs !== undefined) metrics.observe("agentvm_wake_boot_seconds", {}, seconds(t.bootMs));
    if (t.clockFixMs !== undefined) metrics.observe("agentvm_wake_clock_fix_seconds", {}, seconds(t.clockFixMs));
  }

  /** The end of the VM's log, across a rotation that may just have emptied the current file. */
  private consoleTail(entry: VmEntry): string {
    const path = this.deps.driver.logPath(entry.vmSpec);
    return (this.deps.fs.tail(rotatedLogPath(path), CONSOLE_TAIL_BYTES) + this.deps.fs.tail(path, CONSOLE_TAIL_BYTES)).slice(-CONSOLE_TAIL_BYTES);
  }

  /** A VM that exits on its own (not stopped by the host) crashed: its run ends, it is `failed`, the console's tail says why. */
  private watchExit(entry: VmEntry, vm: RunningVm): void {
    this.deps.driver.onExit(vm, (exit) => {
      if (entry.running !== vm) return;
      this.deps.log.error("VM exited unexpectedly", { agentId: entry.spec.id, vmId: entry.vmSpec.vmId, ...exit });
      this.crashed(entry, vm, { ...exit });
    });
  }

  /**
   * The crash path (a VM that exited on its own, or one that could not run again after a doze): its snapshot under way
   * is aborted, its meter and run end (reason `crash`), it is `failed` with `detail` and the console's tail.
   */
  crashed(entry: VmEntry, vm: RunningVm, detail: Record<string, unknown>): void {
    if (entry.running !== vm) return;
    entry.hibernation?.abort.abort();
    if (entry.state === "running" || entry.state === "dozing") this.deps.metering.endActivity(entry, "crash");
    entry.running = undefined;
    this.deps.left(entry);
    if (canHappen(entry.state, "fail")) this.deps.lifecycle.move(entry, "fail", "crash", undefined, { ...detail, consoleTail: this.consoleTail(entry) });
    this.deps.metering.endRun(entry, "crash");
  }
}

/** A rollback as the running transition's detail says it. */
function rollbackDetail(r: Rollback): Record<string, unknown> {
  return {
    rollbackMs: r.lostMs,
    lostRunId: r.lostRunId,
    lastAwakeAt: new Date(r.lastAwakeAt).toISOString(),
    snapshotAt: new Date(r.snapshotAt).toISOString(),
    ...(r.estimated ? { estimated: true } : {}),
  };
}

// The host core: owns this host's VMs, wakes them single-flight, and orchestrates their hibernation and removal.
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import type { Clock } from "../lib/clock.ts";
import { AppError } from "../lib/errors.ts";
import { isId, newId } from "../lib/ids.ts";
import type { Logger } from "../lib/log.ts";
import { noopMetrics, seconds, type Metrics } from "../lib/metrics.ts";
import type { DriverTemplate, RunningVm, VmDriver, VmSpec } from "./drivers/driver.ts";
import { snapshotFailureDetail } from "./drivers/common/snapshot-space.ts";
import { rotatedLogPath } from "./drivers/common/vm-process.ts";
import type { AgentOwner, HostStore } from "./store.ts";
import type { Rollback } from "./recovery.ts";
import type { AgentSpec, Lease, SleepReason, TransitionReason, TransitionTimings, VmState, VmStatus, WakeInfo, WakeReason } from "../contracts/agent.ts";
import type { ActivityListener } from "./activity.ts";
import { withDeadline } from "./deadline.ts";
import { EventLog } from "./event-log.ts";
import { nodeHostFs, type HostFs } from "./host-fs.ts";
import { defaultHibernateRetry, hibernateRetryMs, IdleReaper, type HibernateRetry } from "./reaper.ts";
import { removeTicket, TicketImpl, type Ticket } from "./tickets.ts";
import { liveLeases } from "./leases.ts";
import { newVmEntry, type VmEntry } from "./vm-entry.ts";
import { isImageDigest, type ImageLocator } from "../contracts/image.ts";
import { canTransition, IllegalTransition } from "./vm-state.ts";
import { checkpointNamePattern, type LogReadOptions, type TemplateView } from "../contracts/fleet.ts";
import { defaultLogLimits, LogRotator, openLogStream, type LogLimits } from "./agent-logs.ts";
import { checkpointDir, KeyedQueue, type CheckpointRecord, type CheckpointStore } from "./checkpoints.ts";
import type { SnapshotShipper } from "./artifacts/shipper.ts";

export interface HostConfig {
  hostId: string;
  /** Root of this host's VM state directories (`<dir>/<agentId>`). */
  vmsDir: string;
  /** Requests that may wait for one agent's wake before new ones get 503 queue_full. */
  wakeQueueLimit: number;
  /** How long a request waits for a wake before it gets 503 wake_failed. */
  wakeDeadlineMs: number;
  /** How often the idle reaper looks at running VMs. */
  reaperIntervalMs: number;
  /** Guest CPU (fraction of one core over the last reaper window) at or above which a VM counts as busy. */
  cpuBusyThreshold: number;
  /** How long shutdown waits for in-flight requests before hibernating anyway. */
  drainTimeoutMs: number;
  /** Backoff of the idle reaper after a failed hibernate (default 30 s doubling to 10 min). */
  hibernateRetry?: HibernateRetry;
  /** When agents' logs are rotated (default 4 MiB, looked at every 2 s). */
  logs?: LogLimits;
  /** Where checkpoints' files go (`<dir>/<ckp_id>`); default `checkpoints` beside `vmsDir`. */
  checkpointsDir?: string;
}

export interface HostDeps {
  config: HostConfig;
  driver: VmDriver;
  store: HostStore;
  clock: Clock;
  log: Logger;
  activity: ActivityListener;
  /** The VM directories on disk; node:fs unless a test passes its own. */
  fs?: HostFs;
  /** Where built images' files are on this host (agents whose `image` is a digest); none unless given. */
  images?: ImageLocator;
  /** Wakes (by mode and reason, their phases), snapshots, and the awake and hibernated VMs; none: `noopMetrics`. */
  metrics?: Metrics;
  /** Where checkpoints are recorded (fleet-agent/checkpoints.ts); none: this host takes none (501 checkpoints_unsupported). */
  checkpoints?: CheckpointStore;
  /**
   * The shared artifact store (fleet-agent/artifacts/): each hibernation is committed to it in the background, and an
   * agent that moved here from another host starts from its last commit. None: snapshots stay on this host.
   */
  shipper?: SnapshotShipper;
}

/** How long a wake waits for the database to say who owns the agent before it goes ahead, ms. */
const ownerCheckMs = 500;

/** How much of the VM's console an operator's `boot_failed` or `crash` event carries. */
const CONSOLE_TAIL_BYTES = 2048;

export class Host {
  private readonly vms = new Map<string, VmEntry>();
  private readonly deps: HostDeps;
  private readonly fs: HostFs;
  private readonly events: EventLog;
  private readonly reaper: IdleReaper;
  /** Keeps the awake agents' logs bounded (agent-logs.ts). */
  private readonly logRotator: LogRotator;
  private readonly metrics: Metrics;
  /** The VM gauges' registrations, undone when the host stops. */
  private readonly unregisterGauges: (() => void)[];
  private stopping = false;
  /** Agents whose next restore brings back a snapshot older than their last awake state (crash recovery found them). */
  private readonly rollbacks = new Map<string, Rollback>();
  /** Set while stop() waits for in-flight requests: called when the last ticket is released. */
  private drained: (() => void) | undefined;
  /**
   * Checkpoint work under way, by agent id (take, restore, fork) and by checkpoint id (restore, fork, delete): a wake or
   * a snapshot of that agent waits for it, and it waits for them (a driver's copy never races its own snapshot).
   */
  private readonly checkpointWork = new KeyedQueue();
  /** An operator drains this host (`POST /v1/hosts/{id}/drain`): its VMs sleep as soon as no request is open, and gateways move them. */
  private draining = false;
  /** Owner checks under way, by agent (`ownerCheck`). */
  private readonly ownerChecks = new Map<string, Promise<void>>();
  /** Whether `fence` has looked at the state directories on disk yet (once: later passes look at the VMs in memory). */
  private fencedDisk = false;

  constructor(deps: HostDeps) {
    this.deps = deps;
    this.fs = deps.fs ?? nodeHostFs;
    this.events = new EventLog(deps.store, deps.log);
    this.reaper = new IdleReaper({
      clock: deps.clock,
      // Where the reaper asks an awake VM for its guest leases, the host also takes the checkpoints it asked for.
      driver: {
        guestLeases: async (vm) => {
          await this.takeGuestCheckpoints(vm);
          return deps.driver.guestLeases(vm);
        },
        cpuSeconds: (vm) => deps.driver.cpuSeconds(vm),
      },
      log: deps.log,
      intervalMs: deps.config.reaperIntervalMs,
      cpuBusyThreshold: deps.config.cpuBusyThreshold,
      vms: () => this.vms.values(),
      hibernate: (entry, reason) => {
        for (const t of [...entry.tickets]) t.hibernating();
        void this.hibernate(entry, reason);
      },
      draining: () => this.draining,
    });
    // Only awake agents write to their logs: theirs are the ones to look at.
    this.logRotator = new LogRotator({
      clock: deps.clock,
      log: deps.log,
      limits: deps.config.logs ?? defaultLogLimits,
      paths: () => [...this.vms.values()].filter((e) => e.running).map((e) => deps.driver.logPath(e.vmSpec)),
    });
    // States, read when scraped: nothing to keep in step with the transitions.
    this.metrics = deps.metrics ?? noopMetrics;
    this.unregisterGauges = [
      this.metrics.gauge("agentvm_vms_awake", () => this.countVms((s) => s === "running" || s === "snapshotting")),
      this.metrics.gauge("agentvm_vms_hibernated", () => this.countVms((s) => s === "hibernated")),
    ];
  }

  private countVms(inState: (state: VmState) => boolean): number {
    let n = 0;
    for (const e of this.vms.values()) if (inState(e.state)) n++;
    return n;
  }

  get hostId(): string {
    return this.deps.config.hostId;
  }

  get driverName(): string {
    return this.deps.driver.name;
  }

  /** Cleans up VM processes an earlier host process left behind (their snapshots stay), then starts the reaper. */
  async start(): Promise<void> {
    const { vmsDir } = this.deps.config;
    for (const agentId of this.fs.vmDirs(vmsDir)) {
      await this.deps.driver.reap(this.bareSpec(agentId)).catch((err) => this.deps.log.warn("reaping a leftover VM failed", { agentId, err }));
    }
    // A checkpoint is written under `<id>.tmp-…` and renamed into place: what a crash left half-written is no checkpoint.
    const kept: string[] = [];
    for (const name of existsSync(this.checkpointsDir) ? readdirSync(this.checkpointsDir) : []) {
      if (name.includes(".tmp-")) rmSync(join(this.checkpointsDir, name), { recursive: true, force: true });
      else if (isId("checkpoint", name)) kept.push(name);
    }
    await this.sweepCheckpoints(kept);
    this.reaper.start();
    this.logRotator.start();
  }

  /**
   * Removes checkpoint directories without a live row: a crash between a checkpoint's rename and its row, or an agent
   * (with its checkpoints' rows) deleted while this host was not live. Skipped, and said, when the rows cannot be read.
   */
  private async sweepCheckpoints(ids: string[]): Promise<void> {
    const store = this.deps.checkpoints;
    if (!store || ids.length === 0) return;
    let live: Set<string>;
    try {
      live = await store.liveOf(ids);
    } catch (err) {
      this.deps.log.warn("checkpoint directories not swept: their rows cannot be read now", { err: err instanceof Error ? err.message : String(err) });
      return;
    }
    for (const id of ids) {
      if (live.has(id)) continue;
      rmSync(checkpointDir(this.checkpointsDir, id), { recursive: true, force: true });
      this.deps.log.info("removed a checkpoint directory without a live row", { checkpointId: id });
    }
  }

  /** The spec of an agent known only by its directory: enough for what a driver finds by it (leftover processes, the log). */
  private bareSpec(agentId: string): VmSpec {
    return { vmId: vmIdFor(agentId), agentId, image: "", vcpus: 0, memMiB: 0, allowEgress: false, stateDir: join(this.deps.config.vmsDir, agentId) };
  }

  /** What crash recovery found (recovery.ts): the first wake of each of these agents that restores says what it lost. */
  expectRollbacks(rollbacks: ReadonlyMap<string, Rollback>): void {
    for (const [agentId, r] of rollbacks) this.rollbacks.set(agentId, r);
  }

  /** Only the first wake after the crash carries the rollback, and only a restore has one (a boot says so itself). */
  private takeRollback(agentId: string, mode: WakeInfo["wake"]): Rollback | undefined {
    const r = this.rollbacks.get(agentId);
    this.rollbacks.delete(agentId);
    return mode === "restore" ? r : undefined;
  }

  /**
   * Shutdown order: stop accepting new requests → stop the reaper → wait for in-flight requests to drain
   * (bounded) → hibernate every running VM (its snapshot is its state after a restart) → wait for their commits to
   * the shared store → let the driver release whatever it still holds (frozen processes, pre-started VMs) → flush the
   * event log.
   */
  async stop(): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    await this.reaper.stop();
    this.logRotator.stop();
    await this.drain();
    for (const entry of this.vms.values()) {
      for (const t of [...entry.tickets]) t.hibernating();
      await this.checkpointWork.busy(entry.spec.id);
      await entry.wake?.catch(() => undefined);
      await entry.hibernation?.promise;
      if (entry.state === "running") await this.hibernate(entry, "shutdown");
    }
    await this.deps.shipper?.flush(); // the last hibernations' commits read the driver's files
    await this.deps.driver.close();
    await this.flush();
    for (const unregister of this.unregisterGauges) unregister();
  }

  /** Waits until every event-log write issued so far is stored. */
  async flush(): Promise<void> {
    await this.events.flush();
  }

  inFlight(): number {
    let n = 0;
    for (const e of this.vms.values()) n += e.tickets.length;
    return n;
  }

  status(agentId: string): VmStatus | undefined {
    const e = this.vms.get(agentId);
    if (!e) return undefined;
    const leases = liveLeases(e, this.deps.clock.monotonic());
    return {
      agentId,
      vmId: e.vmSpec.vmId,
      state: e.state,
      inFlight: e.tickets.length,
      leases,
      runId: e.runId,
      lastWakeAt: e.lastWakeAt,
      lastActivityAt: e.lastActivityAt,
      ...(e.lastHibernateError ? { lastHibernateError: e.lastHibernateError } : {}),
    };
  }

  /**
   * The agent's log (console + workload output), read from disk without waking it: the last `tailBytes`, then with
   * `follow` what it writes next (agent-logs.ts). Rotated first when past the limit. Undefined when this host has no
   * such agent (it never ran here). A follow ends once the agent is deleted.
   */
  logs(agentId: string, opts: LogReadOptions): ReadableStream<Uint8Array> | undefined {
    if (!isId("agent", agentId)) return undefined; // the id names a directory
    const stateDir = join(this.deps.config.vmsDir, agentId);
    const entry = this.vms.get(agentId);
    if (!entry && !this.fs.hasStateDir(stateDir)) return undefined;
    const path = this.deps.driver.logPath(entry?.vmSpec ?? this.bareSpec(agentId));
    this.logRotator.check(path);
    return openLogStream(path, { ...opts, gone: () => !this.vms.has(agentId) && !this.fs.hasStateDir(stateDir) });
  }

  /**
   * Holds the agent's VM awake for one request, waking it first if needed. Concurrent callers share one
   * wake; callers beyond the queue limit, or still waiting at the deadline, get a 503 with Retry-After. `requestId`: the
   * call that asked (the wake it starts records it, in the event log's detail and the audit log).
   */
  async acquire(spec: AgentSpec, reason: WakeReason, requestId?: string): Promise<Ticket> {
    if (this.stopping) throw new AppError("shutting_down", "host is shutting down", { retryAfterS: 5 });
    const entry = await this.leased(spec);
    const queuedAt = this.deps.clock.monotonic();
    let ownerChecked = false;
    for (;;) {
      if (entry.state === "running" && entry.running && !entry.hibernation) {
        return this.ticket(entry, { wake: "warm", runId: entry.runId!, timings: {} });
      }
      if (entry.hibernation) {
        entry.hibernation.abort.abort();
        await entry.hibernation.promise;
        continue;
      }
      if (entry.state === "destroyed") throw new AppError("not_found", `agent ${spec.id} was deleted`);
      const checkpointing = this.checkpointWork.busy(spec.id);
      if (checkpointing) {
        await checkpointing; // a restore or a fork decides what the wake brings back
        continue;
      }
      if (entry.waiting >= this.deps.config.wakeQueueLimit) {
        throw new AppError("queue_full", `too many requests waiting for agent ${spec.id} to wake`, { retryAfterS: 2 });
      }
      if (!entry.wake && !ownerChecked) {
        // A wake is to start: ask who owns the agent first, then look again (the state may have moved meanwhile).
        await this.ownerCheck(entry);
        ownerChecked = true;
        continue;
      }
      entry.waiting++;
      let info: WakeInfo;
      try {
        const ms = this.deps.config.wakeDeadlineMs;
        info = await withDeadline(this.deps.clock, ms, this.wakeOnce(entry, reason, requestId), () => {
          throw new AppError("wake_failed", `agent ${spec.id} did not wake within ${ms} ms`, { retryAfterS: 5 });
        });
      } finally {
        entry.waiting--;
      }
      if (entry.state !== "running" || !entry.running) continue; // hibernated again in between: go round
      const queuedMs = this.deps.clock.monotonic() - queuedAt;
      this.metrics.observe("agentvm_wake_queue_seconds", { mode: info.wake }, seconds(queuedMs));
      return this.ticket(entry, { ...info, timings: { ...info.timings, queuedMs: round(queuedMs) } });
    }
  }

  /** Wakes the agent (reason `api`) without holding it. */
  async wake(spec: AgentSpec, reason: WakeReason = "api"): Promise<WakeInfo> {
    const ticket = await this.acquire(spec, reason);
    ticket.release();
    return ticket.wake;
  }

  /** Explicit hibernation (reason `api`): refused while requests are in flight. */
  async hibernateNow(agentId: string): Promise<VmState> {
    const entry = this.vms.get(agentId);
    if (!entry) return "hibernated";
    await this.checkpointWork.busy(agentId);
    await entry.wake?.catch(() => undefined);
    if (entry.hibernation) await entry.hibernation.promise;
    if (entry.state !== "running") return entry.state;
    const waiting = entry.tickets.filter((t) => t.phase === "waiting").length;
    if (waiting > 0) throw new AppError("conflict", `agent ${agentId} has ${waiting} request(s) in flight`);
    for (const t of [...entry.tickets]) t.hibernating();
    await this.hibernate(entry, "api");
    return entry.state;
  }

  /** A keep-awake lease: wakes the agent if it sleeps and keeps it awake until the lease expires or is dropped. */
  async addLease(spec: AgentSpec, ttlMs: number): Promise<Lease> {
    const ticket = await this.acquire(spec, "api");
    try {
      const leaseId = this.entry(spec).leases.add(this.deps.clock.monotonic() + ttlMs);
      return { leaseId, expiresAt: this.deps.clock.now() + ttlMs };
    } finally {
      ticket.release();
    }
  }

  dropLease(agentId: string, leaseId: string): boolean {
    const entry = this.vms.get(agentId);
    if (!entry?.leases.drop(leaseId)) return false;
    entry.lastActivityAt = this.deps.clock.monotonic();
    return true;
  }

  /** Stops the agent's VM and removes everything it left on disk. */
  async remove(agentId: string): Promise<void> {
    const entry = this.vms.get(agentId);
    if (!entry) return this.removeCheckpointsOf(agentId);
    for (const t of [...entry.tickets]) t.hibernating();
    await this.checkpointWork.busy(agentId);
    await entry.wake?.catch(() => undefined);
    await entry.hibernation?.promise;
    if (entry.running) {
      if (entry.state === "running") this.endActivity(entry, "delete");
      await this.deps.driver.stop(entry.running).catch((err) => this.deps.log.warn("stop failed", { agentId, err }));
    }
    await this.deps.driver.destroy(entry.vmSpec);
    this.transition(entry, "destroyed", "delete");
    entry.running = undefined;
    this.vms.delete(agentId);
    await this.removeCheckpointsOf(agentId);
  }

  /** The driver's warm templates as the API shows them (this host's id added, their paths left out); none when it keeps none. */
  async templates(): Promise<TemplateView[]> {
    const listed = (await this.deps.driver.listTemplates?.()) ?? [];
    return listed.map((t) => templateView(t, this.hostId));
  }

  /**
   * Keeps a checkpoint of the agent (DESIGN: checkpoints): after any wake or snapshot under way, the driver copies the
   * running VM (paused meanwhile) or the hibernated one's snapshot into `<checkpointsDir>/<ckp_id>`, and the row is
   * recorded. 409 on a name the agent already uses or when it never ran; 501 when the driver or this host cannot.
   */
  async checkpoint(spec: AgentSpec, opts: { name?: string; origin: CheckpointRecord["origin"]; requestId?: string }): Promise<CheckpointRecord> {
    const { driver } = this.deps;
    if (!driver.checkpoint) throw unsupported(driver.name, "checkpoint");
    const store = this.checkpointStore("checkpoint");
    const name = opts.name ?? null;
    if (name !== null && !checkpointNamePattern.test(name)) throw new AppError("bad_request", `name: "${name.slice(0, 100)}" is no checkpoint name`);
    if (name !== null && (await store.nameTaken(spec.id, name))) throw new AppError("conflict", `agent ${spec.id} already has a checkpoint named "${name}"`);
    const entry = await this.leased(spec);
    return this.checkpointWork.run(spec.id, async () => {
      await this.settle(entry);
      if (entry.state === "destroyed") throw new AppError("not_found", `agent ${spec.id} was deleted`);
      if (entry.state === "creating") throw new AppError("conflict", `agent ${spec.id} has never run: there is no state to checkpoint`);
      const vm = entry.state === "running" ? entry.running : undefined;
      const id = newId("checkpoint");
      const dir = checkpointDir(this.checkpointsDir, id);
      mkdirSync(this.checkpointsDir, { recursive: true });
      this.attachImage(entry); // a built image's files: the disk the checkpoint copies is an overlay on them
      let info;
      try {
        info = await driver.checkpoint!(entry.vmSpec, vm, dir);
      } catch (err) {
        rmSync(dir, { recursive: true, force: true }); // a half-written checkpoint is no checkpoint
        throw err;
      }
      const record: CheckpointRecord = {
        id,
        tenantId: spec.tenantId,
        agentId: spec.id,
        hostId: this.hostId,
        name,
        origin: opts.origin,
        bytes: info.bytes,
        pausedMs: Math.round(info.pausedMs),
        createdAt: new Date(this.deps.clock.now()),
        requestId: opts.requestId ?? null,
      };
      try {
        await store.insert(record);
      } catch (err) {
        rmSync(dir, { recursive: true, force: true }); // no row, no files: a refused name leaves nothing behind
        throw err;
      }
      this.deps.log.info("checkpoint taken", { agentId: spec.id, checkpointId: id, origin: opts.origin, bytes: info.bytes, pausedMs: info.pausedMs, ms: info.ms, copy: info.copy });
      return record;
    });
  }

  /**
   * Rolls the agent back to one of its checkpoints: an awake agent is stopped first (its run and meter end as a stop's
   * do, reason `api`), then the driver replaces its snapshot and disk with the checkpoint's (the snapshot it had is
   * gone), and it is `hibernated`: the next call wakes it from the checkpoint, with a fresh identity.
   */
  async restoreCheckpoint(spec: AgentSpec, checkpointId: string, requestId?: string): Promise<VmState> {
    const record = await this.checkpointOf(checkpointId, "restore");
    if (record.agentId !== spec.id) throw new AppError("not_found", `checkpoint ${checkpointId} is not agent ${spec.id}'s`);
    const entry = await this.leased(spec);
    return this.checkpointWork.run(spec.id, () =>
      this.checkpointWork.run(checkpointId, async () => {
        await this.settle(entry);
        if (entry.state === "destroyed") throw new AppError("not_found", `agent ${spec.id} was deleted`);
        if (entry.running) await this.stopForRestore(entry, checkpointId);
        this.attachImage(entry);
        await this.deps.driver.restoreCheckpoint!(entry.vmSpec, checkpointDir(this.checkpointsDir, checkpointId));
        entry.hibernateFailures = 0;
        entry.lastHibernateError = undefined;
        this.transition(entry, "hibernated", "api", { snapshotBytes: record.bytes }, { restoredFrom: checkpointId, ...(requestId ? { requestId } : {}) });
        return entry.state;
      }),
    );
  }

  /**
   * A new agent (never run) from a checkpoint: its state directory is made a hibernated VM whose snapshot is the
   * checkpoint's, before its first wake (no `creating` → boot); that wake restores it with a fresh identity.
   */
  async fork(spec: AgentSpec, checkpointId: string, requestId?: string): Promise<VmState> {
    const record = await this.checkpointOf(checkpointId, "fork");
    if (record.tenantId !== spec.tenantId) throw new AppError("not_found", `checkpoint ${checkpointId} not found`);
    const entry = await this.leased(spec);
    return this.checkpointWork.run(spec.id, () =>
      this.checkpointWork.run(checkpointId, async () => {
        if (entry.state !== "creating") throw new AppError("conflict", `agent ${spec.id} already has a state of its own: only a new agent is forked`);
        this.attachImage(entry);
        await this.deps.driver.restoreCheckpoint!(entry.vmSpec, checkpointDir(this.checkpointsDir, checkpointId));
        this.transition(entry, "hibernated", "api", { snapshotBytes: record.bytes }, { forkedFrom: checkpointId, fromAgent: record.agentId, ...(requestId ? { requestId } : {}) });
        return entry.state;
      }),
    );
  }

  /** Removes a checkpoint's files and marks its row deleted (after any restore or fork reading it). Forks made of it keep their own files. */
  async deleteCheckpoint(agentId: string, checkpointId: string): Promise<void> {
    const store = this.checkpointStore("delete");
    const dir = checkpointDir(this.checkpointsDir, checkpointId);
    const record = await store.get(checkpointId);
    if (!record || record.agentId !== agentId) throw new AppError("not_found", `checkpoint ${checkpointId} not found`);
    await this.checkpointWork.run(checkpointId, async () => {
      await store.markDeleted(checkpointId, new Date(this.deps.clock.now()));
      rmSync(dir, { recursive: true, force: true });
    });
  }

  /** Where the reaper polls an awake VM's guest leases: a checkpoint for each name its workload asked for since the last poll (origin `guest`). */
  private async takeGuestCheckpoints(vm: RunningVm): Promise<void> {
    const { driver } = this.deps;
    if (!driver.guestCheckpointRequests || !driver.checkpoint || !this.deps.checkpoints) return;
    const names = await driver.guestCheckpointRequests(vm).catch((err) => {
      this.deps.log.warn("reading the guest's checkpoint requests failed", { agentId: vm.spec.agentId, err });
      return [] as string[];
    });
    const entry = this.vms.get(vm.spec.agentId);
    if (!entry) return;
    for (const asked of names) {
      const name = asked.trim() === "" ? undefined : asked.trim();
      try {
        await this.checkpoint(entry.spec, { origin: "guest", ...(name !== undefined ? { name } : {}) });
      } catch (err) {
        // The workload is not told (it asked through a file): the host's log says why, and the next request is taken.
        this.deps.log.warn("a checkpoint the guest asked for was not taken", { agentId: entry.spec.id, name, err: err instanceof Error ? err.message : String(err) });
      }
    }
  }

  /** Waits until no wake or snapshot of the agent is under way (checkpoint work holds the agent's queue: none starts meanwhile). */
  private async settle(entry: VmEntry): Promise<void> {
    while (entry.wake || entry.hibernation) {
      await entry.wake?.catch(() => undefined);
      await entry.hibernation?.promise;
    }
  }

  /** A restore stops the VM as a stop does: tickets told, meter and run ended (reason `api`), the event log says why. */
  private async stopForRestore(entry: VmEntry, checkpointId: string): Promise<void> {
    const vm = entry.running!;
    for (const t of [...entry.tickets]) t.hibernating();
    const wasRunning = entry.state === "running";
    entry.running = undefined; // before the stop: its exit is ours, not a crash
    if (wasRunning) this.endActivity(entry, "api");
    await this.deps.driver.stop(vm).catch((err) => this.deps.log.warn("stop failed", { agentId: entry.spec.id, err }));
    if (canTransition(entry.state, "stopped")) this.transition(entry, "stopped", "api", undefined, { restoring: checkpointId });
    this.endRun(entry, "api");
  }

  /** Deleting an agent deletes its checkpoints on this host (rows marked, files removed); forks of them are agents of their own and stay. */
  private async removeCheckpointsOf(agentId: string): Promise<void> {
    const store = this.deps.checkpoints;
    if (!store) return;
    const ids = await store.deleteOfAgent(agentId, this.hostId, new Date(this.deps.clock.now()));
    for (const id of ids) await this.checkpointWork.run(id, async () => rmSync(checkpointDir(this.checkpointsDir, id), { recursive: true, force: true }));
  }

  private async checkpointOf(checkpointId: string, op: "restore" | "fork"): Promise<CheckpointRecord> {
    if (!this.deps.driver.restoreCheckpoint) throw unsupported(this.deps.driver.name, op);
    const store = this.checkpointStore(op);
    checkpointDir(this.checkpointsDir, checkpointId); // 400 for what is no checkpoint id
    const record = await store.get(checkpointId);
    if (!record || record.hostId !== this.hostId) throw new AppError("not_found", `checkpoint ${checkpointId} is not on host ${this.hostId}`);
    return record;
  }

  private checkpointStore(op: string): CheckpointStore {
    if (!this.deps.checkpoints) throw new AppError("checkpoints_unsupported", `host ${this.hostId} keeps no checkpoint records: ${op} is not possible here`);
    return this.deps.checkpoints;
  }

  private get checkpointsDir(): string {
    return this.deps.config.checkpointsDir ?? join(dirname(this.deps.config.vmsDir), "checkpoints");
  }

  /** One pass of the idle reaper (exposed for tests that drive time by hand). */
  reapIdle(): Promise<void> {
    return this.reaper.pass();
  }

  /**
   * Resolves when the last open ticket is released, or at the drain timeout on the injected clock, whichever
   * comes first; tickets opened meanwhile by wakes already under way count as well.
   */
  private drain(): Promise<void> {
    const ms = this.deps.config.drainTimeoutMs;
    // A zero timeout means "do not wait" (a 0 ms timer on a hand-driven clock would only fire when time moves).
    if (this.inFlight() === 0 || ms <= 0) return Promise.resolve();
    const drained = new Promise<void>((resolve) => (this.drained = resolve));
    return withDeadline(this.deps.clock, ms, drained, () => undefined).finally(() => (this.drained = undefined));
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
    const parent = join(this.checkpointsDir, `store.tmp-${newId("request").slice(4)}`);
    const dir = join(parent, `moved-g${entry.generation}`);
    mkdirSync(parent, { recursive: true });
    const started = this.deps.clock.monotonic();
    try {
      const row = await shipper.materialize(entry.spec.id, dir);
      if (!row) return undefined;
      await driver.restoreCheckpoint(entry.vmSpec, dir);
      const ms = round(this.deps.clock.monotonic() - started);
      this.transition(entry, "hibernated", reason, { snapshotBytes: row.bytes }, { fromStore: { hostId: row.hostId, generation: row.generation, snapshotAt: row.snapshotAt.toISOString(), fetchMs: ms } });
      this.deps.log.info("restoring from the shared store", { agentId: entry.spec.id, fromHost: row.hostId, bytes: row.bytes, fetchMs: ms });
      return { fromStore: row.hostId };
    } finally {
      rmSync(parent, { recursive: true, force: true });
    }
  }

  /**
   * Runs `work` apart from the agent's wakes, snapshots and checkpoints, and only while it is still hibernated: the
   * shipper's checkpoint step reads the snapshot's files, which a wake since the hibernation has moved on (the next
   * hibernation commits instead).
   */
  whileHibernated<T>(agentId: string, work: () => Promise<T>): Promise<T> {
    return this.checkpointWork.run(agentId, async () => {
      const state = this.vms.get(agentId)?.state;
      if (state !== "hibernated") throw new AppError("conflict", `agent ${agentId} is ${state ?? "gone"} again: its snapshot is not committed (its next hibernation is)`);
      return work();
    });
  }

  /**
   * The agent's entry under the lease generation the call carries (fencing). An older generation than this host's is a
   * caller with a stale placement: refused (503, the gateway asks the database again). A newer one means the agent was
   * moved to another host and back since this host last ran it: its copy here is stale, so it is stopped and its files
   * removed, and the agent starts here from what the store has (or boots). The generation is kept beside the VMs'
   * directories (`<vmsDir>/../leases/<agentId>`), so a restart knows it.
   */
  private async leased(spec: AgentSpec): Promise<VmEntry> {
    const generation = spec.generation ?? 0;
    const known = this.vms.get(spec.id);
    const held = known?.generation ?? this.diskGeneration(spec.id);
    if (generation < held) {
      throw new AppError("host_unavailable", `agent ${spec.id} runs on this host under lease generation ${held}, the call carries ${generation}: the caller's placement is stale`, { retryAfterS: 1 });
    }
    if (generation > held) {
      if (known) await this.evict(known, `a call of lease generation ${generation} (this host had ${held})`);
      else if (this.fs.hasStateDir(join(this.deps.config.vmsDir, spec.id))) await this.discardStateDir(spec.id, `its files here are of lease generation ${held}, the call carries ${generation}`);
      this.writeDiskGeneration(spec.id, generation);
    }
    return this.entry(spec);
  }

  /**
   * Before a wake: whether the database still gives this host the agent under the generation it holds. A gateway whose
   * placement was kept from before a move (its cache) would otherwise wake a second copy here; it gets `503` and asks
   * again. A copy already awake is fenced at the next heartbeat (`fence`). While the database cannot be read the
   * wake goes ahead (after at most `ownerCheckMs`): the lease it holds has not been taken from it by anyone who could
   * not write either.
   */
  /** One owner check at a time per agent: callers that arrive together share it (a burst asks the database once). */
  private ownerCheck(entry: VmEntry): Promise<void> {
    const id = entry.spec.id;
    let check = this.ownerChecks.get(id);
    if (!check) {
      check = this.assertOwner(entry).finally(() => this.ownerChecks.delete(id));
      this.ownerChecks.set(id, check);
    }
    return check;
  }

  private async assertOwner(entry: VmEntry): Promise<void> {
    const id = entry.spec.id;
    let owner;
    try {
      // Bounded: a database that does not answer (an outage, a partition) must not hold the wake up.
      owner = (await withDeadline(this.deps.clock, ownerCheckMs, this.deps.store.owners([id]), () => new Map<string, AgentOwner>())).get(id);
    } catch {
      return;
    }
    if (!owner || owner.deleted || owner.hostId === null) return;
    if (owner.hostId === this.hostId && owner.generation <= entry.generation) return;
    throw new AppError("host_unavailable", `agent ${id} is on host ${owner.hostId} now (lease generation ${owner.generation}); this host's copy (generation ${entry.generation}) is not woken`, { retryAfterS: 1 });
  }

  /**
   * Stops this host's copy of every agent the database says it no longer owns (another host, or a newer lease
   * generation): a host that was cut off or dead while its agents moved must not run, meter or snapshot them again.
   * The first pass also looks at the state directories on disk (what a dead process left). Called after each heartbeat;
   * answers how many copies it stopped.
   */
  async fence(): Promise<number> {
    const { vmsDir } = this.deps.config;
    const ids = new Set(this.vms.keys());
    if (!this.fencedDisk) for (const id of this.fs.vmDirs(vmsDir)) if (isId("agent", id)) ids.add(id);
    if (ids.size === 0) return 0;
    const owners = await this.deps.store.owners([...ids]);
    this.fencedDisk = true;
    let stopped = 0;
    for (const id of ids) {
      const owner = owners.get(id);
      if (!owner || owner.deleted || owner.hostId === null) continue;
      const entry = this.vms.get(id);
      const held = entry?.generation ?? this.diskGeneration(id);
      if (owner.hostId === this.hostId && owner.generation <= held) continue;
      const why = owner.hostId === this.hostId ? `lease generation ${owner.generation} is newer than this host's ${held}` : `it is on host ${owner.hostId} now (lease generation ${owner.generation})`;
      if (entry) await this.evict(entry, why);
      else await this.discardStateDir(id, why);
      stopped++;
    }
    return stopped;
  }

  /** After each heartbeat: drain as the host's row says, then `fence`. */
  async afterHeartbeat(): Promise<void> {
    this.setDraining(await this.deps.store.draining(this.hostId));
    await this.fence();
  }

  /**
   * Drain on or off, as the host's row says at each heartbeat. While draining, each reaper pass hibernates every
   * running VM with no request open (leases and idle timeouts aside); gateways place none of its agents here again
   * once they sleep, and no new agents (gateway/placement.ts).
   */
  setDraining(on: boolean): void {
    if (on === this.draining) return;
    this.draining = on;
    this.deps.log.warn(on ? "draining: agents hibernate as soon as no request is open, and wake on other hosts" : "drain ended: this host takes agents again");
  }

  /** Memory of the VMs awake here (booting, running, restoring, snapshotting) and how many they are: what the heartbeat reports. */
  load(): { usedMiB: number; awakeAgents: number } {
    let usedMiB = 0;
    let awakeAgents = 0;
    for (const e of this.vms.values()) {
      if (e.state !== "booting" && e.state !== "running" && e.state !== "restoring" && e.state !== "snapshotting") continue;
      usedMiB += e.vmSpec.memMiB;
      awakeAgents++;
    }
    return { usedMiB, awakeAgents };
  }

  /**
   * Stops an agent's VM here without a snapshot (its state here is not the agent's any more) and forgets it: open
   * requests end (WebSockets with 1001), the meter closes its segment (reason `moved`), the run ends, its files go. No
   * transition reaches the agent's row: it is another host's (the event log is fenced by generation anyway).
   */
  private async evict(entry: VmEntry, why: string): Promise<void> {
    const agentId = entry.spec.id;
    for (const t of [...entry.tickets]) t.hibernating();
    await this.checkpointWork.busy(agentId);
    await entry.wake?.catch(() => undefined);
    await entry.hibernation?.promise.catch(() => undefined);
    if (entry.running) {
      if (entry.state === "running") {
        this.endActivity(entry, "moved");
        this.endRun(entry, "moved");
      }
      await this.deps.driver.stop(entry.running).catch((err) => this.deps.log.warn("stop failed", { agentId, err }));
    }
    entry.running = undefined;
    entry.state = "destroyed";
    this.vms.delete(agentId);
    await this.discardStateDir(agentId, why);
  }

  /** Removes an agent's state here (its leftover processes first): the agent's current state is on another host or in the store. */
  private async discardStateDir(agentId: string, why: string): Promise<void> {
    const spec = this.bareSpec(agentId);
    await this.deps.driver.reap(spec).catch((err) => this.deps.log.warn("reaping a moved agent's VM failed", { agentId, err }));
    await this.deps.driver.destroy(spec).catch((err) => this.deps.log.warn("removing a moved agent's files failed", { agentId, err }));
    rmSync(spec.stateDir, { recursive: true, force: true });
    rmSync(this.generationPath(agentId), { force: true });
    this.deps.log.warn("stopped this host's copy of an agent it no longer owns", { agentId, why });
  }

  private generationPath(agentId: string): string {
    return join(dirname(this.deps.config.vmsDir), "leases", agentId);
  }

  /** The lease generation this host last ran the agent under (0 when it never was moved here). */
  private diskGeneration(agentId: string): number {
    try {
      const n = Number(readFileSync(this.generationPath(agentId), "utf8").trim());
      return Number.isSafeInteger(n) && n >= 0 ? n : 0;
    } catch {
      return 0;
    }
  }

  private writeDiskGeneration(agentId: string, generation: number): void {
    const path = this.generationPath(agentId);
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(`${path}.tmp`, `${generation}\n`);
    renameSync(`${path}.tmp`, path);
  }

  private entry(spec: AgentSpec): VmEntry {
    let e = this.vms.get(spec.id);
    if (e) {
      e.spec = spec; // idle timeouts and limits may have changed; the VM's shape changes on its next boot
      return e;
    }
    const stateDir = join(this.deps.config.vmsDir, spec.id);
    const vmSpec: VmSpec = {
      vmId: vmIdFor(spec.id),
      agentId: spec.id,
      image: spec.image,
      vcpus: spec.vcpus,
      memMiB: spec.memMiB,
      allowEgress: spec.allowEgress,
      stateDir,
      ...(spec.diskMiB !== undefined ? { diskMiB: spec.diskMiB } : {}),
    };
    // A directory left by an earlier host process may hold a snapshot: wake tries it, else boots.
    const state = this.fs.hasStateDir(stateDir) ? "stopped" : "creating";
    e = newVmEntry(spec, vmSpec, state, this.deps.clock.monotonic());
    this.vms.set(spec.id, e);
    return e;
  }

  private ticket(entry: VmEntry, wake: WakeInfo): Ticket {
    const t = new TicketImpl(
      entry.running!.endpoint,
      wake,
      this.deps.clock,
      (done) => {
        removeTicket(entry.tickets, done);
        entry.lastActivityAt = this.deps.clock.monotonic();
        if (this.drained && this.inFlight() === 0) this.drained();
      },
      () => this.recordFirstByte(entry, wake),
    );
    t.slot = entry.tickets.length;
    entry.tickets.push(t);
    return t;
  }

  private recordFirstByte(entry: VmEntry, wake: WakeInfo): void {
    if (wake.wake === "warm" || entry.firstByteRecorded || entry.runId !== wake.runId || entry.wakeStartedAt === undefined) return;
    entry.firstByteRecorded = true;
    const firstByteMs = round(this.deps.clock.monotonic() - entry.wakeStartedAt);
    this.metrics.observe("agentvm_wake_first_byte_seconds", { mode: wake.wake }, seconds(firstByteMs));
    this.events.runTimings(wake.runId, { ...wake.timings, firstByteMs });
  }

  private wakeOnce(entry: VmEntry, reason: WakeReason, requestId: string | undefined): Promise<WakeInfo> {
    entry.wake ??= this.doWake(entry, reason, requestId).finally(() => {
      entry.wake = undefined;
    });
    return entry.wake;
  }

  private async doWake(entry: VmEntry, reason: WakeReason, requestId: string | undefined): Promise<WakeInfo> {
    const { driver, clock } = this.deps;
    const startedAt = clock.monotonic();
    try {
      this.attachImage(entry);
      if (!entry.reaped) {
        entry.reaped = true;
        await driver.reap(entry.vmSpec);
      }
      let info: Omit<WakeInfo, "runId">;
      let detail: Record<string, unknown> | undefined;
      if (entry.state === "creating" && entry.generation > 0) detail = await this.fromStore(entry, reason);
      if (entry.state === "creating") {
        const release = this.events.hold(); // as for a hibernation: the log's writes after the driver's steps
        this.transition(entry, "booting", reason === "request" || reason === "webhook" || reason === "api" ? reason : "boot");
        const booted = await driver.boot(entry.vmSpec).finally(release);
        entry.running = booted.vm;
        info = { wake: "boot", timings: { bootMs: round(booted.bootMs) } };
        // A clone of a warm template: the run's event says which one, so a slow or odd first run can be traced to it.
        if (booted.template) detail = { template: booted.template };
      } else {
        // The log's writes (this transition's among them) after the driver's steps: with an embedded database their CPU
        // time would run at the restore's first await, before QEMU starts (4.8 ms p50 of a restore in bench:wake).
        const release = this.events.hold();
        this.transition(entry, "restoring", reason);
        const woke = await driver.wake(entry.vmSpec).finally(release);
        entry.running = woke.vm;
        const t = woke.timings;
        const clockFix = { clockFixMs: round(t.clockFixMs), skewBeforeMs: round(t.skewBeforeMs), skewAfterMs: round(t.skewAfterMs) };
        // A fallback is a boot: `bootMs` in server-timing and the run's timings; the failed attempt's share is in the detail.
        info =
          woke.mode === "boot"
            ? { wake: "boot", timings: { bootMs: round(t.bootMs ?? t.restoreMs), ...clockFix } }
            : { wake: "restore", timings: { restoreMs: round(t.restoreMs), ...clockFix } };
        if (woke.fallbackReason) detail = { ...detail, fallbackReason: woke.fallbackReason, restoreAttemptMs: round(t.restoreMs) };
      }
      const runId = newId("run");
      const rollback = this.takeRollback(entry.spec.id, info.wake);
      if (rollback) {
        info = { ...info, timings: { ...info.timings, rollbackMs: rollback.lostMs } };
        const { crashedRunId, lastAwakeAt, snapshotAt } = rollback;
        detail = { ...detail, rollback: { rollbackMs: rollback.lostMs, crashedRunId, lastAwakeAt: new Date(lastAwakeAt).toISOString(), snapshotAt: new Date(snapshotAt).toISOString() } };
        this.deps.log.warn("restored a snapshot older than the agent's last awake state", { agentId: entry.spec.id, rollbackMs: rollback.lostMs, crashedRunId });
      }
      entry.runId = runId;
      entry.wakeStartedAt = startedAt;
      entry.firstByteRecorded = false;
      entry.lastActivityAt = clock.monotonic();
      entry.lastWakeAt = clock.now();
      entry.cpu.reset();
      const wakeMs = round(clock.monotonic() - startedAt);
      this.transition(entry, "running", reason, { ...info.timings, wakeMs }, { wake: info.wake, ...detail, ...(requestId ? { requestId } : {}) });
      this.countWake(info, reason, wakeMs);
      this.events.runStarted({
        id: runId,
        agentId: entry.spec.id,
        tenantId: entry.spec.tenantId,
        hostId: this.hostId,
        vmId: entry.vmSpec.vmId,
        wokeAt: new Date(entry.lastWakeAt!),
        wakeReason: reason,
        wakeMode: info.wake,
        timings: info.timings,
      });
      this.startActivity(entry, reason);
      this.watchExit(entry, entry.running);
      return { ...info, runId };
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      // The image did not come up (entrypoint exited, never listened, image missing): the caller hears that, not a generic wake failure.
      const bootFailed = err instanceof AppError && err.code === "boot_failed";
      this.deps.log.error("wake failed", { agentId: entry.spec.id, err: message, ...(bootFailed ? { code: "boot_failed" } : {}) });
      const detail = { error: message, ...(bootFailed ? { bootFailed: true, consoleTail: this.consoleTail(entry) } : {}) };
      if (entry.state !== "failed" && canTransition(entry.state, "failed")) this.transition(entry, "failed", reason, undefined, detail);
      entry.running = undefined;
      this.metrics.inc("agentvm_wake_failures_total", { reason, code: bootFailed ? "boot_failed" : "wake_failed" });
      if (bootFailed) throw new AppError("boot_failed", `agent ${entry.spec.id} did not start: ${message}`, { retryAfterS: 5, cause: err });
      throw new AppError("wake_failed", `agent ${entry.spec.id} could not be started: ${message}`, { retryAfterS: 5, cause: err });
    }
  }

  /** One completed wake: its count by mode and reason, its whole duration and the parts it had. */
  private countWake(info: Omit<WakeInfo, "runId">, reason: WakeReason, wakeMs: number): void {
    const { metrics } = this;
    const mode = info.wake;
    const t = info.timings;
    metrics.inc("agentvm_wakes_total", { mode, reason });
    metrics.observe("agentvm_wake_seconds", { mode }, seconds(wakeMs));
    if (t.restoreMs !== undefined) metrics.observe("agentvm_wake_restore_seconds", {}, seconds(t.restoreMs));
    if (t.bootMs !== undefined) metrics.observe("agentvm_wake_boot_seconds", {}, seconds(t.bootMs));
    if (t.clockFixMs !== undefined) metrics.observe("agentvm_wake_clock_fix_seconds", {}, seconds(t.clockFixMs));
  }

  /** A built image's files, looked up when the VM first needs them (and again while they are missing). */
  private attachImage(entry: VmEntry): void {
    const { image } = entry.vmSpec;
    if (!isImageDigest(image) || entry.vmSpec.rootImage) return;
    const artifact = this.deps.images?.(image);
    if (!artifact) throw new AppError("boot_failed", `image ${image} is not on host ${this.hostId}`);
    entry.vmSpec.rootImage = artifact;
  }

  /** The end of the VM's log, across a rotation that may just have emptied the current file. */
  private consoleTail(entry: VmEntry): string {
    const path = this.deps.driver.logPath(entry.vmSpec);
    return (this.fs.tail(rotatedLogPath(path), CONSOLE_TAIL_BYTES) + this.fs.tail(path, CONSOLE_TAIL_BYTES)).slice(-CONSOLE_TAIL_BYTES);
  }

  private watchExit(entry: VmEntry, vm: RunningVm): void {
    this.deps.driver.onExit(vm, (exit) => {
      if (entry.running !== vm) return;
      this.deps.log.error("VM exited unexpectedly", { agentId: entry.spec.id, vmId: entry.vmSpec.vmId, ...exit });
      entry.hibernation?.abort.abort();
      if (entry.state === "running") this.endActivity(entry, "crash");
      entry.running = undefined;
      if (canTransition(entry.state, "failed")) this.transition(entry, "failed", "crash", undefined, { ...exit, consoleTail: this.consoleTail(entry) });
      this.endRun(entry, "crash");
    });
  }

  private hibernate(entry: VmEntry, reason: SleepReason): Promise<void> {
    if (entry.hibernation) return entry.hibernation.promise;
    // The idle reaper's next pass tries again; the other callers waited for the checkpoint work before they came here.
    if (this.checkpointWork.has(entry.spec.id)) return Promise.resolve();
    const vm = entry.running;
    if (entry.state !== "running" || !vm) return Promise.resolve();
    const abort = new AbortController();
    // The driver's steps first: the event log's writes (this transition's among them) wait until it answers, so an
    // embedded database's CPU time does not land between `stop` and the snapshot's commit (event-log.ts `hold`).
    const release = this.events.hold();
    this.transition(entry, "snapshotting", reason);
    this.endActivity(entry, reason);
    const promise = (async () => {
      try {
        const result = await this.deps.driver.hibernate(vm, abort.signal).finally(release);
        if (entry.running !== vm) return; // crashed meanwhile: the exit handler recorded it
        if (result.completed) {
          entry.running = undefined;
          entry.hibernateFailures = 0;
          entry.hibernateRetryAt = undefined;
          entry.lastHibernateError = undefined;
          this.transition(entry, "hibernated", reason, { snapshotMs: round(result.snapshotMs), snapshotBytes: result.bytes });
          this.metrics.inc("agentvm_snapshot_bytes_total", {}, result.bytes);
          this.metrics.observe("agentvm_snapshot_seconds", { reason }, seconds(result.snapshotMs));
          const sleptAt = this.endRun(entry, reason);
          // In the background: the snapshot here is enough to wake here. The commit's time is the run's end, which
          // placement compares to tell whether the store has the agent's last state (gateway/placement.ts `carryable`).
          if (sleptAt) void this.deps.shipper?.commit({ spec: entry.spec, vmSpec: entry.vmSpec, generation: entry.generation, snapshotAt: sleptAt }).catch(() => undefined);
        } else {
          this.transition(entry, "running", "cancelled");
          entry.lastActivityAt = this.deps.clock.monotonic();
          this.startActivity(entry, "request");
        }
      } catch (err) {
        // The driver resumed the VM (or ended it, and its exit handler recorded that): it keeps its state.
        if (entry.running !== vm || entry.state !== "snapshotting") return;
        this.hibernateFailed(entry, reason, err);
        if (reason === "shutdown") await this.stopAfterFailedShutdownSnapshot(entry, vm);
      } finally {
        entry.hibernation = undefined;
      }
    })();
    entry.hibernation = { promise, abort };
    return promise;
  }

  /**
   * A snapshot that could not be written leaves the VM as it was: running, metered again (as after a cancelled
   * snapshot), the failure in the event log and the host's status with its real cause, and no new idle attempt
   * before a backoff that grows with every failure in a row.
   */
  private hibernateFailed(entry: VmEntry, reason: SleepReason, err: unknown): void {
    const { clock } = this.deps;
    const detail = snapshotFailureDetail(err);
    const attempts = ++entry.hibernateFailures;
    this.metrics.inc("agentvm_hibernate_failures_total", {});
    const retryInMs = hibernateRetryMs(attempts, this.deps.config.hibernateRetry ?? defaultHibernateRetry);
    entry.hibernateRetryAt = clock.monotonic() + retryInMs;
    const { error, code, neededBytes, freeBytes } = detail;
    entry.lastHibernateError = { at: clock.now(), message: error, code, neededBytes, freeBytes, attempts, retryAt: clock.now() + retryInMs };
    this.deps.log.error("hibernate failed; the VM stays awake", { agentId: entry.spec.id, vmId: entry.vmSpec.vmId, reason, ...detail, attempts, retryInMs });
    this.transition(entry, "running", "hibernate_failed", undefined, { ...detail, sleepReason: reason, attempts, retryInMs });
    this.startActivity(entry, "request");
  }

  /** At shutdown there is no later attempt: the VM is stopped, and the event log says what its last snapshot misses. */
  private async stopAfterFailedShutdownSnapshot(entry: VmEntry, vm: RunningVm): Promise<void> {
    await this.deps.driver.stop(vm).catch((err) => this.deps.log.warn("stop failed", { agentId: entry.spec.id, err }));
    if (entry.running !== vm || entry.state !== "running") return;
    entry.running = undefined;
    this.endActivity(entry, "shutdown");
    this.transition(entry, "stopped", "shutdown", undefined, { error: "hibernate failed at shutdown: what the VM did since its last snapshot is lost" });
    this.endRun(entry, "shutdown");
  }

  private startActivity(entry: VmEntry, reason: WakeReason): void {
    const { clock } = this.deps;
    this.deps.activity.active({
      at: clock.now(),
      mono: clock.monotonic(),
      hostId: this.hostId,
      vmId: entry.vmSpec.vmId,
      agentId: entry.spec.id,
      tenantId: entry.spec.tenantId,
      runId: entry.runId!,
      vcpus: entry.vmSpec.vcpus,
      memMiB: entry.vmSpec.memMiB,
      reason,
    });
  }

  private endActivity(entry: VmEntry, reason: SleepReason): void {
    this.deps.activity.inactive({ at: this.deps.clock.now(), mono: this.deps.clock.monotonic(), vmId: entry.vmSpec.vmId, reason });
  }

  /** Ends the VM's run now; answers when (undefined: it had none). */
  private endRun(entry: VmEntry, reason: SleepReason): Date | undefined {
    const runId = entry.runId;
    if (!runId) return undefined;
    entry.runId = undefined;
    const at = new Date(this.deps.clock.now());
    this.events.runEnded(runId, at, reason);
    return at;
  }

  private transition(entry: VmEntry, to: VmState, reason: TransitionReason, timings?: TransitionTimings, detail?: Record<string, unknown>): void {
    const from = entry.state;
    if (!canTransition(from, to)) throw new IllegalTransition(from, to);
    entry.state = to;
    const record = {
      at: new Date(this.deps.clock.now()),
      hostId: this.hostId,
      agentId: entry.spec.id,
      tenantId: entry.spec.tenantId,
      vmId: entry.vmSpec.vmId,
      runId: entry.runId ?? null,
      fromState: from,
      toState: to,
      reason,
      timings: timings ?? null,
      detail: detail ?? null,
      generation: entry.generation,
    };
    this.events.transition(record);
  }
}

/** The driver lacks a checkpoint method: a capability this host has not, whatever the agent's state. */
function unsupported(driver: string, op: string): AppError {
  return new AppError("checkpoints_unsupported", `the ${driver} driver keeps no checkpoints (${op}): it has no memory state to copy`);
}

/** Only the fields of the view: a driver's own record (qemu's has the checkpoint directory) stays on the host. */
function templateView(t: DriverTemplate, hostId: string): TemplateView {
  const view: TemplateView = { hostId, key: t.key, image: t.image, memMiB: t.memMiB, vcpus: t.vcpus, allowEgress: t.allowEgress, state: t.state };
  if (t.createdAt !== undefined) view.createdAt = t.createdAt;
  if (t.bytes !== undefined) view.bytes = t.bytes;
  if (t.bootMs !== undefined) view.bootMs = t.bootMs;
  if (t.error !== undefined) view.error = t.error;
  return view;
}

/** One VM per agent per host: its id is derived from the agent's, so meters and logs line up across restarts. */
export function vmIdFor(agentId: string): string {
  return `vm_${agentId.replace(/^agt_/, "")}`;
}

function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}

// The host core: owns this host's VMs and composes the parts that wake, hibernate, fence, checkpoint, drain and evict them (fleet-agent/host/).
import { dirname, join } from "node:path";
import type { Clock } from "../lib/clock.ts";
import { AppError } from "../lib/errors.ts";
import { isId } from "../lib/ids.ts";
import type { VmEntry } from "./vm-entry.ts";
import type { Logger } from "../lib/log.ts";
import { noopMetrics, type Metrics } from "../lib/metrics.ts";
import type { DriverTemplate, ExecTarget, VmDriver } from "./drivers/driver.ts";
import type { HostStore } from "./store.ts";
import type { AgentSpec, Lease, VmState, VmStatus, WakeInfo, WakeReason } from "../contracts/agent.ts";
import type { ExchangeObserver } from "./egress/exchanges.ts";
import type { ActivityListener } from "./activity.ts";
import { EventLog } from "./event-log.ts";
import { nodeHostFs, type HostFs } from "./host-fs.ts";
import { IdleReaper, type HibernateRetry } from "./reaper.ts";
import type { Ticket } from "./tickets.ts";
import { liveLeases } from "./leases.ts";
import type { ImageArtifact, ImageLocator } from "../contracts/image.ts";
import type { LogReadOptions, TemplateView } from "../contracts/fleet.ts";
import { defaultLogLimits, LogRotator, openLogStream, type LogLimits } from "./agent-logs.ts";
import type { CheckpointRecord, CheckpointStore } from "./checkpoints.ts";
import type { SnapshotShipper } from "./artifacts/shipper.ts";
import { Checkpointer } from "./host/checkpointer.ts";
import { DozeController, type DozeConfig } from "./host/doze.ts";
import { Drain, type DrainReason } from "./host/drain.ts";
import { Eviction } from "./host/eviction.ts";
import { Fencing } from "./host/fencing.ts";
import { DiskGenerations } from "./host/generations.ts";
import { Hibernation } from "./host/hibernation.ts";
import { Lifecycle } from "./host/lifecycle.ts";
import { Metering } from "./host/metering.ts";
import { fileRunRecords, type RunRecords } from "./host/rollbacks.ts";
import { Startup } from "./host/startup.ts";
import { VmTable } from "./host/vms.ts";
import { Waking } from "./host/wake.ts";

export { vmIdFor } from "../contracts/agent.ts";

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
  /** When a VM whose open calls all wait on outbound calls dozes (host/doze.ts); default: never (`afterMs` 0). */
  doze?: DozeConfig;
  /** The meter's heartbeat, ms: bounds the awake time a rollback reports for a run the meter recorded nothing of. */
  meterHeartbeatMs?: number;
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
  /** Each VM's last run, against which a restore tells a rollback (host/rollbacks.ts); files in the state directories unless a test passes its own. */
  runRecords?: RunRecords;
  /** Where built images' files are on this host (agents whose `image` is a digest); none unless given. */
  images?: ImageLocator;
  /** Fetches an image this host lacks from the shared store (images/build/host-images.ts); absent: no store. */
  fetchImage?(digest: string): Promise<ImageArtifact | undefined>;
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

export class Host {
  private readonly deps: HostDeps;
  private readonly fs: HostFs;
  private readonly vms: VmTable;
  private readonly events: EventLog;
  private readonly reaper: IdleReaper;
  /** Keeps the awake agents' logs bounded (agent-logs.ts). */
  private readonly logRotator: LogRotator;
  /** The VM gauges' registrations, undone when the host stops. */
  private readonly unregisterGauges: (() => void)[];
  private stopping = false;
  /** Explicit hibernations waiting for calls that are finishing: told at every release of a ticket. */
  private readonly releaseWaiters: (() => void)[] = [];
  private readonly startup: Startup;
  private readonly drain: Drain;
  private readonly checkpoints: Checkpointer;
  private readonly eviction: Eviction;
  private readonly fencing: Fencing;
  private readonly hibernation: Hibernation;
  private readonly waking: Waking;
  private readonly doze: DozeController;

  constructor(deps: HostDeps) {
    this.deps = deps;
    const { config, clock, log, driver } = deps;
    const { hostId, vmsDir } = config;
    const fs = (this.fs = deps.fs ?? nodeHostFs);
    const events = (this.events = new EventLog(deps.store, log));
    const metrics = deps.metrics ?? noopMetrics;
    const checkpointsDir = config.checkpointsDir ?? join(dirname(vmsDir), "checkpoints");
    // What a host may lack (a test's, a driver's): passed on only when given.
    const images = { ...(deps.images ? { images: deps.images } : {}), ...(deps.fetchImage ? { fetchImage: deps.fetchImage } : {}) };
    const checkpointStore = deps.checkpoints ? { checkpoints: deps.checkpoints } : {};
    const shipper = deps.shipper ? { shipper: deps.shipper } : {};
    const hibernateRetry = config.hibernateRetry ? { hibernateRetry: config.hibernateRetry } : {};
    // Each part gets what it uses, not the host. The parts that need one another (a checkpoint fences its caller first,
    // an eviction waits for checkpoint work) get functions that reach it once it is built.
    const vms = (this.vms = new VmTable({ hostId, vmsDir, fs, clock, ...images }));
    const lifecycle = new Lifecycle({ hostId, clock, events });
    const records = deps.runRecords ?? fileRunRecords;
    const metering = new Metering({ hostId, clock, activity: deps.activity, events, records, log });
    const generations = new DiskGenerations(vmsDir);
    this.startup = new Startup({ vmsDir, checkpointsDir, fs, driver, log, vms, ...checkpointStore });
    this.drain = new Drain({ clock, log, drainTimeoutMs: config.drainTimeoutMs, inFlight: () => vms.inFlight() });
    const leased = (spec: AgentSpec) => this.fencing.leased(spec);
    // A dozing VM runs again before anything that needs it as it is (a checkpoint, a snapshot, shutdown): reason `api`.
    const resumeDozing = (entry: VmEntry) => this.doze.resumeFor(entry, "api");
    const left = (entry: VmEntry) => this.doze.left(entry);
    const checkpoints = (this.checkpoints = new Checkpointer({
      hostId,
      clock,
      log,
      driver,
      checkpointsDir,
      vms,
      lifecycle,
      metering,
      leased,
      resumeDozing,
      ...checkpointStore,
    }));
    const checkpointBusy = (agentId: string) => checkpoints.busy(agentId);
    const removeCheckpointsOf = (agentId: string) => checkpoints.removeCheckpointsOf(agentId);
    const eviction = (this.eviction = new Eviction({ driver, log, vms, lifecycle, metering, generations, checkpointBusy, removeCheckpointsOf, left }));
    const draining = () => this.drain.isDraining;
    const fencing = (this.fencing = new Fencing({ hostId, vmsDir, clock, fs, store: deps.store, events, vms, generations, eviction, draining }));
    const checkpointWorkOn = (agentId: string) => checkpoints.has(agentId);
    this.hibernation = new Hibernation({ clock, log, metrics, driver, events, lifecycle, metering, ...hibernateRetry, ...shipper, checkpointWorkOn });
    this.waking = new Waking({
      hostId,
      clock,
      log,
      metrics,
      fs,
      driver,
      events,
      lifecycle,
      metering,
      vms,
      rollbacks: {
        records,
        meteredUntil: (vmId, runId) => deps.activity.lastAwakeAt?.(vmId, runId),
        hostStartedAt: clock.now(),
        ...(config.meterHeartbeatMs !== undefined ? { heartbeatMs: config.meterHeartbeatMs } : {}),
      },
      wakeQueueLimit: config.wakeQueueLimit,
      wakeDeadlineMs: config.wakeDeadlineMs,
      checkpointsDir,
      ...shipper,
      stopping: () => this.stopping,
      leased,
      leasedNow: (spec) => fencing.leasedNow(spec),
      ownerCheck: (entry) => fencing.ownerCheck(entry),
      draining: () => this.drain.isDraining,
      handOff: (entry) => fencing.handOff(entry),
      checkpointBusy,
      removing: (agentId) => eviction.removing(agentId),
      released: () => {
        this.drain.released();
        for (const settled of this.releaseWaiters.splice(0)) settled();
      },
      resumeDozing: (entry, reason) => this.doze.resumeFor(entry, reason === "boot" ? "api" : reason),
      left,
    });
    this.doze = new DozeController({
      clock,
      log,
      metrics,
      driver,
      lifecycle,
      metering,
      config: config.doze ?? { afterMs: 0, maxMs: 60_000 },
      cpuBusyThreshold: config.cpuBusyThreshold,
      entryOf: (vmId) => vms.byVmId(vmId),
      held: (entry) => this.stopping || checkpoints.has(entry.spec.id),
      // A VM that could not run again is a crash: recorded as one, then its process (still there, paused) is stopped.
      crashed: (entry, vm, detail) => {
        this.waking.crashed(entry, vm, detail);
        void driver.stop(vm).catch((err) => log.warn("stopping a VM that could not resume failed", { agentId: entry.spec.id, err }));
      },
    });
    this.reaper = new IdleReaper({
      clock,
      // Where the reaper asks an awake VM for its guest leases, the host also takes the checkpoints it asked for.
      driver: {
        guestLeases: async (vm) => {
          await checkpoints.takeGuestCheckpoints(vm);
          return driver.guestLeases(vm);
        },
        cpuSeconds: (vm) => driver.cpuSeconds(vm),
      },
      log,
      intervalMs: config.reaperIntervalMs,
      cpuBusyThreshold: config.cpuBusyThreshold,
      vms: () => vms.values(),
      hibernate: (entry, reason) => {
        for (const t of [...entry.tickets]) t.hibernating();
        const resumed = resumeDozing(entry);
        void (resumed ? resumed.then(() => this.hibernation.hibernate(entry, reason)) : this.hibernation.hibernate(entry, reason));
      },
      draining: () => this.drain.isDraining,
    });
    // Only awake agents write to their logs: theirs are the ones to look at.
    this.logRotator = new LogRotator({
      clock,
      log,
      limits: config.logs ?? defaultLogLimits,
      paths: () => [...vms.values()].filter((e) => e.running).map((e) => driver.logPath(e.vmSpec)),
    });
    // States, read when scraped: nothing to keep in step with the transitions.
    this.unregisterGauges = [
      // A dozing VM is not awake (its vCPUs are stopped, it is not active time): it has a gauge of its own.
      metrics.gauge("agentvm_vms_awake", () => vms.count((s) => s === "running" || s === "snapshotting")),
      metrics.gauge("agentvm_vms_dozing", () => vms.count((s) => s === "dozing")),
      metrics.gauge("agentvm_vms_hibernated", () => vms.count((s) => s === "hibernated")),
    ];
  }

  get hostId(): string {
    return this.deps.config.hostId;
  }

  get driverName(): string {
    return this.deps.driver.name;
  }

  /** What the egress proxy tells about the VMs' outbound exchanges: the doze's input (host/doze.ts). */
  get exchanges(): ExchangeObserver {
    return this.doze;
  }

  /** Cleans up VM processes an earlier host process left behind (their snapshots stay), then starts the reaper. */
  async start(): Promise<void> {
    await this.startup.cleanUp();
    this.reaper.start();
    this.logRotator.start();
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
    await this.drain.waitForRequests();
    for (const entry of this.vms.values()) {
      for (const t of [...entry.tickets]) t.hibernating();
      await this.checkpoints.busy(entry.spec.id);
      await entry.wake?.catch(() => undefined);
      await entry.hibernation?.promise;
      await this.doze.resumeFor(entry, "api"); // a dozing VM's snapshot is taken running, as any other's
      if (entry.state === "running") await this.hibernation.hibernate(entry, "shutdown");
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
    return this.vms.inFlight();
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

  /** Whose VM `vmId` is now: its agent, tenant and run (the egress proxy's upstream path asks); undefined when not known here. */
  vmOwner(vmId: string): { agentId: string; tenantId: string; runId: string | undefined } | undefined {
    const e = this.vms.get(`agt_${vmId.replace(/^vm_/, "")}`) ?? [...this.vms.values()].find((v) => v.vmSpec.vmId === vmId);
    if (!e || e.vmSpec.vmId !== vmId) return undefined;
    return { agentId: e.spec.id, tenantId: e.spec.tenantId, runId: e.runId };
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
    const path = this.deps.driver.logPath(entry?.vmSpec ?? this.vms.bareSpec(agentId));
    this.logRotator.check(path);
    return openLogStream(path, { ...opts, gone: () => !this.vms.has(agentId) && !this.fs.hasStateDir(stateDir) });
  }

  /**
   * Holds the agent's VM awake for one request, waking it first if needed. Concurrent callers share one
   * wake; callers beyond the queue limit, or still waiting at the deadline, get a 503 with Retry-After. `requestId`: the
   * call that asked (the wake it starts records it, in the event log's detail and the audit log). `handOff`: the
   * caller can repeat the call elsewhere, so while this host drains a sleeping agent is not woken (`host_draining`).
   */
  acquire(spec: AgentSpec, reason: WakeReason, requestId?: string, opts: { handOff?: boolean } = {}): Promise<Ticket> {
    return this.waking.acquire(spec, reason, requestId, opts);
  }

  /** `acquire` when the VM is awake and nothing is to be waited for: a ticket at once, else undefined (then `acquire`). */
  acquireWarm(spec: AgentSpec, reason: WakeReason): Ticket | undefined {
    return this.waking.acquireWarm(spec, reason);
  }

  /**
   * Where the exec server of the agent's VM answers, with the key its requests carry (the driver's `execTarget`), for a
   * call that holds the VM awake (a ticket): 501 exec_unsupported when this host's driver has none; its AppErrors
   * (409 guest_outdated) as they are.
   */
  async execTarget(agentId: string): Promise<ExecTarget> {
    const { driver } = this.deps;
    if (!driver.execTarget) throw new AppError("exec_unsupported", "this host's driver cannot run commands or reach files inside its VMs");
    const running = this.vms.get(agentId)?.running;
    // A held VM runs: its ticket keeps it so until the call is over.
    if (!running) throw new AppError("wake_failed", `agent ${agentId} is not running`, { retryAfterS: 1 });
    try {
      return await driver.execTarget(running);
    } catch (err) {
      if (err instanceof AppError) throw err;
      // The VM ended under the call (deleted, or it crashed) while its exec server was being reached: said as such.
      if (this.deleted(agentId)) throw new AppError("not_found", `agent ${agentId} was deleted`, { cause: err });
      if (this.vms.get(agentId)?.running !== running)
        throw new AppError("wake_failed", `agent ${agentId} stopped while the call began: try again`, { retryAfterS: 1, cause: err });
      throw err;
    }
  }

  /** Whether the agent was deleted here, or its deletion is under way: a call that fails meanwhile failed for that. */
  deleted(agentId: string): boolean {
    const entry = this.vms.get(agentId);
    return !entry || entry.state === "destroyed" || this.eviction.removing(agentId);
  }

  /** Wakes the agent (reason `api`) without holding it. */
  async wake(spec: AgentSpec, reason: WakeReason = "api", opts: { handOff?: boolean } = {}): Promise<WakeInfo> {
    const ticket = await this.acquire(spec, reason, undefined, opts);
    ticket.release();
    return ticket.wake;
  }

  /**
   * Explicit hibernation (reason `api`): refused while requests are in flight. `settleMs`: how long calls in flight may
   * take to end first — a call whose client already has its answer (an exec's exit line, a file's last byte) still
   * holds the VM until its stream's end is seen, a moment later — before the refusal (the API's hibernate: 2 s).
   */
  async hibernateNow(agentId: string, opts: { settleMs?: number } = {}): Promise<VmState> {
    const entry = this.vms.get(agentId);
    if (!entry) return "hibernated";
    await this.checkpoints.busy(agentId);
    await entry.wake?.catch(() => undefined);
    if (entry.hibernation) await entry.hibernation.promise;
    if (entry.state !== "running" && entry.state !== "dozing") return entry.state;
    const waiting = await this.settled(entry, opts.settleMs ?? 0);
    if (waiting > 0) throw new AppError("conflict", `agent ${agentId} has ${waiting} request(s) in flight`);
    if (entry.state !== "running" && entry.state !== "dozing") return entry.state; // it changed while the calls ended
    await this.doze.resumeFor(entry, "api"); // no call waits on it: it dozes for an outbound call of its own
    if (entry.state !== "running") return entry.state;
    for (const t of [...entry.tickets]) t.hibernating();
    await this.hibernation.hibernate(entry, "api");
    return entry.state;
  }

  /** The entry's calls waiting on the VM, after up to `ms` for them to end (on the injected clock): how many are left. */
  private async settled(entry: VmEntry, ms: number): Promise<number> {
    const waiting = () => entry.tickets.filter((t) => t.phase === "waiting").length;
    if (waiting() === 0 || ms <= 0) return waiting();
    let timedOut = false;
    let wakeUp: () => void = () => {};
    const timer = this.deps.clock.setTimeout(() => {
      timedOut = true;
      wakeUp();
    }, ms);
    try {
      while (waiting() > 0 && !timedOut) {
        await new Promise<void>((resolve) => {
          wakeUp = resolve;
          this.releaseWaiters.push(resolve);
        });
      }
    } finally {
      timer.cancel();
    }
    return waiting();
  }

  /** A keep-awake lease: wakes the agent if it sleeps and keeps it awake until the lease expires or is dropped. */
  async addLease(spec: AgentSpec, ttlMs: number): Promise<Lease> {
    const ticket = await this.acquire(spec, "api");
    try {
      const leaseId = this.vms.entryFor(spec).leases.add(this.deps.clock.monotonic() + ttlMs);
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
  remove(agentId: string): Promise<void> {
    return this.eviction.remove(agentId);
  }

  /** The driver's warm templates as the API shows them (this host's id added, their paths left out); none when it keeps none. */
  async templates(): Promise<TemplateView[]> {
    const listed = (await this.deps.driver.listTemplates?.()) ?? [];
    return listed.map((t) => templateView(t, this.hostId));
  }

  /** Keeps a checkpoint of the agent (host/checkpointer.ts). */
  checkpoint(spec: AgentSpec, opts: { name?: string; origin: CheckpointRecord["origin"]; requestId?: string }): Promise<CheckpointRecord> {
    return this.checkpoints.checkpoint(spec, opts);
  }

  /** Rolls the agent back to one of its checkpoints: it is `hibernated` on it (host/checkpointer.ts). */
  restoreCheckpoint(spec: AgentSpec, checkpointId: string, requestId?: string): Promise<VmState> {
    return this.checkpoints.restoreCheckpoint(spec, checkpointId, requestId);
  }

  /** A new agent (never run) from a checkpoint (host/checkpointer.ts). */
  fork(spec: AgentSpec, checkpointId: string, requestId?: string): Promise<VmState> {
    return this.checkpoints.fork(spec, checkpointId, requestId);
  }

  /** Removes a checkpoint's files and marks its row deleted (host/checkpointer.ts). */
  deleteCheckpoint(agentId: string, checkpointId: string): Promise<void> {
    return this.checkpoints.deleteCheckpoint(agentId, checkpointId);
  }

  /** One pass of the idle reaper (exposed for tests that drive time by hand). */
  reapIdle(): Promise<void> {
    return this.reaper.pass();
  }

  /**
   * Runs `work` apart from the agent's wakes, snapshots and checkpoints, and only while it is still hibernated: the
   * shipper's checkpoint step reads the snapshot's files, which a wake since the hibernation has moved on (the next
   * hibernation commits instead).
   */
  whileHibernated<T>(agentId: string, work: () => Promise<T>): Promise<T> {
    return this.checkpoints.whileHibernated(agentId, work);
  }

  /** Stops this host's copy of every agent the database says it no longer owns; answers how many (host/fencing.ts). */
  fence(): Promise<number> {
    return this.fencing.fence();
  }

  /**
   * After each heartbeat: drain as the host's row says, or while the host's clock is off (`clockSkewed`: gateways'
   * tokens are refused here, so its agents must sleep and wake elsewhere), then `fence`.
   */
  async afterHeartbeat(beat: { clockSkewed: boolean } = { clockSkewed: false }): Promise<void> {
    const operator = await this.deps.store.draining(this.hostId);
    this.setDraining(operator || beat.clockSkewed, operator ? "operator" : "clock_skew");
    await this.fence();
  }

  /** Drain on or off (host/drain.ts): as the host's row says, or while its clock is off. */
  setDraining(on: boolean, why: DrainReason = "operator"): void {
    this.drain.set(on, why);
  }

  /** The built images (digests) this host's awake VMs run: what a trim of its cached images must keep. */
  imagesInUse(): Set<string> {
    return this.vms.imagesAwake();
  }

  /** Memory of the VMs awake here (booting, running, restoring, snapshotting) and how many they are: what the heartbeat reports. */
  load(): { usedMiB: number; awakeAgents: number } {
    return this.vms.load();
  }
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

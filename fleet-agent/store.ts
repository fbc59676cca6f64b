// Where a host records what happened to its VMs: the event log, awake runs, agents' last known state.
import { and, eq, inArray, isNull, lt, lte, or, sql } from "drizzle-orm";
import type { Db } from "../schema/db.ts";
import { agents, hosts, runs, vmEvents } from "../schema/core.ts";
import { createDbAuditLog } from "../schema/audit-log.ts";
import type { TransitionTimings, WakeTimings } from "../contracts/agent.ts";

export interface TransitionRecord {
  at: Date;
  hostId: string;
  agentId: string;
  tenantId: string;
  vmId: string;
  runId: string | null;
  fromState: string;
  toState: string;
  reason: string;
  timings: TransitionTimings | null;
  detail: Record<string, unknown> | null;
  /** The lease generation the host ran the agent under: the agent's row takes the state only while it still says this host and generation. */
  generation?: number;
}

export interface RunStart {
  id: string;
  agentId: string;
  tenantId: string;
  hostId: string;
  vmId: string;
  wokeAt: Date;
  wakeReason: string;
  wakeMode: string;
  timings: WakeTimings;
}

/** A run as a starting host reads it back (crash recovery). */
export interface RunRow extends Pick<RunStart, "id" | "agentId" | "tenantId" | "hostId" | "vmId" | "wokeAt"> {
  sleptAt: Date | null;
  sleepReason: string | null;
}

/** An agent's row as a starting host reads it back: its last reported state and the host it is on. */
export interface AgentStateRow {
  id: string;
  tenantId: string;
  state: string;
  hostId: string | null;
}

/** States no VM keeps across a restart of its host: an agent's row left in one of them was cut off by a crash. */
export const awakeStates: readonly string[] = ["booting", "running", "dozing", "snapshotting", "restoring"];

/** What an earlier process of a host left behind in the database. */
export interface HostLeftovers {
  /** Its runs with no end, woken before `before`, with their agents' rows (null for an agent that is gone). */
  openRuns: (RunRow & { agent: AgentStateRow | null })[];
  /** The agents on it whose row says a state no restart keeps (`awakeStates`). */
  awakeAgents: AgentStateRow[];
}

/** What a starting host records for one agent an earlier process of it left mid-run (one transaction). */
export interface CrashRecord {
  at: Date;
  hostId: string;
  agentId: string;
  tenantId: string;
  vmId: string;
  /** Runs to close: each ends at the last instant the meter knew the VM awake, reason `crash`. */
  runs: { id: string; sleptAt: Date }[];
  /** The crash transition of the event log (reason `crash`), from the state the row said to the one the host has. */
  fromState: string;
  toState: string;
  runId: string | null;
  detail: Record<string, unknown>;
  /** Whether the agent's row is this host's and gets `toState` (it is left alone when the agent moved on). */
  setAgentState: boolean;
}

/** Who owns an agent now, as the database says (fencing: a host stops its copy of an agent it no longer owns). */
export interface AgentOwner {
  hostId: string | null;
  generation: number;
  deleted: boolean;
}

export interface HostStore extends HostRecoveryStore {
  /** The owners of these agents; agents without a row are left out. */
  owners(agentIds: readonly string[]): Promise<Map<string, AgentOwner>>;
  /**
   * Before this host wakes the agent: in one statement, whether its row still gives it to `hostId` under `generation`
   * (or an older one), and if so marks it waking (`restoring`, or `booting` for a first boot) unless it is awake
   * already. A gateway's move of a sleeping agent (gateway/placement.ts) only takes a row that still says it sleeps:
   * of a wake and a move that race, exactly one goes ahead. Answers the owner when the claim was refused (moved, or
   * a newer generation); undefined when it holds (or the agent has no row, or no host: nothing to fence against).
   */
  claimWake(agentId: string, hostId: string, generation: number): Promise<AgentOwner | undefined>;
  /**
   * A draining host that will not wake the agent says at once that it sleeps here (`state`), while the row is still
   * its own under `generation`: the row may lag behind the host's queued writes, and a gateway moves only an agent
   * whose row says it sleeps.
   */
  markAsleep(agentId: string, hostId: string, generation: number, state: "hibernated" | "stopped"): Promise<void>;
  /** Whether an operator drains this host (its row's `draining_at`). */
  draining(hostId: string): Promise<boolean>;
  transition(r: TransitionRecord): Promise<void>;
  runStarted(r: RunStart): Promise<void>;
  runTimings(runId: string, timings: WakeTimings): Promise<void>;
  runEnded(runId: string, sleptAt: Date, reason: string): Promise<void>;
}

/** The part of the store crash recovery (recovery.ts) reads and writes at host start. */
export interface HostRecoveryStore {
  /** Read at start: what an earlier process of `hostId` left open (runs woken before `before`, awake agents). */
  leftovers(hostId: string, before: Date): Promise<HostLeftovers>;
  /** Closes what a crash left open for one agent and says so in the event log (and the audit log), atomically. */
  recordCrash(c: CrashRecord): Promise<void>;
}

/** Wakes and hibernations are audited; the intermediate states are in the VM event log only. */
const auditedStates: Record<string, string> = { running: "vm.wake", hibernated: "vm.hibernate", failed: "vm.fail", destroyed: "vm.destroy" };

export function createDbHostStore(db: Db): HostStore {
  const audit = createDbAuditLog(db);
  return {
    async transition(r) {
      // One transaction: a host killed between the event and the row would leave the event log saying a state the row
      // never got, and the restart's recovery (which reads the row) would not close it.
      await db.transaction(async (tx) => {
        await tx.insert(vmEvents).values(r);
        const patch: Partial<typeof agents.$inferInsert> = { state: r.toState, hostId: r.hostId };
        // A doze and its resume are no wake: the row's state says `dozing`, the audit log and `lastWakeAt` stay as they were.
        const doze = r.fromState === "dozing" || r.toState === "dozing";
        if (r.toState === "running" && !doze) patch.lastWakeAt = r.at;
        // Fenced: a host whose lease on the agent ended (it moved to another host, a newer generation) changes nothing of
        // its row, even when this write was spooled through an outage and replayed later. The event log keeps it all.
        await tx
          .update(agents)
          .set(patch)
          .where(and(eq(agents.id, r.agentId), or(isNull(agents.hostId), eq(agents.hostId, r.hostId)), eq(agents.generation, r.generation ?? 0)));
        const action = doze ? undefined : auditedStates[r.toState];
        if (!action) return;
        await audit.within(tx).record({
          at: r.at,
          tenantId: r.tenantId,
          actor: r.hostId,
          action,
          target: r.agentId,
          // A wake a call caused carries the call's request id (host.acquire puts it in the detail).
          requestId: typeof r.detail?.requestId === "string" ? r.detail.requestId : null,
          detail: { from: r.fromState, reason: r.reason, runId: r.runId, ...(r.timings ? { timings: r.timings } : {}), ...(r.detail ?? {}) },
        });
      });
    },
    async runStarted(r) {
      await db.insert(runs).values(r);
    },
    async runTimings(runId, timings) {
      await db.update(runs).set({ timings }).where(eq(runs.id, runId));
    },
    async owners(agentIds) {
      const out = new Map<string, AgentOwner>();
      if (agentIds.length === 0) return out;
      const rows = await db
        .select({ id: agents.id, hostId: agents.hostId, generation: agents.generation, deletedAt: agents.deletedAt })
        .from(agents)
        .where(inArray(agents.id, [...agentIds]));
      for (const r of rows) out.set(r.id, { hostId: r.hostId, generation: r.generation, deleted: r.deletedAt !== null });
      return out;
    },
    async claimWake(agentId, hostId, generation) {
      // The host wakes only a VM that sleeps here: a row still saying it runs, dozes or snapshots lags behind the host's
      // queued writes, and is claimed as one that sleeps.
      const claimed = await db
        .update(agents)
        .set({
          state: sql`case when ${agents.state} = 'creating' then 'booting' when ${agents.state} in ('hibernated', 'stopped', 'running', 'dozing', 'snapshotting') then 'restoring' else ${agents.state} end`,
        })
        .where(and(eq(agents.id, agentId), eq(agents.hostId, hostId), lte(agents.generation, generation), isNull(agents.deletedAt)))
        .returning({ id: agents.id });
      if (claimed.length > 0) return undefined;
      const owner = (await this.owners([agentId])).get(agentId);
      return owner && !owner.deleted && owner.hostId !== null ? owner : undefined;
    },
    async markAsleep(agentId, hostId, generation, state) {
      await db
        .update(agents)
        .set({ state })
        .where(and(eq(agents.id, agentId), eq(agents.hostId, hostId), eq(agents.generation, generation), isNull(agents.deletedAt)));
    },
    async draining(hostId) {
      const [row] = await db.select({ drainingAt: hosts.drainingAt }).from(hosts).where(eq(hosts.id, hostId));
      return row?.drainingAt != null;
    },
    async runEnded(runId, sleptAt, reason) {
      await db.update(runs).set({ sleptAt, sleepReason: reason }).where(eq(runs.id, runId));
    },
    async leftovers(hostId, before) {
      const runCols = {
        id: runs.id,
        agentId: runs.agentId,
        tenantId: runs.tenantId,
        hostId: runs.hostId,
        vmId: runs.vmId,
        wokeAt: runs.wokeAt,
        sleptAt: runs.sleptAt,
        sleepReason: runs.sleepReason,
      };
      const agentCols = { id: agents.id, tenantId: agents.tenantId, state: agents.state, hostId: agents.hostId };
      const open = await db
        .select({ run: runCols, agent: agentCols })
        .from(runs)
        .leftJoin(agents, eq(agents.id, runs.agentId))
        .where(and(eq(runs.hostId, hostId), isNull(runs.sleptAt), lt(runs.wokeAt, before)));
      const onHost = and(eq(agents.hostId, hostId), isNull(agents.deletedAt));
      const awakeAgents = await db
        .select(agentCols)
        .from(agents)
        .where(and(onHost, inArray(agents.state, [...awakeStates])));
      return { openRuns: open.map((r) => ({ ...r.run, agent: r.agent })), awakeAgents };
    },
    async recordCrash(c) {
      await db.transaction(async (tx) => {
        for (const run of c.runs)
          await tx
            .update(runs)
            .set({ sleptAt: run.sleptAt, sleepReason: "crash" })
            .where(and(eq(runs.id, run.id), isNull(runs.sleptAt)));
        await tx.insert(vmEvents).values({
          at: c.at,
          hostId: c.hostId,
          agentId: c.agentId,
          vmId: c.vmId,
          runId: c.runId,
          fromState: c.fromState,
          toState: c.toState,
          reason: "crash",
          timings: null,
          detail: c.detail,
        });
        if (c.setAgentState) {
          await tx
            .update(agents)
            .set({ state: c.toState })
            .where(and(eq(agents.id, c.agentId), eq(agents.hostId, c.hostId), inArray(agents.state, [...awakeStates])));
        }
        await audit.within(tx).record({
          at: c.at,
          tenantId: c.tenantId,
          actor: c.hostId,
          action: "vm.crash",
          target: c.agentId,
          detail: { from: c.fromState, to: c.toState, runId: c.runId, ...c.detail },
        });
      });
    },
  };
}

/** What the in-memory store keeps, for tests to look at. */
export interface MemoryHostStore extends HostStore {
  transitions: TransitionRecord[];
  runs: Map<string, RunStart & { sleptAt?: Date; sleepReason?: string }>;
  /** Agents' rows as transitions left them (tests may seed them). */
  agentRows: Map<string, AgentStateRow>;
  crashes: CrashRecord[];
  /** Who owns an agent, when a test moves it to another host or generation. */
  owned: Map<string, AgentOwner>;
  /** What `draining` answers (a test drains the host by setting it). */
  drainingNow: { value: boolean };
}

/** Keeps everything in arrays: for unit tests of the host's logic. */
export function createMemoryHostStore(): MemoryHostStore {
  const transitions: TransitionRecord[] = [];
  const runMap = new Map<string, RunStart & { sleptAt?: Date; sleepReason?: string }>();
  const agentRows = new Map<string, AgentStateRow>();
  const crashes: CrashRecord[] = [];
  const owners = new Map<string, AgentOwner>();
  const drainingNow = { value: false };
  const runRow = (r: RunStart & { sleptAt?: Date; sleepReason?: string }): RunRow => ({ ...r, sleptAt: r.sleptAt ?? null, sleepReason: r.sleepReason ?? null });
  return {
    transitions,
    runs: runMap,
    agentRows,
    crashes,
    owned: owners,
    drainingNow,
    async transition(r) {
      transitions.push(r);
      agentRows.set(r.agentId, { id: r.agentId, tenantId: r.tenantId, state: r.toState, hostId: r.hostId });
    },
    async runStarted(r) {
      runMap.set(r.id, { ...r });
    },
    async runTimings(runId, timings) {
      const run = runMap.get(runId);
      if (run) run.timings = timings;
    },
    async owners(agentIds) {
      // Tests set `owners` to say who owns an agent now; otherwise the rows transitions left, generation 0.
      const out = new Map<string, AgentOwner>();
      for (const id of agentIds) {
        const o = owners.get(id) ?? (agentRows.has(id) ? { hostId: agentRows.get(id)!.hostId, generation: 0, deleted: false } : undefined);
        if (o) out.set(id, o);
      }
      return out;
    },
    async markAsleep(agentId, hostId, _generation, state) {
      const row = agentRows.get(agentId);
      if (row?.hostId === hostId) row.state = state;
    },
    async claimWake(agentId, hostId, generation) {
      const o = owners.get(agentId);
      return o && !o.deleted && o.hostId !== null && (o.hostId !== hostId || o.generation > generation) ? o : undefined;
    },
    async draining() {
      return drainingNow.value;
    },
    async runEnded(runId, sleptAt, reason) {
      const run = runMap.get(runId);
      if (run) Object.assign(run, { sleptAt, sleepReason: reason });
    },
    async leftovers(hostId, before) {
      const all = [...runMap.values()];
      const openRuns = all
        .filter((r) => r.hostId === hostId && !r.sleptAt && r.wokeAt < before)
        .map((r) => ({ ...runRow(r), agent: agentRows.get(r.agentId) ?? null }));
      const onHost = [...agentRows.values()].filter((a) => a.hostId === hostId);
      return { openRuns, awakeAgents: onHost.filter((a) => awakeStates.includes(a.state)) };
    },
    async recordCrash(c) {
      crashes.push(c);
      for (const r of c.runs) {
        const run = runMap.get(r.id);
        if (run && !run.sleptAt) Object.assign(run, { sleptAt: r.sleptAt, sleepReason: "crash" });
      }
      const row = agentRows.get(c.agentId);
      if (c.setAgentState && row?.hostId === c.hostId && awakeStates.includes(row.state)) row.state = c.toState;
    },
  };
}

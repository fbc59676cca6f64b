// What a host does when it starts: closes what an earlier process of it left open when it crashed (runs, agents' rows
// in an awake state), says so in the event log, and works out which agents the next restore rolls back.
//
// After a crash (`kill -9`, power loss) no VM of this host survives the restart: the start reaps their leftover
// processes and each VM is `stopped` (its snapshot, if any, kept), which is the state the host gives it when it first
// hears of it again. So, per agent:
// - every run of this host with no end, woken before this process started, ends at the last instant the meter knew
//   the VM awake (its last spooled segment's end: the last heartbeat before the crash), or at its wake when the
//   meter recorded none of it (a crash within its first heartbeat), with reason `crash`;
// - the event log gets one `crash` transition from the state the agent's row said to `stopped`, and the row is set
//   to `stopped` when it is still this host's and says a state no restart keeps (booting, running, snapshotting,
//   restoring); an agent that moved to another host keeps its row;
// - when the agent's latest run ended with `crash` and its snapshot was taken before that run's last awake instant,
//   the next restore brings back an older state: the awake time in between is lost, and the first wake after the
//   crash says so (`x-wake-rollback`, the run's `rollbackMs`, the running transition's detail). Worked out from the
//   runs table, so a second restart before that wake still knows it.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Clock } from "../lib/clock.ts";
import type { Logger } from "../lib/log.ts";
import { MANIFEST_FILE } from "./drivers/common/state-dir.ts";
import { awakeStates, type AgentStateRow, type HostRecoveryStore, type RunRow } from "./store.ts";

/** A restore the next wake of an agent makes from a snapshot older than the agent's last awake state. */
export interface Rollback {
  /** Awake time lost, ms: the crashed run's last awake instant minus the later of its wake and the snapshot's time. */
  lostMs: number;
  /** The run the crash ended. */
  crashedRunId: string;
  /** Wall clock, ms since the epoch. */
  lastAwakeAt: number;
  snapshotAt: number;
}

export interface RecoveryDeps {
  hostId: string;
  store: HostRecoveryStore;
  /** Root of this host's VM state directories (`<vmsDir>/<agentId>`). */
  vmsDir: string;
  /** The host's VM id of an agent. */
  vmIdFor(agentId: string): string;
  /** The meter's last instant of `runId` on `vmId` (ms since the epoch), if it recorded any. */
  lastAwakeAt(vmId: string, runId: string): number | undefined;
  /** Whether this host process has the agent already (woken since it started): then it is the host's own business. */
  known(agentId: string): boolean;
  /** When this process started: runs woken since then are its own. */
  startedAt: Date;
  clock: Clock;
  log: Logger;
  /** When the committed snapshot in `stateDir` was taken (ms since the epoch); default: the manifest's `createdAt`. */
  snapshotAt?(stateDir: string): number | undefined;
}

export interface Recovered {
  runsClosed: number;
  /** Agents a crash transition was written for. */
  agents: number;
  rollbacks: Map<string, Rollback>;
}

/** The state a VM has after its host restarted: no process, its snapshot (if any) kept. */
const afterRestart = "stopped";

export async function recoverCrashes(deps: RecoveryDeps): Promise<Recovered> {
  const { hostId, store, clock, log } = deps;
  const left = await store.leftovers(hostId, deps.startedAt);
  const openByAgent = new Map<string, (RunRow & { agent: AgentStateRow | null })[]>();
  for (const run of left.openRuns) {
    if (deps.known(run.agentId)) continue;
    openByAgent.set(run.agentId, [...(openByAgent.get(run.agentId) ?? []), run]);
  }
  const rows = new Map<string, AgentStateRow | null>();
  for (const a of left.awakeAgents) if (!deps.known(a.id)) rows.set(a.id, a);
  for (const [agentId, open] of openByAgent) rows.set(agentId, open[0]!.agent);

  const closed = new Map<string, Date>();
  for (const [agentId, row] of rows) {
    const open = (openByAgent.get(agentId) ?? []).sort((a, b) => a.wokeAt.getTime() - b.wokeAt.getTime());
    const ends = open.map((run) => ({ id: run.id, sleptAt: new Date(Math.max(run.wokeAt.getTime(), deps.lastAwakeAt(run.vmId, run.id) ?? -Infinity)) }));
    const last = open.at(-1);
    const own = row !== null && row.hostId === hostId;
    const fromState = own ? row.state : "running";
    const toState = own && !awakeStates.includes(row.state) ? row.state : afterRestart;
    const lastEnd = ends.at(-1);
    await store.recordCrash({
      at: new Date(clock.now()),
      hostId,
      agentId,
      tenantId: row?.tenantId ?? last!.tenantId,
      vmId: last?.vmId ?? deps.vmIdFor(agentId),
      runs: ends,
      fromState,
      toState,
      runId: last?.id ?? null,
      detail: { found: "at host start", ...(lastEnd ? { lastAwakeAt: lastEnd.sleptAt.toISOString(), runsClosed: ends.map((e) => e.id) } : {}) },
      setAgentState: own,
    });
    for (const e of ends) closed.set(e.id, e.sleptAt);
    log.warn("closed what a crash left open", { agentId, fromState, toState, runs: ends.map((e) => e.id) });
  }

  const rollbacks = new Map<string, Rollback>();
  const snapshotAt = deps.snapshotAt ?? manifestTime;
  for (const run of left.lastRuns) {
    if (deps.known(run.agentId)) continue;
    const sleptAt = closed.get(run.id) ?? run.sleptAt;
    const reason = closed.has(run.id) ? "crash" : run.sleepReason;
    // `host_lost`: a gateway ended the run when this host's lease ran out (gateway/placement.ts); a crash all the same.
    if ((reason !== "crash" && reason !== "host_lost") || !sleptAt) continue;
    const snapAt = snapshotAt(join(deps.vmsDir, run.agentId));
    if (snapAt === undefined) continue; // no snapshot: the next wake boots, and says so
    const lastAwakeAt = sleptAt.getTime();
    const lostMs = Math.round(lastAwakeAt - Math.max(run.wokeAt.getTime(), snapAt));
    if (lostMs > 0) rollbacks.set(run.agentId, { lostMs, crashedRunId: run.id, lastAwakeAt, snapshotAt: snapAt });
  }
  return { runsClosed: closed.size, agents: rows.size, rollbacks };
}

/**
 * Recovery at host start: the first attempt is awaited (the caller starts the host after it); when the database
 * cannot be read then, it is retried in the background (1 s doubling to 30 s) until it succeeds or `stop()`.
 */
export function startCrashRecovery(deps: RecoveryDeps, onRecovered: (r: Recovered) => void): { firstAttempt: Promise<void>; stop(): void } {
  let timer: { cancel(): void } | undefined;
  let stopped = false;
  const attempt = async (delayMs: number): Promise<void> => {
    try {
      const r = await recoverCrashes(deps);
      if (r.agents > 0 || r.rollbacks.size > 0)
        deps.log.info("crash recovery done", { runsClosed: r.runsClosed, agents: r.agents, rollbacks: r.rollbacks.size });
      onRecovered(r);
    } catch (err) {
      deps.log.error("crash recovery failed; retrying", { err: err instanceof Error ? err.message : String(err), retryInMs: delayMs });
      if (!stopped) timer = deps.clock.setTimeout(() => void attempt(Math.min(delayMs * 2, 30_000)), delayMs);
    }
  };
  return {
    firstAttempt: attempt(1000),
    stop() {
      stopped = true;
      timer?.cancel();
    },
  };
}

/** `createdAt` of the committed snapshot manifest every snapshotting driver writes in the state directory. */
function manifestTime(stateDir: string): number | undefined {
  try {
    const m = JSON.parse(readFileSync(join(stateDir, MANIFEST_FILE), "utf8")) as { createdAt?: unknown };
    const at = typeof m.createdAt === "string" ? Date.parse(m.createdAt) : NaN;
    return Number.isFinite(at) ? at : undefined;
  } catch {
    return undefined;
  }
}

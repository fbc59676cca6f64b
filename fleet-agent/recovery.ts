// What a host does when it starts: closes what an earlier process of it left open when it crashed (runs, agents' rows
// in an awake state), and says so in the event log.
//
// After a crash (`kill -9`, power loss) no VM of this host survives the restart: the start reaps their leftover
// processes and each VM is `stopped` (its snapshot, if any, kept), which is the state the host gives it when it first
// hears of it again. So, per agent:
// - every run of this host with no end, woken before this process started, ends at the last instant the meter knew
//   the VM awake (its last spooled segment's end: the last heartbeat before the crash), or at its wake when the
//   meter recorded none of it (a crash within its first heartbeat), with reason `crash`;
// - the event log gets one `crash` transition from the state the agent's row said to `stopped`, and the row is set
//   to `stopped` when it is still this host's and says a state no restart keeps (booting, running, snapshotting,
//   restoring); an agent that moved to another host keeps its row.
//
// Whether the next restore rolls an agent back (a snapshot older than the run the crash cut off) is the wake's to
// tell (host/rollbacks.ts): the run record in its state directory and the meter's spool outlive the crash.
import type { Clock } from "../lib/clock.ts";
import type { Logger } from "../lib/log.ts";
import { awakeStates, type AgentStateRow, type HostRecoveryStore, type RunRow } from "./store.ts";

export interface RecoveryDeps {
  hostId: string;
  store: HostRecoveryStore;
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
}

export interface Recovered {
  runsClosed: number;
  /** Agents a crash transition was written for. */
  agents: number;
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

  return { runsClosed: closed.size, agents: rows.size };
}

/**
 * Recovery at host start: the first attempt is awaited (the caller starts the host after it); when the database
 * cannot be read then, it is retried in the background (1 s doubling to 30 s) until it succeeds or `stop()`.
 */
export function startCrashRecovery(deps: RecoveryDeps, onRecovered?: (r: Recovered) => void): { firstAttempt: Promise<void>; stop(): void } {
  let timer: { cancel(): void } | undefined;
  let stopped = false;
  const attempt = async (delayMs: number): Promise<void> => {
    try {
      const r = await recoverCrashes(deps);
      if (r.agents > 0) deps.log.info("crash recovery done", { runsClosed: r.runsClosed, agents: r.agents });
      onRecovered?.(r);
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

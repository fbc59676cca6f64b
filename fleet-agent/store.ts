// Where a host records what happened to its VMs: the event log, awake runs, agents' last known state.
import { eq } from "drizzle-orm";
import type { Db } from "../schema/db.ts";
import { agents, runs, vmEvents } from "../schema/core.ts";
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

export interface HostStore {
  transition(r: TransitionRecord): Promise<void>;
  runStarted(r: RunStart): Promise<void>;
  runTimings(runId: string, timings: WakeTimings): Promise<void>;
  runEnded(runId: string, sleptAt: Date, reason: string): Promise<void>;
}

/** Wakes and hibernations are audited; the intermediate states are in the VM event log only. */
const auditedStates: Record<string, string> = { running: "vm.wake", hibernated: "vm.hibernate", failed: "vm.fail", destroyed: "vm.destroy" };

export function createDbHostStore(db: Db): HostStore {
  const audit = createDbAuditLog(db);
  return {
    async transition(r) {
      await db.insert(vmEvents).values(r);
      const patch: Partial<typeof agents.$inferInsert> = { state: r.toState, hostId: r.hostId };
      if (r.toState === "running") patch.lastWakeAt = r.at;
      await db.update(agents).set(patch).where(eq(agents.id, r.agentId));
      const action = auditedStates[r.toState];
      if (action) {
        await audit.record({
          at: r.at,
          tenantId: r.tenantId,
          actor: r.hostId,
          action,
          target: r.agentId,
          detail: { from: r.fromState, reason: r.reason, runId: r.runId, ...(r.timings ? { timings: r.timings } : {}), ...(r.detail ?? {}) },
        });
      }
    },
    async runStarted(r) {
      await db.insert(runs).values(r);
    },
    async runTimings(runId, timings) {
      await db.update(runs).set({ timings }).where(eq(runs.id, runId));
    },
    async runEnded(runId, sleptAt, reason) {
      await db.update(runs).set({ sleptAt, sleepReason: reason }).where(eq(runs.id, runId));
    },
  };
}

/** Keeps everything in arrays: for unit tests of the host's logic. */
export function createMemoryHostStore(): HostStore & { transitions: TransitionRecord[]; runs: Map<string, RunStart & { sleptAt?: Date; sleepReason?: string }> } {
  const transitions: TransitionRecord[] = [];
  const runMap = new Map<string, RunStart & { sleptAt?: Date; sleepReason?: string }>();
  return {
    transitions,
    runs: runMap,
    async transition(r) {
      transitions.push(r);
    },
    async runStarted(r) {
      runMap.set(r.id, { ...r });
    },
    async runTimings(runId, timings) {
      const run = runMap.get(runId);
      if (run) run.timings = timings;
    },
    async runEnded(runId, sleptAt, reason) {
      const run = runMap.get(runId);
      if (run) Object.assign(run, { sleptAt, sleepReason: reason });
    },
  };
}

// A VM's lifecycle (DESIGN.md): the transition table (from-state × event → to-state) and the one place a VM's state moves and is recorded.
import type { Clock } from "../../lib/clock.ts";
import type { TransitionReason, TransitionTimings, VmState } from "../../contracts/agent.ts";
import type { EventLog } from "../event-log.ts";
import type { VmEntry } from "../vm-entry.ts";

/**
 * What happens to a VM. Each event leads to one state; the table says from which states it may happen.
 * - `boot`: a cold boot starts; `restore`: a restore from the VM's snapshot starts; `woke`: either is done, the VM serves;
 * - `snapshot`: a hibernation starts; `snapshotted`: it is written (the VM is files); `resume`: it was cancelled or
 *   failed, the VM runs on;
 * - `placeSnapshot`: the driver made the state directory a snapshot to wake from (a fork, a checkpoint restore, a
 *   commit of the shared store);
 * - `stop`: the VM's process ends without a snapshot (a checkpoint restore, a failed snapshot at shutdown);
 * - `fail`: a wake failed or the VM crashed; `destroy`: the agent is deleted (or its copy here evicted);
 * - `doze`: the VM's vCPUs stop while every open call waits on an outbound call (host/doze.ts); `resume` from
 *   `dozing`: they run again.
 */
export type VmEvent = "boot" | "restore" | "woke" | "snapshot" | "snapshotted" | "resume" | "placeSnapshot" | "stop" | "fail" | "destroy" | "doze";

// `placeSnapshot` from creating (a fork), stopped, failed and hibernated itself (a restore to a checkpoint): the driver
// made the state directory a snapshot to wake from. A dozing VM is never snapshotted, checkpointed or stopped as it is:
// it resumes first (host/doze.ts), so its only ways out besides `resume` are a crash and a delete.
const table: Record<VmState, Readonly<Partial<Record<VmEvent, VmState>>>> = {
  creating: { boot: "booting", placeSnapshot: "hibernated", destroy: "destroyed" },
  booting: { woke: "running", fail: "failed", destroy: "destroyed" },
  running: { snapshot: "snapshotting", stop: "stopped", fail: "failed", destroy: "destroyed", doze: "dozing" },
  dozing: { resume: "running", fail: "failed", destroy: "destroyed" },
  snapshotting: { snapshotted: "hibernated", resume: "running", fail: "failed", destroy: "destroyed" },
  hibernated: { restore: "restoring", destroy: "destroyed", stop: "stopped", placeSnapshot: "hibernated" },
  restoring: { woke: "running", boot: "booting", fail: "failed", destroy: "destroyed" },
  stopped: { boot: "booting", restore: "restoring", placeSnapshot: "hibernated", destroy: "destroyed" },
  failed: { boot: "booting", restore: "restoring", placeSnapshot: "hibernated", destroy: "destroyed" },
  destroyed: {},
};

/** The state `event` leads to from `from`; undefined when the table does not allow it there. */
export function nextState(from: VmState, event: VmEvent): VmState | undefined {
  return table[from][event];
}

/** Whether `event` may happen in state `from`. */
export function canHappen(from: VmState, event: VmEvent): boolean {
  return table[from][event] !== undefined;
}

/** Whether some event leads from `from` to `to`. */
export function canTransition(from: VmState, to: VmState): boolean {
  return Object.values(table[from]).includes(to);
}

export class IllegalTransition extends Error {
  override name = "IllegalTransition";
  constructor(from: VmState, event: VmEvent) {
    super(`illegal VM transition: ${event} in state ${from}`);
  }
}

export interface LifecycleDeps {
  hostId: string;
  clock: Clock;
  /** Where each transition is recorded (the event log: the agent's row, the transitions table). */
  events: Pick<EventLog, "transition">;
}

/** Moves VMs through the table: every state change of a VM on this host goes through `move` (eviction aside: `forget`). */
export class Lifecycle {
  private readonly deps: LifecycleDeps;

  constructor(deps: LifecycleDeps) {
    this.deps = deps;
  }

  /** Applies `event` to the VM and records the transition with its reason; throws IllegalTransition when the table refuses it. */
  move(entry: VmEntry, event: VmEvent, reason: TransitionReason, timings?: TransitionTimings, detail?: Record<string, unknown>): void {
    const from = entry.state;
    const to = nextState(from, event);
    if (to === undefined) throw new IllegalTransition(from, event);
    entry.state = to;
    const record = {
      at: new Date(this.deps.clock.now()),
      hostId: this.deps.hostId,
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
    this.deps.events.transition(record);
  }

  /**
   * An evicted VM is `destroyed` here without a record: its row is another host's now (the event log is fenced by
   * generation anyway). One already destroyed (deleted meanwhile) stays so.
   */
  forget(entry: VmEntry): void {
    if (entry.state !== "destroyed") entry.state = nextState(entry.state, "destroy")!;
  }
}

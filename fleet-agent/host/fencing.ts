// Ownership and fencing: a VM runs here only under the newest lease generation, checked on each call, before each wake, and after each heartbeat.
import { join } from "node:path";
import type { Clock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import { isId } from "../../lib/ids.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import { withDeadline } from "../deadline.ts";
import type { EventLog } from "../event-log.ts";
import type { HostFs } from "../host-fs.ts";
import { awakeStates, type AgentOwner, type HostStore } from "../store.ts";
import type { VmEntry } from "../vm-entry.ts";
import type { Eviction } from "./eviction.ts";
import type { DiskGenerations } from "./generations.ts";
import type { VmTable } from "./vms.ts";

/** How long a wake waits for the database to say who owns the agent before it goes ahead, ms. */
const ownerCheckMs = 500;
/** Sleeping copies each `fence` asks about (its awake ones are all asked): 10,000 asleep are gone over in 20 heartbeats. */
export const SLEEPING_PER_FENCE = 500;

export interface FencingDeps {
  hostId: string;
  /** Root of this host's VM state directories (`<dir>/<agentId>`). */
  vmsDir: string;
  clock: Clock;
  fs: HostFs;
  store: Pick<HostStore, "owners" | "claimWake" | "markAsleep">;
  /** The host's event log: its queued writes of the agent's earlier runs must not undo a claim (`overtake`). */
  events: Pick<EventLog, "overtake">;
  vms: Pick<VmTable, "get" | "ids" | "entryFor">;
  generations: Pick<DiskGenerations, "read" | "write">;
  eviction: Pick<Eviction, "evict" | "discardStateDir">;
  /** Whether this host drains: gateways may move its sleeping agents, so a wake goes ahead only on the claim's answer. */
  draining(): boolean;
  /** Sleeping copies asked about per `fence` (SLEEPING_PER_FENCE; tests make it small). */
  sleepingPerFence?: number;
}

export class Fencing {
  private readonly deps: FencingDeps;
  /** Owner checks under way, by agent (`ownerCheck`). */
  private readonly ownerChecks = new Map<string, Promise<void>>();
  /** Hand-offs whose row write is under way, by agent (`handOff`): a claim waits for it. */
  private readonly handOffs = new Map<string, Promise<void>>();
  /** Whether `fence` has looked at the state directories on disk yet (once: later passes look at the VMs in memory). */
  private fencedDisk = false;
  /** Sleeping copies still to be asked about in this round of `fence`es (a round goes over all of them). */
  private sleepingTurn: string[] = [];

  constructor(deps: FencingDeps) {
    this.deps = deps;
  }

  /**
   * The agent's entry under the lease generation the call carries (fencing). An older generation than this host's is a
   * caller with a stale placement: refused (503, the gateway asks the database again). A newer one means the agent was
   * moved to another host and back since this host last ran it: its copy here is stale, so it is stopped and its files
   * removed, and the agent starts here from what the store has (or boots). The generation is kept beside the VMs'
   * directories (`<vmsDir>/../leases/<agentId>`), so a restart knows it.
   */
  async leased(spec: AgentSpec): Promise<VmEntry> {
    return this.leasedNow(spec) ?? this.leasedAfterFencing(spec);
  }

  /** `leased` when there is nothing to fence: the agent's VM is known here under the call's generation (else undefined). */
  leasedNow(spec: AgentSpec): VmEntry | undefined {
    const known = this.deps.vms.get(spec.id);
    if (!known || (spec.generation ?? 0) !== known.generation) return undefined;
    return this.deps.vms.entryFor(spec);
  }

  private async leasedAfterFencing(spec: AgentSpec): Promise<VmEntry> {
    const { vms, generations, eviction } = this.deps;
    const generation = spec.generation ?? 0;
    const known = vms.get(spec.id);
    const held = known?.generation ?? generations.read(spec.id);
    if (generation < held) {
      throw new AppError(
        "host_unavailable",
        `agent ${spec.id} runs on this host under lease generation ${held}, the call carries ${generation}: the caller's placement is stale`,
        { retryAfterS: 1 },
      );
    }
    if (generation > held) {
      if (known) await eviction.evict(known, `a call of lease generation ${generation} (this host had ${held})`);
      else if (this.deps.fs.hasStateDir(join(this.deps.vmsDir, spec.id)))
        await eviction.discardStateDir(spec.id, `its files here are of lease generation ${held}, the call carries ${generation}`);
      generations.write(spec.id, generation);
    }
    return vms.entryFor(spec);
  }

  /**
   * Before a wake: whether the database still gives this host the agent under the generation it holds. A gateway whose
   * placement was kept from before a move (its cache) would otherwise wake a second copy here; it gets `503` and asks
   * again. A copy already awake is fenced at the next heartbeat (`fence`). While the database cannot be read the
   * wake goes ahead (after at most `ownerCheckMs`): the lease it holds has not been taken from it by anyone who could
   * not write either.
   */
  /** One owner check at a time per agent: callers that arrive together share it (a burst asks the database once). */
  ownerCheck(entry: VmEntry): Promise<void> {
    const id = entry.spec.id;
    let check = this.ownerChecks.get(id);
    if (!check) {
      check = this.assertOwner(entry).finally(() => this.ownerChecks.delete(id));
      this.ownerChecks.set(id, check);
    }
    return check;
  }

  /**
   * A draining host does not wake a sleeping agent for a call its gateway can repeat elsewhere (wake.ts): its row is
   * made to say it sleeps here now, so the gateway's next placement moves it. Not while a wake's claim is under way
   * for it here (another call that cannot be repeated): that wake goes ahead, and the row says so. A claim that starts
   * while the hand-off's write is under way waits for it (`assertOwner`): the row must never say asleep after a claim
   * said waking, or a move would take the agent while it wakes here and its transitions land after the move.
   */
  async handOff(entry: VmEntry): Promise<void> {
    const id = entry.spec.id;
    if (this.ownerChecks.has(id) || (entry.state !== "hibernated" && entry.state !== "stopped")) return;
    const state = entry.state;
    const under = this.handOffs.get(id);
    const mark = (async () => {
      await under;
      await this.deps.events.overtake(id);
      await this.deps.store.markAsleep(id, this.deps.hostId, entry.generation, state);
    })().catch(() => undefined);
    this.handOffs.set(id, mark);
    void mark.then(() => {
      if (this.handOffs.get(id) === mark) this.handOffs.delete(id);
    });
    await withDeadline(this.deps.clock, ownerCheckMs, mark, () => undefined);
  }

  private async assertOwner(entry: VmEntry): Promise<void> {
    const id = entry.spec.id;
    let owner: AgentOwner | undefined;
    try {
      // The claim marks the row waking in the same statement that checks it is still ours, so a gateway's move of the
      // sleeping agent that races it fails (store.ts `claimWake`). After a hand-off's write under way (the row would
      // say asleep after the claim) and the agent's queued transitions. Bounded: a database that does not answer (an
      // outage, a partition) must not hold the wake up, except on a draining host (below).
      const claim = async () => {
        await this.handOffs.get(id);
        await this.deps.events.overtake(id);
        return { owner: await this.deps.store.claimWake(id, this.deps.hostId, entry.generation) };
      };
      const answer = await withDeadline(this.deps.clock, ownerCheckMs, claim(), () => undefined);
      if (!answer) throw new Error("no answer in time");
      owner = answer.owner;
    } catch {
      // A draining host's sleeping agents are the gateways' to move as soon as their rows say they sleep: a wake here
      // without the claim could run beside a moved copy (fenced at the next heartbeat, with what this call did), and
      // its transitions would land after the move in the agent's event log. The call reached nothing: its gateway
      // places the agent again and repeats a call it can (gateway/remote-fleet.ts `handedOff`), else the caller does.
      if (this.deps.draining())
        throw new AppError("host_draining", `host is draining and could not claim agent ${id} in the database (no answer in time, or an error); try again`, {
          retryAfterS: 1,
        });
      return;
    }
    if (!owner) return;
    throw new AppError(
      "host_unavailable",
      `agent ${id} is on host ${owner.hostId} now (lease generation ${owner.generation}); this host's copy (generation ${entry.generation}) is not woken`,
      { retryAfterS: 1 },
    );
  }

  /**
   * Stops this host's copy of every agent the database says it no longer owns (another host, or a newer lease
   * generation): a host that was cut off or dead while its agents moved must not run, meter or snapshot them again.
   * Called after each heartbeat; answers how many copies it stopped. Every awake copy is asked about each time;
   * sleeping ones in turns of `sleepingPerFence` (the first round includes the state directories on disk: what a dead
   * process left), so the query stays small at 10,000 agents. A sleeping copy waits its turn safely: it runs nothing,
   * and a wake claims the agent in the database first (`ownerCheck`); its turn only frees its files.
   */
  async fence(): Promise<number> {
    const { vmsDir, hostId, vms, eviction } = this.deps;
    const ids = new Set<string>();
    for (const id of vms.ids()) if (!asleep(vms.get(id))) ids.add(id);
    if (this.sleepingTurn.length === 0) {
      const round = new Set<string>();
      for (const id of vms.ids()) if (asleep(vms.get(id))) round.add(id);
      if (!this.fencedDisk) for (const id of this.deps.fs.vmDirs(vmsDir)) if (isId("agent", id) && !ids.has(id)) round.add(id);
      this.fencedDisk = true;
      this.sleepingTurn = [...round];
    }
    const turn = this.sleepingTurn.slice(0, this.deps.sleepingPerFence ?? SLEEPING_PER_FENCE);
    for (const id of turn) ids.add(id);
    if (ids.size === 0) return 0;
    const owners = await this.deps.store.owners([...ids]); // a failure leaves this turn for the next fence
    this.sleepingTurn.splice(0, turn.length);
    let stopped = 0;
    for (const id of ids) {
      const owner = owners.get(id);
      if (!owner || owner.deleted || owner.hostId === null) continue;
      const entry = vms.get(id);
      const held = entry?.generation ?? this.deps.generations.read(id);
      if (owner.hostId === hostId && owner.generation <= held) continue;
      const why =
        owner.hostId === hostId
          ? `lease generation ${owner.generation} is newer than this host's ${held}`
          : `it is on host ${owner.hostId} now (lease generation ${owner.generation})`;
      if (entry) await eviction.evict(entry, why);
      else await eviction.discardStateDir(id, why);
      stopped++;
    }
    return stopped;
  }
}

/** A copy that runs nothing here: no entry (only its files), or one in none of the awake states. */
function asleep(entry: VmEntry | undefined): boolean {
  return !entry || !awakeStates.includes(entry.state);
}

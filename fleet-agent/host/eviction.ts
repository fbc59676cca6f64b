// How a VM leaves this host without a snapshot: deleted with its agent (`remove`), or evicted because another host owns it now (`evict`).
import { rmSync } from "node:fs";
import type { Logger } from "../../lib/log.ts";
import type { VmDriver } from "../drivers/driver.ts";
import type { VmEntry } from "../vm-entry.ts";
import type { DiskGenerations } from "./generations.ts";
import type { Lifecycle } from "./lifecycle.ts";
import type { Metering } from "./metering.ts";
import type { VmTable } from "./vms.ts";

export interface EvictionDeps {
  driver: Pick<VmDriver, "stop" | "reap" | "destroy">;
  log: Logger;
  vms: Pick<VmTable, "get" | "delete" | "bareSpec">;
  lifecycle: Pick<Lifecycle, "move" | "forget">;
  metering: Pick<Metering, "endActivity" | "endRun">;
  generations: Pick<DiskGenerations, "forget">;
  /** Settles once the checkpoint work under way on the agent has (undefined: none). */
  checkpointBusy(agentId: string): Promise<void> | undefined;
  /** Deletes the agent's checkpoints on this host. */
  removeCheckpointsOf(agentId: string): Promise<void>;
  /** The VM stops without a resume: its doze bookkeeping ends (host/doze.ts). A dozing VM is stopped as it is. */
  left(entry: VmEntry): void;
}

export class Eviction {
  private readonly deps: EvictionDeps;

  constructor(deps: EvictionDeps) {
    this.deps = deps;
  }

  /** Removals under way: a second delete of the agent while one runs joins it (the VM is stopped and destroyed once). */
  private readonly removals = new Map<string, Promise<void>>();

  /** Whether the agent's removal is under way (its VM may be stopping now). */
  removing(agentId: string): boolean {
    return this.removals.has(agentId);
  }

  /** Stops the agent's VM and removes everything it left on disk; a removal already under way is joined, not repeated. */
  remove(agentId: string): Promise<void> {
    const under = this.removals.get(agentId);
    if (under) return under;
    const removal = this.removeOnce(agentId).finally(() => this.removals.delete(agentId));
    this.removals.set(agentId, removal);
    return removal;
  }

  private async removeOnce(agentId: string): Promise<void> {
    const { driver, log, vms } = this.deps;
    const entry = vms.get(agentId);
    if (!entry) return this.deps.removeCheckpointsOf(agentId);
    for (const t of [...entry.tickets]) t.hibernating();
    await this.deps.checkpointBusy(agentId);
    await entry.wake?.catch(() => undefined);
    await entry.hibernation?.promise;
    if (entry.running) {
      if (entry.state === "running" || entry.state === "dozing") {
        this.deps.metering.endActivity(entry, "delete");
        // The run ends with the agent: left open, the next start of this host would record it as a crash.
        this.deps.metering.endRun(entry, "delete");
      }
      this.deps.left(entry);
      await driver.stop(entry.running).catch((err) => log.warn("stop failed", { agentId, err }));
    }
    await driver.destroy(entry.vmSpec);
    this.deps.lifecycle.move(entry, "destroy", "delete");
    entry.running = undefined;
    vms.delete(agentId);
    await this.deps.removeCheckpointsOf(agentId);
  }

  /**
   * Stops an agent's VM here without a snapshot (its state here is not the agent's any more) and forgets it: open
   * requests end (WebSockets with 1001), the meter closes its segment (reason `moved`), the run ends, its files go. No
   * transition reaches the agent's row: it is another host's (the event log is fenced by generation anyway).
   */
  async evict(entry: VmEntry, why: string): Promise<void> {
    const { driver, log, metering } = this.deps;
    const agentId = entry.spec.id;
    for (const t of [...entry.tickets]) t.hibernating();
    await this.deps.checkpointBusy(agentId);
    await entry.wake?.catch(() => undefined);
    await entry.hibernation?.promise.catch(() => undefined);
    if (entry.running) {
      if (entry.state === "running" || entry.state === "dozing") {
        metering.endActivity(entry, "moved");
        metering.endRun(entry, "moved");
      }
      this.deps.left(entry);
      await driver.stop(entry.running).catch((err) => log.warn("stop failed", { agentId, err }));
    }
    entry.running = undefined;
    this.deps.lifecycle.forget(entry);
    this.deps.vms.delete(agentId);
    await this.discardStateDir(agentId, why);
  }

  /** Removes an agent's state here (its leftover processes first): the agent's current state is on another host or in the store. */
  async discardStateDir(agentId: string, why: string): Promise<void> {
    const { driver, log } = this.deps;
    const spec = this.deps.vms.bareSpec(agentId);
    await driver.reap(spec).catch((err) => log.warn("reaping a moved agent's VM failed", { agentId, err }));
    await driver.destroy(spec).catch((err) => log.warn("removing a moved agent's files failed", { agentId, err }));
    rmSync(spec.stateDir, { recursive: true, force: true });
    this.deps.generations.forget(agentId);
    log.warn("stopped this host's copy of an agent it no longer owns", { agentId, why });
  }
}

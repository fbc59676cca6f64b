// Checkpoints and forks on this host: taking one (asked through the API or by the guest), rolling an agent back to one, forking a new agent from one, deleting them; apart from wakes and snapshots.
import { mkdirSync, rmSync } from "node:fs";
import type { Clock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import type { Logger } from "../../lib/log.ts";
import type { AgentSpec, VmState } from "../../contracts/agent.ts";
import { checkpointNamePattern } from "../../contracts/fleet.ts";
import type { RunningVm, VmDriver } from "../drivers/driver.ts";
import { checkpointDir, KeyedQueue, type CheckpointRecord, type CheckpointStore } from "../checkpoints.ts";
import type { VmEntry } from "../vm-entry.ts";
import { canHappen, type Lifecycle } from "./lifecycle.ts";
import type { Metering } from "./metering.ts";
import type { VmTable } from "./vms.ts";

export interface CheckpointerDeps {
  hostId: string;
  clock: Clock;
  log: Logger;
  driver: Pick<VmDriver, "name" | "checkpoint" | "restoreCheckpoint" | "guestCheckpointRequests" | "stop">;
  /** Where checkpoints are recorded; none: this host takes none (501 checkpoints_unsupported). */
  checkpoints?: CheckpointStore;
  /** Where checkpoints' files go (`<dir>/<ckp_id>`). */
  checkpointsDir: string;
  vms: Pick<VmTable, "get" | "attachImage">;
  lifecycle: Pick<Lifecycle, "move">;
  metering: Pick<Metering, "endActivity" | "endRun">;
  /** The agent's entry under the lease generation the call carries (fencing.ts). */
  leased(spec: AgentSpec): Promise<VmEntry>;
  /** A dozing VM runs again first (host/doze.ts; no doze begins while checkpoint work is queued); undefined: it runs. */
  resumeDozing(entry: VmEntry): Promise<void> | undefined;
}

export class Checkpointer {
  private readonly deps: CheckpointerDeps;
  /**
   * Checkpoint work under way, by agent id (take, restore, fork) and by checkpoint id (restore, fork, delete): a wake or
   * a snapshot of that agent waits for it, and it waits for them (a driver's copy never races its own snapshot).
   */
  private readonly work = new KeyedQueue();

  constructor(deps: CheckpointerDeps) {
    this.deps = deps;
  }

  /** Settles once the checkpoint work queued so far on `key` (an agent or a checkpoint) has; undefined when there is none. */
  busy(key: string): Promise<void> | undefined {
    return this.work.busy(key);
  }

  /** Whether checkpoint work on `key` is under way or queued. */
  has(key: string): boolean {
    return this.work.has(key);
  }

  /**
   * Keeps a checkpoint of the agent (DESIGN: checkpoints): after any wake or snapshot under way, the driver copies the
   * running VM (paused meanwhile) or the hibernated one's snapshot into `<checkpointsDir>/<ckp_id>`, and the row is
   * recorded. 409 on a name the agent already uses or when it never ran; 501 when the driver or this host cannot.
   */
  async checkpoint(spec: AgentSpec, opts: { name?: string; origin: CheckpointRecord["origin"]; requestId?: string }): Promise<CheckpointRecord> {
    const { driver, checkpointsDir } = this.deps;
    if (!driver.checkpoint) throw unsupported(driver.name, "checkpoint");
    const store = this.store("checkpoint");
    const name = opts.name ?? null;
    if (name !== null && !checkpointNamePattern.test(name)) throw new AppError("bad_request", `name: "${name.slice(0, 100)}" is no checkpoint name`);
    if (name !== null && (await store.nameTaken(spec.id, name))) throw new AppError("conflict", `agent ${spec.id} already has a checkpoint named "${name}"`);
    const entry = await this.deps.leased(spec);
    return this.work.run(spec.id, async () => {
      await settle(entry, this.deps.resumeDozing);
      if (entry.state === "destroyed") throw new AppError("not_found", `agent ${spec.id} was deleted`);
      if (entry.state === "creating") throw new AppError("conflict", `agent ${spec.id} has never run: there is no state to checkpoint`);
      const vm = entry.state === "running" ? entry.running : undefined;
      const id = newId("checkpoint");
      const dir = checkpointDir(checkpointsDir, id);
      mkdirSync(checkpointsDir, { recursive: true });
      await this.deps.vms.attachImage(entry); // a built image's files: the disk the checkpoint copies is an overlay on them
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
        hostId: this.deps.hostId,
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
      this.deps.log.info("checkpoint taken", {
        agentId: spec.id,
        checkpointId: id,
        origin: opts.origin,
        bytes: info.bytes,
        pausedMs: info.pausedMs,
        ms: info.ms,
        copy: info.copy,
      });
      return record;
    });
  }

  /**
   * Rolls the agent back to one of its checkpoints: an awake agent is stopped first (its run and meter end as a stop's
   * do, reason `api`), then the driver replaces its snapshot and disk with the checkpoint's (the snapshot it had is
   * gone), and it is `hibernated`: the next call wakes it from the checkpoint, with a fresh identity. The checkpoint is
   * the agent's own, or the one it was forked from (`agents.forked_from`: a reset, `POST /v1/agents/{id}/reset`, or a
   * pool's release), never another.
   */
  async restoreCheckpoint(spec: AgentSpec, checkpointId: string, requestId?: string): Promise<VmState> {
    const record = await this.checkpointOf(checkpointId, "restore");
    const itsFork = record.agentId !== spec.id && record.tenantId === spec.tenantId && (await this.store("restore").forkedFrom(spec.id)) === checkpointId;
    if (record.agentId !== spec.id && !itsFork) throw new AppError("not_found", `checkpoint ${checkpointId} is not agent ${spec.id}'s`);
    const entry = await this.deps.leased(spec);
    return this.work.run(spec.id, () =>
      this.work.run(checkpointId, async () => {
        await settle(entry, this.deps.resumeDozing);
        if (entry.state === "destroyed") throw new AppError("not_found", `agent ${spec.id} was deleted`);
        if (entry.running) await this.stopForRestore(entry, checkpointId);
        await this.deps.vms.attachImage(entry);
        // Restored to a checkpoint (a reset, a roll-back): likely again, so the driver may keep a standby warm for it.
        await this.deps.driver.restoreCheckpoint!(entry.vmSpec, checkpointDir(this.deps.checkpointsDir, checkpointId), { again: true });
        entry.hibernateFailures = 0;
        entry.lastHibernateError = undefined;
        this.deps.lifecycle.move(
          entry,
          "placeSnapshot",
          "api",
          { snapshotBytes: record.bytes },
          { restoredFrom: checkpointId, ...(requestId ? { requestId } : {}) },
        );
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
    const entry = await this.deps.leased(spec);
    return this.work.run(spec.id, () =>
      this.work.run(checkpointId, async () => {
        if (entry.state !== "creating") throw new AppError("conflict", `agent ${spec.id} already has a state of its own: only a new agent is forked`);
        await this.deps.vms.attachImage(entry);
        await this.deps.driver.restoreCheckpoint!(entry.vmSpec, checkpointDir(this.deps.checkpointsDir, checkpointId));
        this.deps.lifecycle.move(
          entry,
          "placeSnapshot",
          "api",
          { snapshotBytes: record.bytes },
          { forkedFrom: checkpointId, fromAgent: record.agentId, ...(requestId ? { requestId } : {}) },
        );
        return entry.state;
      }),
    );
  }

  /** Removes a checkpoint's files and marks its row deleted (after any restore or fork reading it). Forks made of it keep their own files. */
  async deleteCheckpoint(agentId: string, checkpointId: string): Promise<void> {
    const store = this.store("delete");
    const dir = checkpointDir(this.deps.checkpointsDir, checkpointId);
    const record = await store.get(checkpointId);
    if (!record || record.agentId !== agentId) throw new AppError("not_found", `checkpoint ${checkpointId} not found`);
    await this.work.run(checkpointId, async () => {
      await store.markDeleted(checkpointId, new Date(this.deps.clock.now()));
      rmSync(dir, { recursive: true, force: true });
    });
  }

  /** Where the reaper polls an awake VM's guest leases: a checkpoint for each name its workload asked for since the last poll (origin `guest`). */
  async takeGuestCheckpoints(vm: RunningVm): Promise<void> {
    const { driver } = this.deps;
    if (!driver.guestCheckpointRequests || !driver.checkpoint || !this.deps.checkpoints) return;
    const names = await driver.guestCheckpointRequests(vm).catch((err) => {
      this.deps.log.warn("reading the guest's checkpoint requests failed", { agentId: vm.spec.agentId, err });
      return [] as string[];
    });
    const entry = this.deps.vms.get(vm.spec.agentId);
    if (!entry) return;
    for (const asked of names) {
      const name = asked.trim() === "" ? undefined : asked.trim();
      try {
        await this.checkpoint(entry.spec, { origin: "guest", ...(name !== undefined ? { name } : {}) });
      } catch (err) {
        // The workload is not told (it asked through a file): the host's log says why, and the next request is taken.
        this.deps.log.warn("a checkpoint the guest asked for was not taken", {
          agentId: entry.spec.id,
          name,
          err: err instanceof Error ? err.message : String(err),
        });
      }
    }
  }

  /**
   * Runs `work` apart from the agent's wakes, snapshots and checkpoints, and only while it is still hibernated: the
   * shipper's checkpoint step reads the snapshot's files, which a wake since the hibernation has moved on (the next
   * hibernation commits instead).
   */
  whileHibernated<T>(agentId: string, work: () => Promise<T>): Promise<T> {
    return this.work.run(agentId, async () => {
      const state = this.deps.vms.get(agentId)?.state;
      if (state !== "hibernated")
        throw new AppError("conflict", `agent ${agentId} is ${state ?? "gone"} again: its snapshot is not committed (its next hibernation is)`);
      return work();
    });
  }

  /** Deleting an agent deletes its checkpoints on this host (rows marked, files removed); forks of them are agents of their own and stay. */
  async removeCheckpointsOf(agentId: string): Promise<void> {
    const store = this.deps.checkpoints;
    if (!store) return;
    const ids = await store.deleteOfAgent(agentId, this.deps.hostId, new Date(this.deps.clock.now()));
    for (const id of ids) await this.work.run(id, async () => rmSync(checkpointDir(this.deps.checkpointsDir, id), { recursive: true, force: true }));
  }

  /** A restore stops the VM as a stop does: tickets told, meter and run ended (reason `api`), the event log says why. */
  private async stopForRestore(entry: VmEntry, checkpointId: string): Promise<void> {
    const { metering } = this.deps;
    const vm = entry.running!;
    for (const t of [...entry.tickets]) t.hibernating();
    const wasRunning = entry.state === "running";
    entry.running = undefined; // before the stop: its exit is ours, not a crash
    if (wasRunning) metering.endActivity(entry, "api");
    await this.deps.driver.stop(vm, { discard: true }).catch((err) => this.deps.log.warn("stop failed", { agentId: entry.spec.id, err }));
    if (canHappen(entry.state, "stop")) this.deps.lifecycle.move(entry, "stop", "api", undefined, { restoring: checkpointId });
    metering.endRun(entry, "api");
  }

  private async checkpointOf(checkpointId: string, op: "restore" | "fork"): Promise<CheckpointRecord> {
    const { driver, hostId } = this.deps;
    if (!driver.restoreCheckpoint) throw unsupported(driver.name, op);
    const store = this.store(op);
    checkpointDir(this.deps.checkpointsDir, checkpointId); // 400 for what is no checkpoint id
    const record = await store.get(checkpointId);
    if (!record || record.hostId !== hostId) throw new AppError("not_found", `checkpoint ${checkpointId} is not on host ${hostId}`);
    return record;
  }

  private store(op: string): CheckpointStore {
    if (!this.deps.checkpoints)
      throw new AppError("checkpoints_unsupported", `host ${this.deps.hostId} keeps no checkpoint records: ${op} is not possible here`);
    return this.deps.checkpoints;
  }
}

/**
 * Waits until no wake or snapshot of the agent is under way and it does not doze (a dozing VM runs again: the driver
 * copies a running VM, and pauses it itself); checkpoint work holds the agent's queue: none of them starts meanwhile.
 */
async function settle(entry: VmEntry, resumeDozing: (entry: VmEntry) => Promise<void> | undefined): Promise<void> {
  for (;;) {
    if (entry.wake || entry.hibernation) {
      await entry.wake?.catch(() => undefined);
      await entry.hibernation?.promise;
      continue;
    }
    const resumed = resumeDozing(entry);
    if (!resumed) return;
    await resumed;
  }
}

/** The driver lacks a checkpoint method: a capability this host has not, whatever the agent's state. */
function unsupported(driver: string, op: string): AppError {
  return new AppError("checkpoints_unsupported", `the ${driver} driver keeps no checkpoints (${op}): it has no memory state to copy`);
}

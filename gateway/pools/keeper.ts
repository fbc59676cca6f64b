// A warm pool's work: forking its agents from its checkpoint, handing one out, taking one back after a reset, and the top-up that keeps `size` ready.
import { AppError } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import type { Logger } from "../../lib/log.ts";
import type { Fleet } from "../../contracts/fleet.ts";
import { agentSpec, type AgentRepo, type AgentRow } from "../agents/repo.ts";
import type { CheckpointRepo } from "../checkpoints/repo.ts";
import { resetToFork } from "../checkpoints/reset.ts";
import type { PoolRow, PoolStore, Reservation } from "./store.ts";

export interface PoolKeeperDeps {
  store: PoolStore;
  agents: AgentRepo;
  /** Checkpoints' rows; none: every pool operation answers 501 checkpoints_unsupported. */
  checkpoints: CheckpointRepo | undefined;
  fleet: Fleet;
  log: Logger;
  /** First and longest wait before a failed top-up is tried again (doubling), ms. */
  backoff?: { firstMs: number; maxMs: number };
  /**
   * Where work that outlives the request is handed (a top-up, an acquired agent's wake): a Worker keeps its request
   * alive for it (`waitUntil`, its database client open until it settles); none: it just runs (Node).
   */
  background?: (work: Promise<unknown>) => void;
}

export interface PoolKeeper {
  readonly store: PoolStore;
  /** Tops up every live pool (a gateway's start: what an earlier process left half-made is made ready again). */
  start(): void;
  /** No more top-ups; waits for the ones under way. */
  stop(): Promise<void>;
  /** Tops the pool up in the background (now, or when its backoff after a failure ends). */
  kick(poolId: string): void;
  /** Hands out one of the pool's agents: a ready one, or one forked now while the pool holds fewer than `maxSize`; 409 pool_exhausted else. */
  acquire(pool: PoolRow, requestId?: string): Promise<{ row: AgentRow; forked: boolean }>;
  /** Takes a handed-out agent back: reset to the pool's checkpoint, then ready. A reset that fails deletes the agent (the top-up replaces it). */
  release(pool: PoolRow, row: AgentRow, requestId?: string): Promise<{ row: AgentRow; resetMs: number }>;
  /** Removes the pool's agents that are not handed out and marks it deleted; handed-out ones stay with their holders. */
  remove(pool: PoolRow): Promise<{ removed: number; leftInUse: number }>;
  /** Resolves when no top-up is under way (tests). */
  idle(): Promise<void>;
  /** Runs `work` after the answer (logged if it fails), kept alive where the runtime needs that (`PoolKeeperDeps.background`). */
  after(what: string, work: Promise<unknown>, detail: Record<string, unknown>): void;
}

const defaultBackoff = { firstMs: 1000, maxMs: 60_000 };

export function createPoolKeeper(deps: PoolKeeperDeps): PoolKeeper {
  const { store, agents, fleet, log } = deps;
  const backoff = deps.backoff ?? defaultBackoff;
  const running = new Map<string, Promise<void>>();
  const again = new Set<string>();
  const failures = new Map<string, number>();
  const timers = new Map<string, { timer: ReturnType<typeof setTimeout>; due: number }>();
  let stopped = false;

  /** A new agent of the pool, a hibernated fork of its checkpoint (the checkpoint's agent's shape and settings); undefined when the pool has no room. */
  async function forkInto(pool: PoolRow, why: Reservation, requestId?: string): Promise<AgentRow | undefined> {
    const fork = fleet.fork;
    if (!fork || !deps.checkpoints) throw new AppError("checkpoints_unsupported", "this gateway's fleet keeps no checkpoints");
    const ckp = await deps.checkpoints.get(pool.fromCheckpoint);
    const source = ckp ? await agents.get(ckp.agentId) : undefined;
    if (!ckp || !source) throw new AppError("conflict", `pool ${pool.id}'s checkpoint ${pool.fromCheckpoint} was deleted: it can fork no more agents`);
    const row = await store.reserve(
      pool.id,
      {
        id: newId("agent"),
        tenantId: pool.tenantId,
        name: pool.name,
        image: source.image,
        imageDigest: source.imageDigest,
        vcpus: source.vcpus,
        memMiB: source.memMiB,
        diskMiB: source.diskMiB,
        idleTimeoutMs: source.idleTimeoutMs,
        streamIdleMs: source.streamIdleMs,
        public: source.public,
        allowEgress: source.allowEgress,
        nonWaking: source.nonWaking,
        hostId: ckp.hostId,
        forkedFrom: ckp.id,
      },
      why,
    );
    if (!row) return undefined;
    try {
      await fork.call(fleet, agentSpec(row), ckp.id, requestId);
    } catch (err) {
      await discard(row);
      throw err;
    }
    if (why === "acquire") return row;
    const ready = await store.move(row.id, pool.id, ["resetting"], "ready");
    // Deleted with its pool while it was forked: its VM goes too.
    if (!ready) await discard(row);
    return ready ?? row;
  }

  /** Deletes an agent of a pool (its VM from its host, its row), whatever state its host has it in. */
  async function discard(row: AgentRow): Promise<void> {
    await fleet.remove(row.id).catch((err: unknown) => log.warn("a pool's agent was not removed from its host", { agentId: row.id, err: message(err) }));
    await agents.markDeleted(row.id);
  }

  async function topUp(poolId: string): Promise<void> {
    try {
      while (!stopped) {
        const pool = await store.get(poolId);
        if (pool?.state !== "active") return;
        const row = await forkInto(pool, "top-up");
        if (!row) break;
        log.info("pool topped up", { poolId, agentId: row.id });
      }
      failures.delete(poolId);
    } catch (err) {
      if (err instanceof AppError && err.code === "conflict") {
        // Its checkpoint is gone: no retry would fork anything (the next acquire tries, and says so).
        log.warn("a pool cannot be topped up", { poolId, err: err.message });
        return;
      }
      const n = (failures.get(poolId) ?? 0) + 1;
      failures.set(poolId, n);
      const delayMs = Math.min(backoff.firstMs * 2 ** (n - 1), backoff.maxMs);
      log.warn("a pool's top-up failed; tried again later", { poolId, failures: n, retryInMs: delayMs, err: message(err) });
      if (!stopped) {
        const timer = setTimeout(() => {
          timers.delete(poolId);
          kick(poolId);
        }, delayMs);
        timers.set(poolId, { timer, due: Date.now() + delayMs });
      }
    }
  }

  function kick(poolId: string): void {
    if (stopped) return;
    if (running.has(poolId)) {
      again.add(poolId);
      return;
    }
    const waiting = timers.get(poolId);
    if (waiting) {
      // Backing off after a failure: its timer kicks it (or, past its time, this does: a Worker's timers may not outlive its request).
      if (Date.now() < waiting.due) return;
      clearTimeout(waiting.timer);
      timers.delete(poolId);
    }
    const run = topUp(poolId).finally(() => {
      running.delete(poolId);
      if (again.delete(poolId)) kick(poolId);
    });
    running.set(poolId, run);
    deps.background?.(run);
  }

  return {
    store,
    start() {
      store
        .live()
        .then((rows) => {
          for (const pool of rows) {
            if (pool.state === "active") kick(pool.id);
            // A delete an earlier process did not finish.
            else
              void removeIdle(pool).catch((err: unknown) => log.warn("a deleted pool's agents were not all removed", { poolId: pool.id, err: message(err) }));
          }
        })
        .catch((err: unknown) => log.warn("pools were not topped up at start", { err: message(err) }));
    },
    async stop() {
      stopped = true;
      for (const t of timers.values()) clearTimeout(t.timer);
      timers.clear();
      await Promise.allSettled([...running.values()]);
    },
    kick,
    async acquire(pool, requestId) {
      if (pool.state !== "active") throw new AppError("not_found", `pool ${pool.id} not found`);
      const ready = await store.claimReady(pool.id);
      if (ready) {
        kick(pool.id);
        return { row: ready, forked: false };
      }
      const forked = await forkInto(pool, "acquire", requestId);
      if (!forked) {
        const counts = (await store.counts([pool.id])).get(pool.id);
        throw new AppError(
          "pool_exhausted",
          `pool ${pool.id} has every agent handed out (${counts?.inUse ?? 0} in use, ${counts?.resetting ?? 0} being made ready, maxSize ${pool.maxSize}): release one, or wait for one being made ready`,
        );
      }
      kick(pool.id);
      return { row: forked, forked: true };
    },
    async release(pool, row, requestId) {
      const taken = await store.move(row.id, pool.id, ["in_use"], "resetting");
      if (!taken) throw new AppError("conflict", `agent ${row.id} is not handed out by pool ${pool.id}`);
      let resetMs: number;
      try {
        resetMs = (await resetToFork(fleet, deps.checkpoints, taken, requestId)).resetMs;
      } catch (err) {
        log.warn("a released agent's reset failed: it is deleted, the top-up replaces it", { poolId: pool.id, agentId: row.id, err: message(err) });
        await discard(taken);
        kick(pool.id);
        throw err;
      }
      const ready = await store.move(row.id, pool.id, ["resetting"], "ready");
      if (!ready) throw new AppError("not_found", `agent ${row.id} left pool ${pool.id} while it was reset`);
      return { row: ready, resetMs };
    },
    async remove(pool) {
      await store.markDeleting(pool.id);
      const removed = await removeIdle(pool);
      const leftInUse = (await store.members(pool.id, ["in_use"])).length;
      await store.markDeleted(pool.id);
      return { removed, leftInUse };
    },
    async idle() {
      while (running.size > 0) await Promise.allSettled([...running.values()]);
    },
    after(what, work, detail) {
      const logged = work.catch((err: unknown) => log.warn(what, { ...detail, err: message(err) }));
      deps.background?.(logged);
    },
  };

  async function removeIdle(pool: PoolRow): Promise<number> {
    const idle = await store.members(pool.id, ["ready", "resetting"]);
    for (const row of idle) await discard(row);
    if (pool.state === "deleting" && pool.deletedAt === null) await store.markDeleted(pool.id);
    return idle.length;
  }
}

function message(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

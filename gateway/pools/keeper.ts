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
  /**
   * Hands out one of the pool's agents: a ready one, or one forked now while the pool holds fewer than `maxSize`. At
   * `maxSize` with agents being made ready (forked by the top-up, reset after a release), it waits up to `waitMs` for
   * one of them (woken when one is ready here, polling the database for other gateways'); 409 pool_exhausted when every
   * agent is handed out, or none became ready in time.
   */
  acquire(pool: PoolRow, requestId?: string, opts?: AcquireOptions): Promise<{ row: AgentRow; forked: boolean }>;
  /**
   * Sets the pool's `size` and `maxSize`: a larger pool is topped up at once; a smaller one loses its surplus ready
   * agents (handed-out ones stay with their holders, and count towards `maxSize` until released).
   */
  resize(pool: PoolRow, sizes: Pick<PoolRow, "size" | "maxSize">): Promise<{ row: PoolRow; removed: number }>;
  /** Takes a handed-out agent back: reset to the pool's checkpoint, then ready. A reset that fails deletes the agent (the top-up replaces it). */
  release(pool: PoolRow, row: AgentRow, requestId?: string): Promise<{ row: AgentRow; resetMs: number }>;
  /** Removes the pool's agents that are not handed out and marks it deleted; handed-out ones stay with their holders. */
  remove(pool: PoolRow): Promise<{ removed: number; leftInUse: number }>;
  /** Resolves when no top-up is under way (tests). */
  idle(): Promise<void>;
  /** Runs `work` after the answer (logged if it fails), kept alive where the runtime needs that (`PoolKeeperDeps.background`). */
  after(what: string, work: Promise<unknown>, detail: Record<string, unknown>): void;
}

/** The longest an acquire may wait for an agent being made ready, ms (`waitMs`). */
export const maxAcquireWaitMs = 60_000;

export interface AcquireOptions {
  /** How long to wait for an agent being made ready when none is and the pool is at maxSize, ms (default 0: 409 at once). */
  waitMs?: number;
  /** The caller went away: the wait ends (409). */
  signal?: AbortSignal;
}

const defaultBackoff = { firstMs: 1000, maxMs: 60_000 };
/** How often a waiting acquire looks at the database again (another gateway's agents becoming ready wake no one here), ms. */
const acquirePollMs = 200;

export function createPoolKeeper(deps: PoolKeeperDeps): PoolKeeper {
  const { store, agents, fleet, log } = deps;
  const backoff = deps.backoff ?? defaultBackoff;
  const running = new Map<string, Promise<void>>();
  const again = new Set<string>();
  const failures = new Map<string, number>();
  const timers = new Map<string, { timer: ReturnType<typeof setTimeout>; due: number }>();
  /** Acquires waiting for one of a pool's agents to be ready (or to leave it): told when one does. */
  const waiters = new Map<string, Set<() => void>>();
  let stopped = false;

  /** Something changed in the pool that a waiting acquire should look at: an agent ready, one gone, new sizes. */
  function changed(poolId: string): void {
    const waiting = waiters.get(poolId);
    if (!waiting) return;
    waiters.delete(poolId);
    for (const wake of waiting) wake();
  }

  /** Resolves when the pool changes here, after `ms`, or when `signal` aborts, whichever is first. */
  function changeOrTimeout(poolId: string, ms: number, signal: AbortSignal | undefined): Promise<void> {
    return new Promise<void>((resolve) => {
      let set = waiters.get(poolId);
      if (!set) waiters.set(poolId, (set = new Set()));
      const done = () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", done);
        waiters.get(poolId)?.delete(done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      signal?.addEventListener("abort", done, { once: true });
      set.add(done);
    });
  }

  /** Removes the pool's ready agents beyond its sizes (their rows marked deleted first, then their VMs); how many. */
  async function trim(poolId: string): Promise<number> {
    const surplus = await store.takeSurplus(poolId);
    for (const row of surplus) {
      await fleet
        .remove(row.id)
        .catch((err: unknown) => log.warn("a pool's surplus agent was not removed from its host", { agentId: row.id, err: message(err) }));
    }
    if (surplus.length > 0) log.info("pool trimmed to its size", { poolId, removed: surplus.length });
    return surplus.length;
  }

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
        desktop: source.desktop,
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
      changed(pool.id);
      throw err;
    }
    if (why === "acquire") return row;
    const ready = await store.move(row.id, pool.id, ["resetting"], "ready");
    // Deleted with its pool while it was forked: its VM goes too.
    if (!ready) await discard(row);
    changed(pool.id);
    return ready ?? row;
  }

  /** Deletes an agent of a pool (its VM from its host, its row), whatever state its host has it in. */
  async function discard(row: AgentRow): Promise<void> {
    await fleet.remove(row.id).catch((err: unknown) => log.warn("a pool's agent was not removed from its host", { agentId: row.id, err: message(err) }));
    await agents.markDeleted(row.id);
  }

  async function topUp(poolId: string): Promise<void> {
    try {
      // A pool made smaller (or an agent released into one) may hold more ready agents than it keeps.
      await trim(poolId);
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
    async acquire(pool, requestId, opts = {}) {
      if (pool.state !== "active") throw new AppError("not_found", `pool ${pool.id} not found`);
      const waitMs = opts.waitMs ?? 0;
      const deadline = Date.now() + waitMs;
      for (;;) {
        const ready = await store.claimReady(pool.id);
        if (ready) {
          kick(pool.id);
          return { row: ready, forked: false };
        }
        const forked = await forkInto(pool, "acquire", requestId);
        if (forked) {
          kick(pool.id);
          return { row: forked, forked: true };
        }
        const counts = (await store.counts([pool.id])).get(pool.id);
        // One became ready since the claim above (a release, a fork): claimed on the next turn, or by another acquirer.
        if ((counts?.ready ?? 0) > 0 && deadline - Date.now() > 0) continue;
        const inUse = counts?.inUse ?? 0;
        const resetting = counts?.resetting ?? 0;
        const left = deadline - Date.now();
        if (resetting === 0 || left <= 0 || opts.signal?.aborted) {
          const why = resetting === 0 ? "release one" : `none became ready within ${waitMs} ms (wait longer with waitMs, up to ${maxAcquireWaitMs})`;
          throw new AppError(
            "pool_exhausted",
            `pool ${pool.id} has every agent handed out (${inUse} in use, ${resetting} being made ready, maxSize ${pool.maxSize}): ${why}`,
            resetting > 0 ? { retryAfterS: 1 } : {},
          );
        }
        await changeOrTimeout(pool.id, Math.min(left, acquirePollMs), opts.signal);
      }
    },
    async resize(pool, sizes) {
      if (pool.state !== "active") throw new AppError("not_found", `pool ${pool.id} not found`);
      const row = await store.resize(pool.id, sizes);
      if (!row) throw new AppError("not_found", `pool ${pool.id} not found`);
      const removed = await trim(pool.id);
      changed(pool.id);
      kick(pool.id);
      return { row, removed };
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
        changed(pool.id);
        kick(pool.id);
        throw err;
      }
      const ready = await store.move(row.id, pool.id, ["resetting"], "ready");
      if (!ready) throw new AppError("not_found", `agent ${row.id} left pool ${pool.id} while it was reset`);
      changed(pool.id);
      // Beyond the pool's size now (it was made smaller while the agent was out): the top-up's trim takes it.
      kick(pool.id);
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

// The pool keeper over an in-memory store and fleet: its start tops up every active pool and finishes unfinished deletes; a failing fork backs off, doubling.
import { describe, expect, it } from "vitest";
import { silentLogger } from "../../lib/log.ts";
import type { Fleet } from "../../contracts/fleet.ts";
import type { PoolAgentState } from "../../schema/core.ts";
import type { AgentRepo, AgentRow } from "../../gateway/agents/repo.ts";
import type { CheckpointRepo, CheckpointRow } from "../../gateway/checkpoints/repo.ts";
import { createPoolKeeper } from "../../gateway/pools/keeper.ts";
import type { PoolRow, PoolStore } from "../../gateway/pools/store.ts";

const source = { id: "agt_source00000001", tenantId: "ten_k", name: "s", image: "demo", imageDigest: null, vcpus: 1, memMiB: 128, diskMiB: 1024 } as AgentRow;
const ckp = { id: "ckp_keeper00000001", tenantId: "ten_k", agentId: source.id, hostId: "host_k" } as CheckpointRow;

function pool(id: string, over: Partial<PoolRow> = {}): PoolRow {
  const at = new Date();
  return {
    id,
    tenantId: "ten_k",
    name: id,
    fromCheckpoint: ckp.id,
    size: 2,
    maxSize: 3,
    state: "active",
    createdAt: at,
    updatedAt: at,
    deletedAt: null,
    ...over,
  };
}

/** A store over arrays, enough for the keeper: rows in pools, agents with their pool state. */
function memoryStore(pools: PoolRow[]) {
  const agents: AgentRow[] = [];
  const store: PoolStore = {
    create: async (p) => {
      const row = pool(p.id, p);
      pools.push(row);
      return row;
    },
    get: async (id) => pools.find((p) => p.id === id && p.deletedAt === null),
    list: async (t) => pools.filter((p) => p.tenantId === t && p.deletedAt === null),
    live: async () => pools.filter((p) => p.deletedAt === null),
    counts: async (ids) => {
      const out = new Map<string, { ready: number; inUse: number; resetting: number }>();
      for (const id of ids) {
        const mine = agents.filter((x) => x.poolId === id && x.deletedAt === null);
        out.set(id, {
          ready: mine.filter((x) => x.poolState === "ready").length,
          inUse: mine.filter((x) => x.poolState === "in_use").length,
          resetting: mine.filter((x) => x.poolState === "resetting").length,
        });
      }
      return out;
    },
    claimReady: async (id) => {
      const a = agents.find((x) => x.poolId === id && x.poolState === "ready" && x.deletedAt === null);
      if (a) a.poolState = "in_use";
      return a;
    },
    reserve: async (id, agent, why) => {
      const p = pools.find((x) => x.id === id);
      const mine = agents.filter((x) => x.poolId === id && x.deletedAt === null);
      if (p?.state !== "active" || mine.length >= p.maxSize || (why === "top-up" && mine.filter((x) => x.poolState !== "in_use").length >= p.size))
        return undefined;
      const row = { ...source, ...agent, poolId: id, poolState: (why === "acquire" ? "in_use" : "resetting") as PoolAgentState, deletedAt: null } as AgentRow;
      agents.push(row);
      return row;
    },
    move: async (agentId, poolId, from, to) => {
      const a = agents.find((x) => x.id === agentId && x.poolId === poolId && x.deletedAt === null && from.includes(x.poolState!));
      if (a) a.poolState = to;
      return a;
    },
    resize: async (id, sizes) => {
      const p = pools.find((x) => x.id === id && x.state === "active");
      if (p) Object.assign(p, sizes);
      return p;
    },
    takeSurplus: async (id) => {
      const p = pools.find((x) => x.id === id);
      const mine = agents.filter((x) => x.poolId === id && x.deletedAt === null);
      if (!p) return [];
      const surplus = Math.max(0, mine.filter((x) => x.poolState !== "in_use").length - p.size, mine.length - p.maxSize);
      if (surplus === 0) return [];
      const ready = mine.filter((x) => x.poolState === "ready");
      const taken = ready.slice(Math.max(0, ready.length - surplus));
      for (const a of taken) a.deletedAt = new Date();
      return taken;
    },
    members: async (id, states) => agents.filter((x) => x.poolId === id && x.deletedAt === null && (!states || states.includes(x.poolState!))),
    markDeleting: async (id) => {
      const p = pools.find((x) => x.id === id);
      if (p) p.state = "deleting";
    },
    markDeleted: async (id) => {
      const p = pools.find((x) => x.id === id);
      if (p) p.deletedAt = new Date();
    },
  };
  return { store, agents };
}

function parts(pools: PoolRow[], forkFailures = 0, forkMs = 0) {
  const { store, agents } = memoryStore(pools);
  const forks: number[] = [];
  const forked: number[] = [];
  const removed: string[] = [];
  let failures = forkFailures;
  const fleet = {
    fork: async () => {
      forks.push(Date.now());
      if (forkMs > 0) await new Promise((r) => setTimeout(r, forkMs));
      if (failures > 0) {
        failures--;
        throw new Error("disk full");
      }
      forked.push(performance.now());
      return "hibernated";
    },
    remove: async (id: string) => void removed.push(id),
  } as unknown as Fleet;
  const agentRepo = {
    get: async (id: string) => (id === source.id ? source : agents.find((a) => a.id === id)),
    markDeleted: async (id: string) => {
      const a = agents.find((x) => x.id === id);
      if (a) a.deletedAt = new Date();
    },
  } as unknown as AgentRepo;
  const checkpoints = { get: async (id: string) => (id === ckp.id ? ckp : undefined) } as unknown as CheckpointRepo;
  const keeper = createPoolKeeper({ store, agents: agentRepo, checkpoints, fleet, log: silentLogger, backoff: { firstMs: 40, maxMs: 100 } });
  return { keeper, agents, forks, forked, removed };
}

async function until(check: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error("timed out");
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe("pool keeper", () => {
  it("at start, tops up every active pool to its size and removes the idle agents of a pool left being deleted", async () => {
    const pools = [pool("pol_a0000001"), pool("pol_b0000001", { size: 1 }), pool("pol_c0000001", { state: "deleting" })];
    const { keeper, agents, removed } = parts(pools);
    agents.push({ ...source, id: "agt_left00000001", poolId: "pol_c0000001", poolState: "ready", deletedAt: null } as AgentRow);
    keeper.start();
    await until(() => agents.filter((a) => a.poolState === "ready" && a.deletedAt === null).length === 3 && pools[2]!.deletedAt !== null);
    await keeper.idle();
    const ready = (id: string) => agents.filter((a) => a.poolId === id && a.poolState === "ready" && a.deletedAt === null).length;
    expect([ready("pol_a0000001"), ready("pol_b0000001"), ready("pol_c0000001")]).toEqual([2, 1, 0]);
    expect(removed).toEqual(["agt_left00000001"]);
    await keeper.stop();
  });

  it("backs off after a failed fork, doubling up to its longest wait, then fills the pool; a failed fork's agent is deleted", async () => {
    const { keeper, agents, forks } = parts([pool("pol_d0000001")], 3);
    keeper.kick("pol_d0000001");
    await until(() => agents.filter((a) => a.poolState === "ready" && a.deletedAt === null).length === 2);
    expect(forks).toHaveLength(5);
    const gaps = forks.slice(1, 4).map((t, i) => t - forks[i]!);
    expect(gaps[0]).toBeGreaterThanOrEqual(35); // 40 ms
    expect(gaps[1]).toBeGreaterThanOrEqual(75); // 80 ms
    expect(gaps[2]).toBeGreaterThanOrEqual(95); // 160 ms, capped at 100
    expect(agents.filter((a) => a.deletedAt !== null)).toHaveLength(3);
    await keeper.stop();
  });

  it("an acquire at maxSize waits for the top-up's fork and is woken as it is ready (not at its next look at the store); with none being made ready, 409 at once", async () => {
    const p = pool("pol_f0000001", { size: 1, maxSize: 1 });
    const { keeper, forked } = parts([p], 0, 300);
    keeper.kick(p.id);
    await new Promise((r) => setTimeout(r, 50)); // the fork is under way
    const t0 = performance.now();
    const got = await keeper.acquire(p, undefined, { waitMs: 5000 });
    const answered = performance.now();
    expect(got.forked).toBe(false);
    expect(answered - t0).toBeGreaterThan(150);
    // Woken by the fork's end: well before the 200 ms poll would have looked again.
    expect(answered - forked[0]!).toBeLessThan(60);
    const t1 = performance.now();
    await expect(keeper.acquire(p, undefined, { waitMs: 5000 })).rejects.toMatchObject({ code: "pool_exhausted" });
    expect(performance.now() - t1).toBeLessThan(100);
    await keeper.stop();
  });

  it("resize: a larger pool is topped up at once, a smaller one's surplus ready agents are removed (its VMs too)", async () => {
    const p = pool("pol_g0000001", { size: 1, maxSize: 3 });
    const { keeper, agents, removed } = parts([p]);
    const ready = () => agents.filter((a) => a.poolId === p.id && a.poolState === "ready" && a.deletedAt === null);
    keeper.kick(p.id);
    await until(() => ready().length === 1);
    await keeper.idle();
    expect((await keeper.resize(p, { size: 3, maxSize: 3 })).removed).toBe(0);
    await until(() => ready().length === 3);
    await keeper.idle();
    const { row, removed: n } = await keeper.resize(p, { size: 1, maxSize: 3 });
    expect([row.size, n, ready().length]).toEqual([1, 2, 1]);
    expect(removed).toHaveLength(2);
    await keeper.stop();
  });

  it("stops: no top-up after stop, and a backoff timer pending is cleared", async () => {
    const { keeper, forks } = parts([pool("pol_e0000001")], 100);
    keeper.kick("pol_e0000001");
    await until(() => forks.length === 1);
    await keeper.stop();
    const n = forks.length;
    keeper.kick("pol_e0000001");
    await new Promise((r) => setTimeout(r, 150));
    expect(forks.length).toBe(n);
  });
});

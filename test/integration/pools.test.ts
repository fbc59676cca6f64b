// Warm pools through the real system (Postgres, HTTP, the host) over a driver that copies directories: top-up, atomic acquire, release and reset, delete, bad input.
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { and, eq, isNull } from "drizzle-orm";
import { agents, auditLog, pools } from "../../schema/core.ts";
import { FakeCheckpointDriver, restoredFromFile } from "../helpers/fake-checkpoint-driver.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";
import { runAgentvm } from "../helpers/cli.ts";
import { openDatabase } from "../../schema/db.ts";
import { tenants } from "../../schema/core.ts";
import { createPoolStore } from "../../gateway/pools/store.ts";
import { newId } from "../../lib/ids.ts";
import { AgentVM } from "../../sdk/typescript/src/index.ts";

/** Fails the next `failures` restores and forks (a host out of disk, say), then copies as the fake does; each takes `slowMs` more. */
class FlakyDriver extends FakeCheckpointDriver {
  failures = 0;
  slowMs = 0;
  override async restoreCheckpoint(spec: Parameters<FakeCheckpointDriver["restoreCheckpoint"]>[0], dir: string): Promise<void> {
    if (this.slowMs > 0) await new Promise((r) => setTimeout(r, this.slowMs));
    if (this.failures > 0) {
      this.failures--;
      throw new Error("no space left on device (a test's failure)");
    }
    return super.restoreCheckpoint(spec, dir);
  }
}

let sys: TestSystem;
let driver: FlakyDriver;
let other: string; // a token of another tenant

interface Pool {
  id: string;
  name: string;
  fromCheckpoint: string;
  size: number;
  maxSize: number;
  ready: number;
  inUse: number;
  resetting: number;
  state: string;
}
interface Agent {
  id: string;
  state: string;
  forkedFrom: string | null;
  pool: { id: string; state: string } | null;
}

const json = { "content-type": "application/json" };
const post = (path: string, body?: unknown, token?: string) =>
  sys.call(path, { method: "POST", headers: json, ...(body !== undefined ? { body: JSON.stringify(body) } : {}), ...(token !== undefined ? { token } : {}) });
const stateDir = (agentId: string) => join(sys.dataDir, "hosts", sys.host.hostId, "vms", agentId);

async function until(what: string, check: () => Promise<boolean> | boolean, ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function getPool(id: string): Promise<Pool> {
  const res = await sys.call(`/v1/pools/${id}`);
  expect(res.status, await res.clone().text()).toBe(200);
  return (await res.json()) as Pool;
}

async function errorCode(res: Response): Promise<string> {
  return ((await res.json()) as { error: { code: string } }).error.code;
}

/** A checkpoint of an awake demo agent (its state directory holds `workspace` = "clean"). */
async function checkpoint(name?: string): Promise<{ agentId: string; id: string }> {
  const { id: agentId } = await sys.createAgent({ idleTimeoutMs: 600_000 });
  expect((await sys.call(`/a/${agentId}/counter`)).status).toBe(200);
  writeFileSync(join(stateDir(agentId), "workspace"), "clean");
  const res = await post(`/v1/agents/${agentId}/checkpoints`, name !== undefined ? { name } : {});
  expect(res.status, await res.clone().text()).toBe(201);
  return { agentId, id: ((await res.json()) as { id: string }).id };
}

async function createPool(body: Record<string, unknown>): Promise<Pool> {
  const res = await post("/v1/pools", body);
  expect(res.status, await res.clone().text()).toBe(201);
  return (await res.json()) as Pool;
}

async function filled(pool: Pool, ready = pool.size): Promise<Pool> {
  let seen = pool;
  await until(`pool ${pool.id} to hold ${ready} ready`, async () => {
    seen = await getPool(pool.id);
    return seen.ready === ready && seen.resetting === 0;
  });
  return seen;
}

beforeAll(async () => {
  driver = new FlakyDriver();
  sys = await startSystem({ driver });
  await sys.ensureTenant("ten_other");
  other = await sys.token({ tenant: "ten_other" });
}, 60_000);

afterAll(async () => {
  await sys?.stop();
});

describe("pools", () => {
  it("keeps `size` hibernated forks ready; 20 acquirers at once on a pool of 5 (maxSize 5): 5 distinct agents, 15 × 409 pool_exhausted", async () => {
    const ckp = await checkpoint();
    const pool = await createPool({ name: "rl", fromCheckpoint: ckp.id, size: 5, maxSize: 5 });
    expect(pool).toMatchObject({ name: "rl", fromCheckpoint: ckp.id, size: 5, maxSize: 5, state: "active" });
    expect(pool.id).toMatch(/^pol_/);
    await filled(pool);
    const members = await sys.database.db
      .select()
      .from(agents)
      .where(and(eq(agents.poolId, pool.id), isNull(agents.deletedAt)));
    expect(members).toHaveLength(5);
    for (const m of members) {
      expect(m).toMatchObject({ poolState: "ready", forkedFrom: ckp.id, hostId: sys.host.hostId });
      expect(await sys.state(m.id)).toBe("hibernated");
    }

    const answers = await Promise.all(Array.from({ length: 20 }, () => post(`/v1/pools/${pool.id}/acquire`)));
    const ok = answers.filter((r) => r.status === 200);
    const refused = answers.filter((r) => r.status === 409);
    expect(ok).toHaveLength(5);
    expect(refused).toHaveLength(15);
    for (const r of refused) expect(await errorCode(r)).toBe("pool_exhausted");
    const got = await Promise.all(ok.map(async (r) => (await r.json()) as { agent: Agent; pool: string; forked: boolean }));
    expect(new Set(got.map((g) => g.agent.id)).size).toBe(5);
    for (const g of got) {
      expect(g.pool).toBe(pool.id);
      expect(g.forked).toBe(false);
      expect(g.agent.pool).toEqual({ id: pool.id, state: "in_use" });
    }
    expect(await getPool(pool.id)).toMatchObject({ ready: 0, inUse: 5, resetting: 0 });
    // Woken in the background: each answers its first call.
    for (const g of got) expect((await sys.call(`/a/${g.agent.id}/counter`)).status).toBe(200);
    const audits = await sys.database.db.select().from(auditLog).where(eq(auditLog.target, pool.id));
    expect(audits.filter((a) => a.action === "pool.acquire")).toHaveLength(5);
    expect(audits.map((a) => a.action)).toContain("pool.create");
  });

  it("release resets the agent to the checkpoint and makes it ready again; a second release is 409; the next acquire hands it out", async () => {
    const ckp = await checkpoint();
    const pool = await filled(await createPool({ fromCheckpoint: ckp.id, size: 1, maxSize: 1 }));
    expect(pool.name).toBe(pool.id);
    const res = await post(`/v1/pools/${pool.id}/acquire`);
    expect(res.status).toBe(200);
    const { agent } = (await res.json()) as { agent: Agent };
    expect((await sys.call(`/a/${agent.id}/counter`)).status).toBe(200);
    writeFileSync(join(stateDir(agent.id), "workspace"), "dirty");
    writeFileSync(join(stateDir(agent.id), "episode-file"), "1");

    const rel = await post(`/v1/pools/${pool.id}/release`, { agentId: agent.id });
    expect(rel.status, await rel.clone().text()).toBe(200);
    const released = (await rel.json()) as { agent: Agent; resetMs: number };
    expect(released.agent).toMatchObject({ id: agent.id, state: "hibernated", pool: { id: pool.id, state: "ready" } });
    expect(released.resetMs).toBeGreaterThanOrEqual(0);
    expect(readFileSync(join(stateDir(agent.id), "workspace"), "utf8")).toBe("clean");
    expect(readFileSync(join(stateDir(agent.id), restoredFromFile), "utf8")).toBe(ckp.id);
    expect(await getPool(pool.id)).toMatchObject({ ready: 1, inUse: 0 });

    const again = await post(`/v1/pools/${pool.id}/release`, { agentId: agent.id });
    expect(again.status).toBe(409);
    expect(await errorCode(again)).toBe("conflict");
    const next = (await (await post(`/v1/pools/${pool.id}/acquire`)).json()) as { agent: Agent };
    expect(next.agent.id).toBe(agent.id);
    expect((await post(`/v1/pools/${pool.id}/acquire`)).status).toBe(409);
  });

  it("POST /v1/agents/{id}/reset rolls a fork back to its checkpoint ({agent, resetMs}); 409 for an agent that was not forked", async () => {
    const ckp = await checkpoint();
    const fork = (await (await post("/v1/agents", { fromCheckpoint: ckp.id })).json()) as Agent;
    expect((await sys.call(`/a/${fork.id}/counter`)).status).toBe(200);
    writeFileSync(join(stateDir(fork.id), "workspace"), "dirty");
    const res = await post(`/v1/agents/${fork.id}/reset`);
    expect(res.status, await res.clone().text()).toBe(200);
    const body = (await res.json()) as { agent: Agent; checkpointId: string; resetMs: number };
    expect(body.checkpointId).toBe(ckp.id);
    expect(body.agent.id).toBe(fork.id);
    expect(typeof body.resetMs).toBe("number");
    expect(readFileSync(join(stateDir(fork.id), "workspace"), "utf8")).toBe("clean");
    // Woken in the background: the next call answers.
    expect((await sys.call(`/a/${fork.id}/counter`)).status).toBe(200);
    const audits = await sys.database.db.select().from(auditLog).where(eq(auditLog.target, fork.id));
    expect(audits.find((a) => a.action === "agent.reset")?.detail).toMatchObject({ checkpointId: ckp.id });

    const fresh = await sys.createAgent();
    const refused = await post(`/v1/agents/${fresh.id}/reset`);
    expect(refused.status).toBe(409);
    expect(await errorCode(refused)).toBe("conflict");
    expect((await post(`/v1/agents/${fork.id}/reset`, undefined, other)).status).toBe(404);
    expect((await post("/v1/agents/nope/reset")).status).toBe(400);
  });

  it("forks on demand when none is ready below maxSize, tops back up to size after acquires, and is made from agt_…:name", async () => {
    const ckp = await checkpoint("episode-start");
    const pool = await createPool({ name: "demand", fromCheckpoint: `${ckp.agentId}:episode-start`, size: 0, maxSize: 2 });
    expect(pool.fromCheckpoint).toBe(ckp.id);
    const first = (await (await post(`/v1/pools/${pool.id}/acquire`)).json()) as { agent: Agent; forked: boolean };
    expect(first.forked).toBe(true);
    expect(first.agent).toMatchObject({ forkedFrom: ckp.id, pool: { id: pool.id, state: "in_use" } });

    const topped = await createPool({ name: "topped", fromCheckpoint: ckp.id, size: 2, maxSize: 4 });
    await filled(topped);
    for (let i = 0; i < 2; i++) expect((await post(`/v1/pools/${topped.id}/acquire`)).status).toBe(200);
    // The top-up forks two more (4 in all: maxSize), then no more.
    const after = await filled(topped, 2);
    expect(after).toMatchObject({ inUse: 2, ready: 2 });
    expect((await post(`/v1/pools/${topped.id}/acquire`)).status).toBe(200);
    await new Promise((r) => setTimeout(r, 300));
    expect(await getPool(topped.id)).toMatchObject({ inUse: 3, ready: 1, resetting: 0 });
  });

  it("acquire at maxSize while the top-up forks waits for the fork (it was 409 at once); waitMs=0, a short wait, and every agent handed out are 409", async () => {
    const ckp = await checkpoint();
    const pool = await filled(await createPool({ name: "waits", fromCheckpoint: ckp.id, size: 1, maxSize: 2 }));
    driver.slowMs = 1500;
    try {
      const first = await post(`/v1/pools/${pool.id}/acquire`);
      expect(first.status).toBe(200);
      const firstId = ((await first.json()) as { agent: Agent }).agent.id;
      // The top-up forks the second agent (maxSize 2 reached, it being made ready).
      await until("the top-up to fork", async () => (await getPool(pool.id)).resetting === 1);
      let t0 = Date.now();
      const atOnce = await post(`/v1/pools/${pool.id}/acquire?waitMs=0`);
      expect(atOnce.status).toBe(409);
      expect(await errorCode(atOnce)).toBe("pool_exhausted");
      expect(Date.now() - t0).toBeLessThan(1000);
      t0 = Date.now();
      const short = await post(`/v1/pools/${pool.id}/acquire?waitMs=200`);
      expect(short.status).toBe(409);
      expect(short.headers.get("retry-after")).toBe("1");
      expect(await short.text()).toContain("none became ready within 200 ms");
      expect(Date.now() - t0).toBeGreaterThanOrEqual(200);
      // The default wait (10 s): the fork's agent, as soon as it is ready.
      const second = await post(`/v1/pools/${pool.id}/acquire`);
      expect(second.status, await second.clone().text()).toBe(200);
      const got = (await second.json()) as { agent: Agent; forked: boolean };
      expect(got.agent.id).not.toBe(firstId);
      expect(got.forked).toBe(false);
      expect(got.agent.pool).toEqual({ id: pool.id, state: "in_use" });
      // Every agent handed out and none being made ready: 409 at once, whatever the wait.
      t0 = Date.now();
      const none = await post(`/v1/pools/${pool.id}/acquire?waitMs=60000`);
      expect(none.status).toBe(409);
      expect(await errorCode(none)).toBe("pool_exhausted");
      expect(none.headers.get("retry-after")).toBeNull();
      expect(Date.now() - t0).toBeLessThan(1000);
      for (const bad of ["-1", "60001", "1.5", "soon"]) expect((await post(`/v1/pools/${pool.id}/acquire?waitMs=${bad}`)).status, bad).toBe(400);
    } finally {
      driver.slowMs = 0;
    }
  });

  it("two acquirers waiting for an agent being reset after its release: one gets it, the other 409 (never the same agent)", async () => {
    const ckp = await checkpoint();
    const pool = await filled(await createPool({ name: "waiters", fromCheckpoint: ckp.id, size: 1, maxSize: 1 }));
    const { agent } = (await (await post(`/v1/pools/${pool.id}/acquire`)).json()) as { agent: Agent };
    driver.slowMs = 1000;
    try {
      const released = post(`/v1/pools/${pool.id}/release`, { agentId: agent.id });
      await until("the reset to start", async () => (await getPool(pool.id)).resetting === 1);
      const [a, b] = await Promise.all([post(`/v1/pools/${pool.id}/acquire`), post(`/v1/pools/${pool.id}/acquire`)]);
      expect((await released).status).toBe(200);
      expect([a.status, b.status].sort(), `${await a.clone().text()} ${await b.clone().text()}`).toEqual([200, 409]);
      const ok = (a.status === 200 ? a : b).json() as Promise<{ agent: Agent }>;
      expect((await ok).agent.id).toBe(agent.id);
      expect(await errorCode(a.status === 409 ? a : b)).toBe("pool_exhausted");
    } finally {
      driver.slowMs = 0;
    }
  });

  it("PATCH /v1/pools/{id} grows the pool (topped up at once), shrinks it (surplus ready agents deleted, handed-out ones kept), audited; bad input gets the envelope", async () => {
    const ckp = await checkpoint();
    const pool = await filled(await createPool({ name: "resized", fromCheckpoint: ckp.id, size: 1, maxSize: 1 }));
    const patch = (body: unknown, token?: string) =>
      sys.call(`/v1/pools/${pool.id}`, { method: "PATCH", headers: json, body: JSON.stringify(body), ...(token !== undefined ? { token } : {}) });
    const bad: [unknown, number, string][] = [
      [{}, 400, "size, maxSize"],
      [{ size: 2 }, 400, "maxSize"],
      [{ size: 3, maxSize: 2 }, 400, "maxSize"],
      [{ size: 101, maxSize: 200 }, 400, "size"],
      [{ maxSize: 0 }, 400, "maxSize"],
      [{ size: -1 }, 400, "size"],
      [{ size: 1, colour: "red" }, 400, "colour"],
    ];
    for (const [body, status, says] of bad) {
      const res = await patch(body);
      expect(res.status, JSON.stringify(body)).toBe(status);
      expect(await res.text(), JSON.stringify(body)).toContain(says);
    }
    expect((await patch({ size: 1 }, other)).status).toBe(404);
    expect((await sys.call("/v1/pools/nope", { method: "PATCH", headers: json, body: "{}" })).status).toBe(400);

    const grown = await patch({ size: 3, maxSize: 4 });
    expect(grown.status, await grown.clone().text()).toBe(200);
    expect(await grown.json()).toMatchObject({ id: pool.id, size: 3, maxSize: 4 });
    await filled(pool, 3);
    const held = (await (await post(`/v1/pools/${pool.id}/acquire`)).json()) as { agent: Agent };
    // The top-up replaces it: 3 ready and 1 in use (maxSize 4).
    await until("the top-up after the acquire", async () => {
      const p = await getPool(pool.id);
      return p.ready === 3 && p.inUse === 1 && p.resetting === 0;
    });
    const readyBefore = await sys.database.db
      .select()
      .from(agents)
      .where(and(eq(agents.poolId, pool.id), eq(agents.poolState, "ready"), isNull(agents.deletedAt)));

    const shrunk = await patch({ size: 1 });
    expect(shrunk.status).toBe(200);
    expect(await shrunk.json()).toMatchObject({ size: 1, maxSize: 4, ready: 1, inUse: 1, resetting: 0 });
    const readyAfter = await sys.database.db
      .select()
      .from(agents)
      .where(and(eq(agents.poolId, pool.id), isNull(agents.deletedAt)));
    const gone = readyBefore.filter((r) => !readyAfter.some((a) => a.id === r.id));
    expect(gone).toHaveLength(2);
    for (const r of gone) {
      expect((await sys.call(`/v1/agents/${r.id}`)).status).toBe(404);
      expect(existsSync(stateDir(r.id))).toBe(false);
    }
    // Below what is handed out: the ready ones go, the holder keeps its agent.
    const tiny = await patch({ size: 0, maxSize: 1 });
    expect(await tiny.json()).toMatchObject({ size: 0, maxSize: 1, ready: 0, inUse: 1 });
    expect((await sys.call(`/a/${held.agent.id}/counter`)).status).toBe(200);
    // Released into a pool that keeps none ready: reset, then taken out as surplus.
    expect((await post(`/v1/pools/${pool.id}/release`, { agentId: held.agent.id })).status).toBe(200);
    await until("the released agent to be trimmed", async () => {
      const p = await getPool(pool.id);
      return p.ready === 0 && p.inUse === 0;
    });
    expect((await sys.call(`/v1/agents/${held.agent.id}`)).status).toBe(404);

    const audits = await sys.database.db.select().from(auditLog).where(eq(auditLog.target, pool.id));
    const resizes = audits.filter((a) => a.action === "pool.resize");
    expect(resizes).toHaveLength(3);
    expect(resizes.map((a) => a.detail)).toEqual(
      expect.arrayContaining([
        { from: { size: 1, maxSize: 1 }, to: { size: 3, maxSize: 4 }, removed: 0 },
        { from: { size: 3, maxSize: 4 }, to: { size: 1, maxSize: 4 }, removed: 2 },
        { from: { size: 1, maxSize: 4 }, to: { size: 0, maxSize: 1 }, removed: 1 },
      ]),
    );

    // The TypeScript SDK's pool.resize().
    const sdkPool = await new AgentVM({ baseUrl: sys.url, token: sys.demo.token }).pools.get(pool.id);
    expect(await sdkPool.resize({ size: 2, maxSize: 2 })).toMatchObject({ size: 2, maxSize: 2 });
    expect(sdkPool.info.size).toBe(2);
    await filled(pool, 2);
  });

  it("usage by agent says which pool each pooled agent is in (JSON and CSV); a pooled agent is billed as any other", async () => {
    const ckp = await checkpoint();
    const pool = await filled(await createPool({ name: "billed", fromCheckpoint: ckp.id, size: 1, maxSize: 1 }));
    const { agent } = (await (await post(`/v1/pools/${pool.id}/acquire`)).json()) as { agent: Agent };
    expect((await sys.call(`/a/${agent.id}/counter`)).status).toBe(200);
    await sys.host.flush();
    const day = new Date().toISOString().slice(0, 10);
    const next = new Date(Date.now() + 86_400_000).toISOString().slice(0, 10);
    const range = `from=${day}&to=${next}&groupBy=agent`;
    const usage = (await (await sys.call(`/v1/usage?${range}`)).json()) as { rows: { agentId: string; poolId?: string; hibernatedMs: number }[] };
    const row = usage.rows.find((r) => r.agentId === agent.id);
    expect(row, JSON.stringify(usage.rows)).toMatchObject({ poolId: pool.id });
    expect(row!.hibernatedMs).toBeGreaterThan(0); // its disk while it slept in the pool
    expect(usage.rows.find((r) => r.agentId === ckp.agentId)?.poolId).toBeUndefined();
    const csv = (await (await sys.call(`/v1/usage?${range}&format=csv`)).text()).split("\r\n");
    expect(csv[0]).toMatch(/,hibernated_ms,pool_id$/);
    expect(csv.find((l) => l.includes(`,${agent.id},`))).toMatch(new RegExp(`,${pool.id}$`));
  });

  it("an agent of the pool deleted by hand is replaced; a pool whose checkpoint was deleted says so on acquire", async () => {
    const ckp = await checkpoint();
    const pool = await filled(await createPool({ name: "replaced", fromCheckpoint: ckp.id, size: 2, maxSize: 2 }));
    const [first] = await sys.database.db
      .select()
      .from(agents)
      .where(and(eq(agents.poolId, pool.id), isNull(agents.deletedAt)));
    expect((await sys.call(`/v1/agents/${first!.id}`, { method: "DELETE" })).status).toBe(200);
    await filled(pool);
    const live = await sys.database.db
      .select()
      .from(agents)
      .where(and(eq(agents.poolId, pool.id), isNull(agents.deletedAt)));
    expect(live.map((a) => a.id)).not.toContain(first!.id);

    const gone = await createPool({ name: "orphan", fromCheckpoint: ckp.id, size: 0, maxSize: 1 });
    expect((await sys.call(`/v1/agents/${ckp.agentId}/checkpoints/${ckp.id}`, { method: "DELETE" })).status).toBe(200);
    const refused = await post(`/v1/pools/${gone.id}/acquire`);
    expect(refused.status).toBe(409);
    expect(await refused.text()).toContain("was deleted");
    // The ready forks of the other pool are agents of their own: still handed out.
    expect((await post(`/v1/pools/${pool.id}/acquire`)).status).toBe(200);
  });

  it("a deleted tenant's pools go with it: no top-up forks for it afterwards", async () => {
    await sys.ensureTenant("ten_pooldel");
    const t = await sys.token({ tenant: "ten_pooldel" });
    const { id: agentId } = await sys.createAgent({}, t);
    expect((await sys.call(`/a/${agentId}/counter`, { token: t })).status).toBe(200);
    const taken = (await (await post(`/v1/agents/${agentId}/checkpoints`, {}, t)).json()) as { id: string };
    const res = await post("/v1/pools", { fromCheckpoint: taken.id, size: 2 }, t);
    expect(res.status, await res.clone().text()).toBe(201);
    const pool = (await res.json()) as Pool;
    await until("the pool to fill", async () => ((await (await sys.call(`/v1/pools/${pool.id}`, { token: t })).json()) as Pool).ready === 2);
    const gone = await sys.call("/v1/tenants/ten_pooldel", { method: "DELETE", token: sys.operatorToken });
    expect(gone.status, await gone.clone().text()).toBe(200);
    const [row] = await sys.database.db.select().from(pools).where(eq(pools.id, pool.id));
    expect(row?.deletedAt).not.toBeNull();
    await new Promise((r) => setTimeout(r, 300));
    const live = await sys.database.db
      .select()
      .from(agents)
      .where(and(eq(agents.tenantId, "ten_pooldel"), isNull(agents.deletedAt)));
    expect(live).toEqual([]);
  });

  it("a top-up that fails is tried again with backoff: the failed forks leave no agent, the pool fills", async () => {
    const ckp = await checkpoint();
    driver.failures = 2;
    const t0 = Date.now();
    const pool = await createPool({ name: "flaky", fromCheckpoint: ckp.id, size: 2, maxSize: 2 });
    await filled(pool);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(2500); // 1 s, then 2 s
    expect(driver.failures).toBe(0);
    const rows = await sys.database.db.select().from(agents).where(eq(agents.poolId, pool.id));
    expect(rows.filter((r) => r.deletedAt === null)).toHaveLength(2);
    expect(rows.filter((r) => r.deletedAt !== null)).toHaveLength(2);
  });

  it("delete removes the ready agents, leaves the handed-out ones to their holders, and the pool is gone", async () => {
    const ckp = await checkpoint();
    const pool = await filled(await createPool({ name: "gone", fromCheckpoint: ckp.id, size: 3, maxSize: 3 }));
    const held = (await (await post(`/v1/pools/${pool.id}/acquire`)).json()) as { agent: Agent };
    const ready = await sys.database.db
      .select()
      .from(agents)
      .where(and(eq(agents.poolId, pool.id), eq(agents.poolState, "ready"), isNull(agents.deletedAt)));
    const res = await sys.call(`/v1/pools/${pool.id}`, { method: "DELETE" });
    expect(res.status, await res.clone().text()).toBe(200);
    expect(await res.json()).toEqual({ id: pool.id, deleted: true, removed: 2, leftInUse: 1 });
    for (const r of ready) {
      expect((await sys.call(`/v1/agents/${r.id}`)).status).toBe(404);
      expect(existsSync(stateDir(r.id))).toBe(false);
    }
    expect((await sys.call(`/v1/agents/${held.agent.id}`)).status).toBe(200);
    expect((await sys.call(`/a/${held.agent.id}/counter`)).status).toBe(200);
    expect((await sys.call(`/v1/pools/${pool.id}`)).status).toBe(404);
    expect((await post(`/v1/pools/${pool.id}/acquire`)).status).toBe(404);
    const [row] = await sys.database.db.select().from(pools).where(eq(pools.id, pool.id));
    expect(row?.deletedAt).not.toBeNull();
    // The name is free again.
    await createPool({ name: "gone", fromCheckpoint: ckp.id, size: 0, maxSize: 1 });
  });

  it("makes a pool from an image: an agent booted and checkpointed, the pool forks its checkpoint", async () => {
    const pool = await filled(await createPool({ name: "from-image", image: "demo", size: 1, maxSize: 1 }));
    const [ckp] = await sys.database.db
      .select()
      .from(agents)
      .where(eq(agents.name, `pool ${pool.id}`));
    expect(ckp).toBeDefined();
    const got = (await (await post(`/v1/pools/${pool.id}/acquire`)).json()) as { agent: Agent };
    expect(got.agent.forkedFrom).toBe(pool.fromCheckpoint);
    expect((await sys.call(`/a/${got.agent.id}/counter`)).status).toBe(200);
  });

  it("lists the tenant's pools; another tenant's do not exist for it; bad input gets the envelope", async () => {
    const ckp = await checkpoint();
    const pool = await createPool({ name: "listed", fromCheckpoint: ckp.id, size: 0, maxSize: 1 });
    const list = (await (await sys.call("/v1/pools")).json()) as { pools: Pool[] };
    expect(list.pools.map((p) => p.id)).toContain(pool.id);
    expect(((await (await sys.call("/v1/pools", { token: other })).json()) as { pools: Pool[] }).pools).toEqual([]);
    expect((await sys.call(`/v1/pools/${pool.id}`, { token: other })).status).toBe(404);
    expect((await post(`/v1/pools/${pool.id}/acquire`, undefined, other)).status).toBe(404);
    expect((await post("/v1/pools", { fromCheckpoint: ckp.id, size: 1 }, other)).status).toBe(404);

    const bad: [unknown, number, string][] = [
      [{ fromCheckpoint: ckp.id }, 400, "size"],
      [{ fromCheckpoint: ckp.id, size: -1 }, 400, "size"],
      [{ fromCheckpoint: ckp.id, size: 1.5 }, 400, "size"],
      [{ fromCheckpoint: ckp.id, size: 101 }, 400, "size"],
      [{ fromCheckpoint: ckp.id, size: 3, maxSize: 2 }, 400, "maxSize"],
      [{ size: 1 }, 400, "fromCheckpoint or image"],
      [{ fromCheckpoint: ckp.id, image: "demo", size: 1 }, 400, "fromCheckpoint or image"],
      [{ fromCheckpoint: ckp.id, size: 1, colour: "red" }, 400, "colour"],
      [{ fromCheckpoint: "nope", size: 1 }, 400, "fromCheckpoint"],
      [{ fromCheckpoint: "ckp_0000000000000000", size: 1 }, 404, "not found"],
      [{ fromCheckpoint: `${ckp.agentId}:no-such-name`, size: 1 }, 404, "no-such-name"],
      [{ name: "listed", fromCheckpoint: ckp.id, size: 1 }, 409, "listed"],
      [[1, 2], 400, "JSON object"],
    ];
    for (const [body, status, says] of bad) {
      const res = await post("/v1/pools", body);
      expect(res.status, JSON.stringify(body)).toBe(status);
      const text = await res.text();
      expect(text, JSON.stringify(body)).toContain(says);
      expect(JSON.parse(text).error.code).toBeTypeOf("string");
    }
    expect((await sys.call("/v1/pools/nope")).status).toBe(400);
    expect((await sys.call("/v1/pools/pol_0000000000000000")).status).toBe(404);
    expect((await post(`/v1/pools/${pool.id}/release`, {})).status).toBe(400);
    expect((await post(`/v1/pools/${pool.id}/release`, { agentId: "nope" })).status).toBe(400);
    const stranger = await sys.createAgent();
    const notMember = await post(`/v1/pools/${pool.id}/release`, { agentId: stranger.id });
    expect(notMember.status).toBe(409);
    // The agents:admin scope: a token without it is refused before anything.
    const invokeOnly = await sys.token({ scopes: ["agents:invoke"] });
    expect((await sys.call("/v1/pools", { token: invokeOnly })).status).toBe(403);
    expect((await post(`/v1/pools/${pool.id}/acquire`, undefined, invokeOnly)).status).toBe(403);
  });
});

describe("agentvm pools, agentvm reset", () => {
  let home: string;
  beforeAll(() => {
    home = mkdtempSync(join(tmpdir(), "pools-cli-home-"));
  });
  afterAll(() => rmSync(home, { recursive: true, force: true }));

  const agentvm = (args: string[]) => runAgentvm(args, { url: sys.url, token: sys.demo.token, home });

  it("create → list → get → acquire → reset → release → delete; exhausted and bad flags exit non-zero with the message", async () => {
    const ckp = await checkpoint("cli");
    const created = await agentvm(["pools", "create", "--from-checkpoint", `${ckp.agentId}:cli`, "--size", "1", "--name", "cli-pool"]);
    expect(created.code, created.err).toBe(0);
    const poolId = created.out.trim();
    expect(poolId).toMatch(/^pol_/);
    await filled(await getPool(poolId));
    const list = await agentvm(["pools", "list"]);
    expect(list.code, list.err).toBe(0);
    expect(list.out).toMatch(new RegExp(`${poolId}\\s+cli-pool\\s+${ckp.id}\\s+1\\s+0\\s+0\\s+1\\s+1`));
    const got = JSON.parse((await agentvm(["--json", "pools", "get", poolId])).out) as Pool;
    expect(got).toMatchObject({ id: poolId, ready: 1, inUse: 0 });
    const acquired = await agentvm(["pools", "acquire", poolId]);
    expect(acquired.code, acquired.err).toBe(0);
    const agentId = acquired.out.trim();
    expect(agentId).toMatch(/^agt_/);
    const shown = await agentvm(["agents", "show", agentId]);
    expect(shown.out).toMatch(new RegExp(`^pool\\s+${poolId} \\(in use\\)$`, "m"));
    const resized = await agentvm(["--json", "pools", "resize", poolId, "--size", "1", "--max", "1"]);
    expect(resized.code, resized.err).toBe(0);
    expect(JSON.parse(resized.out)).toMatchObject({ id: poolId, size: 1, maxSize: 1, inUse: 1 });
    const noSizes = await agentvm(["pools", "resize", poolId]);
    expect(noSizes.code).toBe(2);
    expect(noSizes.err).toContain("--size, --max or both");
    const exhausted = await agentvm(["pools", "acquire", poolId, "--wait", "0"]);
    expect(exhausted.code).toBe(1);
    expect(exhausted.err).toContain("every agent handed out");
    const reset = await agentvm(["reset", agentId]);
    expect(reset.code, reset.err).toBe(0);
    expect(reset.out).toContain(`${agentId} reset to ${ckp.id}`);
    const released = await agentvm(["pools", "release", poolId, agentId]);
    expect(released.code, released.err).toBe(0);
    expect(released.out).toContain(`${agentId} ready in ${poolId}`);
    const bad = await agentvm(["pools", "create", "--size", "1"]);
    expect(bad.code).toBe(2);
    expect(bad.err).toContain("--from-checkpoint or --image");
    const gone = await agentvm(["pools", "delete", poolId]);
    expect(gone.code, gone.err).toBe(0);
    expect(gone.out).toBe(`deleted ${poolId}: 1 agents removed, 0 left in use\n`);
  });
});

describe("the pool store on embedded PGlite (the all-in-one npm start)", () => {
  it("hands each ready agent out once to 20 concurrent claims, and reserves no more than maxSize", async () => {
    const database = await openDatabase({ pgliteMemory: true });
    try {
      const { db } = database;
      const store = createPoolStore(db);
      await db.insert(tenants).values({ id: "ten_p", name: "p" });
      const pool = await store.create({ id: newId("pool"), tenantId: "ten_p", name: "p", fromCheckpoint: "ckp_x", size: 5, maxSize: 6 });
      const agent = () => ({ id: newId("agent"), tenantId: "ten_p", name: "p", image: "demo" });
      for (let i = 0; i < 5; i++) {
        const row = await store.reserve(pool.id, agent(), "top-up");
        expect(row?.poolState).toBe("resetting");
        await store.move(row!.id, pool.id, ["resetting"], "ready");
      }
      expect(await store.reserve(pool.id, agent(), "top-up")).toBeUndefined(); // size ready already
      const claims = await Promise.all(Array.from({ length: 20 }, () => store.claimReady(pool.id)));
      const got = claims.filter((c) => c !== undefined);
      expect(got).toHaveLength(5);
      expect(new Set(got.map((c) => c.id)).size).toBe(5);
      const extra = await Promise.all(Array.from({ length: 3 }, () => store.reserve(pool.id, agent(), "acquire")));
      expect(extra.filter((r) => r !== undefined)).toHaveLength(1); // 6 = maxSize
      expect((await store.counts([pool.id])).get(pool.id)).toEqual({ ready: 0, inUse: 6, resetting: 0 });
    } finally {
      await database.close();
    }
  });
});

describe("the pool store on Postgres", () => {
  it("trims a surplus ready agent whose row another transaction holds for a moment (the host writing its state): it waits, never skips it", async () => {
    const { db } = sys.database;
    const store = createPoolStore(db);
    await db.insert(tenants).values({ id: "ten_trim", name: "t" }).onConflictDoNothing();
    const pool = await store.create({ id: newId("pool"), tenantId: "ten_trim", name: "t", fromCheckpoint: "ckp_x", size: 1, maxSize: 1 });
    const row = await store.reserve(pool.id, { id: newId("agent"), tenantId: "ten_trim", name: "t", image: "demo" }, "top-up");
    await store.move(row!.id, pool.id, ["resetting"], "ready");
    await store.resize(pool.id, { size: 0, maxSize: 1 });
    let release!: () => void;
    const held = new Promise<void>((r) => {
      release = r;
    });
    let locked!: () => void;
    const isLocked = new Promise<void>((r) => {
      locked = r;
    });
    const holder = db.transaction(async (tx) => {
      await tx.update(agents).set({ state: "hibernated" }).where(eq(agents.id, row!.id));
      locked();
      await held;
    });
    await isLocked;
    const taken = store.takeSurplus(pool.id);
    await new Promise((r) => setTimeout(r, 200));
    release();
    await holder;
    expect((await taken).map((r) => r.id)).toEqual([row!.id]);
    expect((await store.counts([pool.id])).get(pool.id)?.ready ?? 0).toBe(0);
  });
});

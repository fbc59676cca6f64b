// A warm pool through the whole system (gateway + host + Postgres) on real QEMU VMs: 5 forks of a checkpoint of the demo
// agent whose counter was set; acquire, change the state (the counter, files written with exec and the files API),
// reset (the counter is the checkpoint's again, the files are gone), release,
// acquire again; concurrent acquirers never get the same agent; the 6th acquire of 5 is 409 pool_exhausted.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { QemuDriver } from "../../fleet-agent/drivers/qemu/driver.ts";
import { makeDriver } from "../helpers/qemu.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";

let sys: TestSystem;
let driver: QemuDriver;
const json = { "content-type": "application/json" };

interface Acquired {
  agent: { id: string; forkedFrom: string; pool: { id: string; state: string } };
  pool: string;
  forked: boolean;
}

beforeAll(async () => {
  driver = await makeDriver({ memory: "file" });
  sys = await startSystem({ driver });
}, 60_000);

afterAll(async () => {
  await sys?.stop();
}, 120_000);

const post = (path: string, body?: unknown) => sys.call(path, { method: "POST", headers: json, ...(body !== undefined ? { body: JSON.stringify(body) } : {}) });

async function counter(id: string, method = "GET"): Promise<number> {
  const r = await sys.call(`/a/${id}/counter`, { method });
  expect(r.status, await r.clone().text()).toBe(200);
  return ((await r.json()) as { count: number }).count;
}

async function pool(id: string): Promise<{ ready: number; inUse: number; resetting: number }> {
  return (await (await sys.call(`/v1/pools/${id}`)).json()) as { ready: number; inUse: number; resetting: number };
}

async function acquire(poolId: string): Promise<{ res: Response; ms: number }> {
  const t0 = performance.now();
  const res = await post(`/v1/pools/${poolId}/acquire`);
  return { res, ms: performance.now() - t0 };
}

const p50 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)]!;

describe("a warm pool of QEMU VMs", () => {
  it("5 forks of a checkpoint: acquire, change, reset to the checkpoint, release, acquire again; never one agent twice", async () => {
    // The checkpoint: the demo agent with its counter at 3.
    const { id: source } = await sys.createAgent({ idleTimeoutMs: 600_000, memMiB: 128 });
    for (let i = 0; i < 3; i++) await counter(source, "POST");
    const taken = await post(`/v1/agents/${source}/checkpoints`, { name: "three" });
    expect(taken.status, await taken.clone().text()).toBe(201);
    const ckp = (await taken.json()) as { id: string };
    await post(`/v1/agents/${source}/hibernate`);

    const t0 = performance.now();
    const created = await post("/v1/pools", { name: "episodes", fromCheckpoint: `${source}:three`, size: 5, maxSize: 5 });
    expect(created.status, await created.clone().text()).toBe(201);
    const { id: poolId } = (await created.json()) as { id: string };
    for (let i = 0; ; i++) {
      const p = await pool(poolId);
      if (p.ready === 5) break;
      if (i > 1200) throw new Error(`the pool never filled: ${JSON.stringify(p)}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    const fillMs = performance.now() - t0;

    // An episode: acquire, change the state, reset, the checkpoint's state is back.
    const latencies: number[] = [];
    const first = await acquire(poolId);
    expect(first.res.status, await first.res.clone().text()).toBe(200);
    latencies.push(first.ms);
    const a = ((await first.res.json()) as Acquired).agent;
    expect(a).toMatchObject({ forkedFrom: ckp.id, pool: { id: poolId, state: "in_use" } });
    expect(await counter(a.id, "POST")).toBe(4);
    expect(await counter(a.id, "POST")).toBe(5);
    // The episode also writes a file (exec) and one through the files API: both are gone after the reset.
    const wrote = await post(`/v1/agents/${a.id}/exec`, { cmd: "echo episode > /tmp/episode.txt && cat /tmp/episode.txt" });
    expect(await wrote.json()).toMatchObject({ exitCode: 0, stdout: "episode\n" });
    expect((await sys.call(`/v1/agents/${a.id}/files?path=/tmp/notes.txt`, { method: "PUT", body: "notes" })).status).toBe(201);
    const reset = await post(`/v1/agents/${a.id}/reset`);
    expect(reset.status, await reset.clone().text()).toBe(200);
    const { resetMs } = (await reset.json()) as { resetMs: number };
    const r0 = performance.now();
    const after = await sys.call(`/a/${a.id}/counter`);
    const resetToCallMs = performance.now() - r0 + resetMs;
    expect(await after.json()).toEqual({ count: 3 });
    for (const path of ["/tmp/episode.txt", "/tmp/notes.txt"]) expect((await sys.call(`/v1/agents/${a.id}/files?path=${path}`)).status).toBe(404);
    const listed = await post(`/v1/agents/${a.id}/exec`, { cmd: ["ls", "/tmp"] });
    expect(((await listed.json()) as { stdout: string }).stdout).not.toContain("episode");
    const wakeTiming = `${after.headers.get("x-wake")}; ${after.headers.get("server-timing")}`;
    expect(await counter(a.id, "POST")).toBe(4);

    // Release: reset again and ready in the pool.
    const released = await post(`/v1/pools/${poolId}/release`, { agentId: a.id });
    expect(released.status, await released.clone().text()).toBe(200);
    expect(((await released.json()) as { agent: { pool: { state: string } } }).agent.pool.state).toBe("ready");
    expect(await pool(poolId)).toMatchObject({ ready: 5, inUse: 0 });

    // Two acquirers at once, then the rest: six asked for five, every agent handed out once, the sixth refused.
    const pair = await Promise.all([acquire(poolId), acquire(poolId)]);
    const rest = await Promise.all([acquire(poolId), acquire(poolId), acquire(poolId), acquire(poolId)]);
    const all = [...pair, ...rest];
    const ok = all.filter((x) => x.res.status === 200);
    const refused = all.filter((x) => x.res.status === 409);
    expect(ok).toHaveLength(5);
    expect(refused).toHaveLength(1);
    expect(((await refused[0]!.res.json()) as { error: { code: string } }).error.code).toBe("pool_exhausted");
    const agents = await Promise.all(ok.map(async (x) => ((await x.res.json()) as Acquired).agent.id));
    expect(new Set(agents).size).toBe(5);
    expect(agents).toContain(a.id);
    latencies.push(...ok.map((x) => x.ms));
    // Each starts from the checkpoint: the released one was reset, the others never ran.
    for (const id of agents) expect(await counter(id)).toBe(3);

    for (const id of agents) expect((await post(`/v1/pools/${poolId}/release`, { agentId: id })).status).toBe(200);
    expect(await pool(poolId)).toMatchObject({ ready: 5, inUse: 0 });
    const deleted = await sys.call(`/v1/pools/${poolId}`, { method: "DELETE" });
    expect(await deleted.json()).toMatchObject({ deleted: true, removed: 5, leftInUse: 0 });

    console.log(
      `RESULT pool-e2e: fill 5 ${Math.round(fillMs)} ms; acquire p50 ${p50(latencies).toFixed(1)} ms (n=${latencies.length}, max ${Math.max(...latencies).toFixed(1)}); reset ${resetMs} ms; reset to the next call's answer ${Math.round(resetToCallMs)} ms (its wake: ${wakeTiming})`,
    );
  }, 600_000);

  it("a pool made from an image: its agent booted and checkpointed, the pool's forks answer from that state", async () => {
    const created = await post("/v1/pools", { name: "from-image", image: "demo", size: 1, maxSize: 2 });
    expect(created.status, await created.clone().text()).toBe(201);
    const p = (await created.json()) as { id: string; fromCheckpoint: string };
    const got = await post(`/v1/pools/${p.id}/acquire`);
    expect(got.status, await got.clone().text()).toBe(200);
    const { agent } = (await got.json()) as Acquired;
    expect(agent.forkedFrom).toBe(p.fromCheckpoint);
    expect(await counter(agent.id, "POST")).toBe(1); // the image's fresh workload, then this call
    expect((await post(`/v1/agents/${agent.id}/reset`)).status).toBe(200);
    expect(await counter(agent.id)).toBe(0);
  }, 300_000);
});

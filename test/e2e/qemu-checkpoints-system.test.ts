// Checkpoints and templates through the whole system (gateway + host + Postgres) on real QEMU VMs with file-backed
// RAM: 50 calls to a hibernated agent wake it once; a checkpoint taken through the API, the agent changed, restored,
// forked twice (each independent, the checkpoint unchanged); one the workload asks for from inside; a new agent of an
// image with a template starts as a clone.
import { and, eq } from "drizzle-orm";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { vmEvents } from "../../schema/core.ts";
import type { QemuDriver } from "../../fleet-agent/drivers/qemu/driver.ts";
import { makeDriver } from "../helpers/qemu.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";

let sys: TestSystem;
let driver: QemuDriver;
const root = mkdtempSync(join(tmpdir(), "qemu-sys-tpl-"));
const json = { "content-type": "application/json" };

beforeAll(async () => {
  driver = await makeDriver({ memory: "file", templates: { root } });
  sys = await startSystem({ driver });
}, 60_000);

afterAll(async () => {
  await driver?.templates?.settle();
  await sys?.stop();
  rmSync(root, { recursive: true, force: true });
}, 60_000);

const counter = async (id: string, method = "GET") => {
  const r = await sys.call(`/a/${id}/counter`, { method });
  expect(r.status).toBe(200);
  return ((await r.json()) as { count: number }).count;
};

async function running(agentId: string) {
  await sys.host.flush();
  return sys.database.db
    .select()
    .from(vmEvents)
    .where(and(eq(vmEvents.agentId, agentId), eq(vmEvents.toState, "running")));
}

describe("qemu checkpoints and templates behind the gateway (file-backed RAM)", () => {
  it("50 concurrent calls to a hibernated file-backed agent: one restore, every count exact", async () => {
    const { id } = await sys.createAgent({ idleTimeoutMs: 600_000 });
    expect(await counter(id, "POST")).toBe(1);
    expect(await (await sys.call(`/v1/agents/${id}/hibernate`, { method: "POST" })).json()).toMatchObject({ state: "hibernated" });
    const results = await Promise.all(
      Array.from({ length: 50 }, () =>
        sys
          .call(`/a/${id}/counter`, { method: "POST" })
          .then(async (r) => ({ status: r.status, wake: r.headers.get("x-wake"), count: ((await r.json()) as { count: number }).count })),
      ),
    );
    expect(results.every((r) => r.status === 200 && r.wake === "restore")).toBe(true);
    expect(new Set(results.map((r) => r.count))).toEqual(new Set(Array.from({ length: 50 }, (_, i) => i + 2)));
    expect((await running(id)).filter((e) => e.fromState === "restoring")).toHaveLength(1);
  }, 180_000);

  it("a checkpoint through the API: the agent changed, restored to it, forked twice; one asked for from inside", async () => {
    const { id } = await sys.createAgent({ idleTimeoutMs: 600_000 });
    for (let i = 0; i < 3; i++) await counter(id, "POST");
    const taken = await sys.call(`/v1/agents/${id}/checkpoints`, { method: "POST", headers: json, body: JSON.stringify({ name: "three" }) });
    expect(taken.status).toBe(201);
    const ckp = (await taken.json()) as { id: string; bytes: number; pausedMs: number; origin: string };
    expect(ckp).toMatchObject({ origin: "api" });
    expect(ckp.bytes).toBeGreaterThan(256 * 1024 * 1024); // device state + the RAM file
    expect(await counter(id, "POST")).toBe(4);

    const restored = await sys.call(`/v1/agents/${id}/restore`, { method: "POST", headers: json, body: JSON.stringify({ checkpoint: "three" }) });
    expect(restored.status, await restored.clone().text()).toBe(200);
    const back = await sys.call(`/a/${id}/counter`);
    expect(await back.json()).toEqual({ count: 3 });
    // An older state placed on purpose, newer than the run it replaced: restored with no rollback to tell.
    expect(back.headers.get("x-wake")).toBe("restore");
    expect(back.headers.get("x-wake-rollback")).toBeNull();

    const forks: string[] = [];
    for (let i = 0; i < 2; i++) {
      const res = await sys.call("/v1/agents", { method: "POST", headers: json, body: JSON.stringify({ fromCheckpoint: ckp.id }) });
      expect(res.status, await res.clone().text()).toBe(201);
      const fork = (await res.json()) as { id: string; forkedFrom: string; state: string };
      expect(fork).toMatchObject({ forkedFrom: ckp.id, state: "hibernated" });
      forks.push(fork.id);
    }
    const [f1, f2] = forks as [string, string];
    const first = await sys.call(`/a/${f1}/counter`, { method: "POST" });
    expect(first.headers.get("x-wake")).toBe("restore");
    expect(await first.json()).toEqual({ count: 4 });
    expect(await counter(f1, "POST")).toBe(5);
    expect(await counter(f2, "POST")).toBe(4);
    expect(await counter(id)).toBe(3);
    const identity = await (await sys.call(`/a/${f2}/identity`)).text();
    expect(identity).toContain(`agentId=${f2}\n`);
    expect(identity).toContain(`clonedFrom=${ckp.id}\n`);
    const again = (await (await sys.call(`/v1/agents/${id}/checkpoints/${ckp.id}`)).json()) as { bytes: number };
    expect(again.bytes).toBe(ckp.bytes);

    // From inside: the workload asks, the host takes it at its next look (origin guest).
    expect((await sys.call(`/a/${f1}/checkpoint?name=episode-1`, { method: "POST" })).status).toBe(202);
    let inside: { name: string; origin: string } | undefined;
    for (let i = 0; i < 200 && !inside; i++) {
      const list = (await (await sys.call(`/v1/agents/${f1}/checkpoints`)).json()) as { checkpoints: { name: string; origin: string }[] };
      inside = list.checkpoints.find((c) => c.name === "episode-1");
      if (!inside) await new Promise((r) => setTimeout(r, 100));
    }
    expect(inside).toMatchObject({ origin: "guest" });
  }, 300_000);

  it("a new agent of an image whose template is ready starts as a clone of it", async () => {
    await driver.templates!.settle(); // the first cold boot of this kind built one
    expect((await driver.templates!.list()).some((t) => t.state === "ready" && t.image === "demo")).toBe(true);
    const { id } = await sys.createAgent({ idleTimeoutMs: 600_000 });
    const res = await sys.call(`/a/${id}/counter`, { method: "POST" });
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ count: 1 }); // the template's fresh workload, then this call
    expect(await (await sys.call(`/a/${id}/identity`)).text()).toContain(`agentId=${id}\n`);
  }, 180_000);
});

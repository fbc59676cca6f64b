// An agent's call through an upstream on a real QEMU VM under TCG, through the whole system: the agent (no egress)
// reaches its tenant's upstream at the proxy, the host adds the secret and records the call; restored to a checkpoint
// taken before it, the agent makes the same call with the same Idempotency-Key and gets the recorded answer while the
// model sees no second call; without a key the call is made again.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseEgressConfig } from "../../fleet-agent/egress/config.ts";
import { LateExchangeObserver } from "../../fleet-agent/egress/exchanges.ts";
import { EgressProxy } from "../../fleet-agent/egress/proxy.ts";
import { UpstreamSlot } from "../../fleet-agent/egress/upstreams.ts";
import { SlowModel } from "../../scripts/bench/slow-model.ts";
import { makeDriver } from "../helpers/qemu.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";
import { waitFor } from "../helpers/wait.ts";

const json = { "content-type": "application/json" };
let model: SlowModel;
let sys: TestSystem;

beforeAll(async () => {
  model = await SlowModel.start({ firstByteMs: 0, tokens: 2, gapMs: 10 });
  const config = parseEgressConfig({ EGRESS_ALLOW: `127.0.0.1:${model.port}` });
  const exchanges = new LateExchangeObserver();
  const slot = new UpstreamSlot();
  const egress = new EgressProxy(config, { exchanges, upstreams: slot });
  const driver = await makeDriver({ egress });
  sys = await startSystem({ driver, exchanges, upstreams: { slot, config: config.upstreams, destination: (h, p) => egress.destination(h, p) } });
}, 120_000);

afterAll(async () => {
  await sys?.stop();
  await model?.close();
});

/** The agent's `/fetch` of `/u/model/<path>` at the proxy (origin form: the guest has no HTTP_PROXY without egress). */
async function callModel(agentId: string, path: string, key?: string): Promise<{ status: number; body: string }> {
  const url = `http://10.0.2.100:3128/u/model${path}`;
  const res = await sys.call(`/a/${agentId}/fetch?url=${url}${key ? `&key=${key}` : ""}`);
  return { status: res.status, body: await res.text() };
}

describe("calls through an upstream from a real VM", () => {
  it("are recorded once and replayed by Idempotency-Key after a restore to a checkpoint taken before them", async () => {
    const created = await sys.call("/v1/upstreams", {
      method: "POST",
      headers: json,
      body: JSON.stringify({ name: "model", baseUrl: `http://127.0.0.1:${model.port}`, headers: { Authorization: "Bearer sk-never-in-the-guest" } }),
    });
    expect(created.status, await created.clone().text()).toBe(201);
    const { id } = await sys.createAgent({ idleTimeoutMs: 600_000, allowEgress: false });
    expect((await sys.call(`/a/${id}/counter`, { method: "POST" })).status).toBe(200);
    const taken = await sys.call(`/v1/agents/${id}/checkpoints`, { method: "POST", headers: json, body: JSON.stringify({ name: "before-call" }) });
    expect(taken.status, await taken.clone().text()).toBe(201);

    const first = await callModel(id, "/slow/0/2/10", "turn-1");
    expect(first.status, first.body).toBe(200);
    expect(first.body).toContain("[DONE]");
    expect(first.body).not.toContain("sk-never-in-the-guest");
    expect(model.calls).toHaveLength(1);

    const restored = await sys.call(`/v1/agents/${id}/restore`, { method: "POST", headers: json, body: JSON.stringify({ checkpoint: "before-call" }) });
    expect(restored.status, await restored.clone().text()).toBe(200);
    expect(await (await sys.call(`/a/${id}/counter`)).json()).toEqual({ count: 1 }); // the guest is back before the call

    const again = await callModel(id, "/slow/0/2/10", "turn-1");
    expect(again.status, again.body).toBe(200);
    expect(again.body).toBe(first.body); // the recorded answer, byte for byte
    expect(model.calls).toHaveLength(1); // the side effect happened once

    const unkeyed = await callModel(id, "/slow/0/2/10");
    expect(unkeyed.status).toBe(200);
    expect(model.calls).toHaveLength(2);

    type Ops = { operations: { upstream: string; state: string; status: number; idempotencyKey: string | null }[] };
    const operations = async () => ((await (await sys.call(`/v1/agents/${id}/operations`)).json()) as Ops).operations;
    await waitFor(async () => (await operations()).every((o) => o.state !== "in_flight"), 10_000); // each row ends just after its answer
    const ops = { operations: await operations() };
    expect(ops.operations.map((o) => [o.upstream, o.state, o.status, o.idempotencyKey]).sort()).toEqual([
      ["model", "succeeded", 200, null],
      ["model", "succeeded", 200, "turn-1"],
    ]);
  }, 240_000);
});

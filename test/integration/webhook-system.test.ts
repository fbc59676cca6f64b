// The whole system in-process (Postgres, host with the process driver, real sockets): webhooks wake hibernated agents.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { and, eq, inArray } from "drizzle-orm";
import { vmEvents } from "../../schema/core.ts";
import { webhookAttempts, webhookDeliveries } from "../../schema/webhooks.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";
import { standardHeaders } from "../helpers/webhook-fixtures.ts";

let sys: TestSystem;

// The all-in-one mounts the webhook routes and runs the delivery worker: everything goes through the real gateway.
beforeAll(async () => {
  sys = await startSystem({ env: { WEBHOOK_POLL_INTERVAL_MS: "200" } });
});
afterAll(async () => {
  await sys?.stop();
});

async function runningTransitions(agentId: string) {
  await sys.host.flush();
  return sys.database.db
    .select()
    .from(vmEvents)
    .where(and(eq(vmEvents.agentId, agentId), eq(vmEvents.toState, "running")));
}

async function counter(agentId: string): Promise<number> {
  return ((await (await sys.call(`/a/${agentId}/counter`)).json()) as { count: number }).count;
}

async function hibernatedAgentWithEndpoint(): Promise<{ agentId: string; secret: string; hook: string }> {
  const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
  expect((await sys.call(`/a/${agent.id}/`)).status).toBe(200);
  expect(await (await sys.call(`/v1/agents/${agent.id}/hibernate`, { method: "POST" })).json()).toMatchObject({ state: "hibernated" });
  const res = await sys.call(`/v1/agents/${agent.id}/webhooks`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ name: "tick", scheme: "standard", path: "/counter" }),
  });
  expect(res.status).toBe(201);
  return { agentId: agent.id, secret: ((await res.json()) as { secret: string }).secret, hook: `/hooks/${agent.id}/tick` };
}

async function send(hook: string, secret: string, body: string): Promise<string> {
  const headers = await standardHeaders(secret, body, { timestampS: Math.floor(Date.now() / 1000) });
  const res = await sys.call(hook, { method: "POST", headers, body, token: "" });
  expect(res.status).toBe(202);
  return ((await res.json()) as { deliveryId: string }).deliveryId;
}

async function allDelivered(ids: string[], timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const rows = await sys.database.db.select({ status: webhookDeliveries.status }).from(webhookDeliveries).where(inArray(webhookDeliveries.id, ids));
    if (rows.length === ids.length && rows.every((r) => r.status === "delivered")) return;
    if (Date.now() > deadline) throw new Error(`not delivered in time: ${rows.map((r) => r.status).join(",")}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe("webhook → wake → deliver, whole system", () => {
  it("a webhook to a hibernated agent wakes it with reason webhook and is delivered once", async () => {
    const { agentId, secret, hook } = await hibernatedAgentWithEndpoint();
    expect((await runningTransitions(agentId)).map((e) => e.reason)).toEqual(["request"]);

    const deliveryId = await send(hook, secret, '{"tick":1}');
    await allDelivered([deliveryId]);
    const wakes = await runningTransitions(agentId);
    expect(wakes.map((e) => e.reason)).toEqual(["request", "webhook"]);
    expect(await counter(agentId)).toBe(1); // POSTed exactly once
    const attempts = await sys.database.db.select().from(webhookAttempts).where(eq(webhookAttempts.deliveryId, deliveryId));
    expect(attempts.map((a) => [a.outcome, a.statusCode])).toEqual([["ok", 200]]);
  });

  it("20 webhooks arriving together cause one wake, and each is delivered once", async () => {
    const { agentId, secret, hook } = await hibernatedAgentWithEndpoint();
    const ids = await Promise.all(Array.from({ length: 20 }, (_, i) => send(hook, secret, `{"tick":${i}}`)));
    expect(new Set(ids).size).toBe(20);
    await allDelivered(ids);
    const wakes = await runningTransitions(agentId);
    expect(wakes.map((e) => e.reason)).toEqual(["request", "webhook"]);
    expect(await counter(agentId)).toBe(20);
    const attempts = await sys.database.db.select().from(webhookAttempts).where(inArray(webhookAttempts.deliveryId, ids));
    expect(attempts).toHaveLength(20);
    expect(attempts.every((a) => a.outcome === "ok")).toBe(true);
  });
});

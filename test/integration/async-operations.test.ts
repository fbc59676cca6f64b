// Async upstream calls on real Postgres and real HTTP: queued, claimed, retried only where safe, taken over after a lost host, settled with their delivery, delivered to the agent by the webhook worker.
import { afterEach, describe, expect, it } from "vitest";
import { eq } from "drizzle-orm";
import { ManualClock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import { silentLogger } from "../../lib/log.ts";
import type { Db } from "../../schema/db.ts";
import { operations } from "../../schema/operations.ts";
import { webhookDeliveries } from "../../schema/webhooks.ts";
import { createWebhookRoutes } from "../../gateway/webhooks/routes.ts";
import { createDeliveryWorker } from "../../gateway/webhooks/worker.ts";
import { defaultWebhookConfig } from "../../gateway/webhooks/types.ts";
import { createDbAsyncOperationStore, type AsyncOperationStore, type NewAsyncOperation } from "../../fleet-agent/operations/async-store.ts";
import { AsyncOperationRunner, type AsyncCall, type AsyncRunnerConfig } from "../../fleet-agent/operations/async-runner.ts";
import { freshDatabase } from "../helpers/db.ts";
import { caller, fetchForward, seedAgent, startAgentServer, withTestAuth, type AgentServer } from "../helpers/webhook-fixtures.ts";

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

const config: AsyncRunnerConfig = {
  pollIntervalMs: 1000,
  leaseMs: 30_000,
  concurrency: 4,
  maxAttempts: 3,
  backoff: { backoffBaseMs: 1000, backoffMaxMs: 10_000 },
};

async function setup() {
  const database = await freshDatabase({ maxConnections: 8 });
  closers.push(() => database.close());
  const db: Db = database.db;
  const clock = new ManualClock(Date.UTC(2026, 11, 5));
  const agent = await seedAgent(db);
  const store = createDbAsyncOperationStore(db);
  const model = await startAgentServer([{ status: 200, headers: { "content-type": "application/json" }, body: '{"answer":42}' }]);
  closers.push(() => model.close());
  return { db, clock, agent, store, model };
}

function newOp(agent: { tenantId: string; agentId: string }, clock: ManualClock, over: Partial<NewAsyncOperation> = {}): NewAsyncOperation {
  return {
    tenantId: agent.tenantId,
    agentId: agent.agentId,
    runId: null,
    hostId: "host_test",
    upstream: "model",
    method: "POST",
    path: "/v1/chat",
    requestHash: "h1",
    idempotencyKey: null,
    requestHeaders: [["content-type", "application/json"]],
    requestBody: null,
    requestBytes: 0,
    deadlineAt: new Date(clock.now() + 3600_000),
    createdAt: new Date(clock.now()),
    ...over,
  };
}

/** The call the host makes, over real HTTP to `model` (the body store is not this test's concern). */
function httpCall(model: AgentServer, clock: ManualClock): AsyncCall {
  return async (op, signal) => {
    const sentAt = new Date(clock.now());
    const res = await fetch(model.url + op.path, { method: op.method, headers: op.requestHeaders ?? [], body: op.method === "GET" ? null : "{}", signal });
    const body = new Uint8Array(await res.arrayBuffer());
    const headers: [string, string][] = [];
    res.headers.forEach((v, k) => headers.push([k, v]));
    const at = new Date(clock.now());
    return { status: res.status, headers, body, responseBody: null, sentAt, firstByteAt: at, endedAt: at, model: null, inputTokens: null, outputTokens: null };
  };
}

function runner(store: AsyncOperationStore, call: AsyncCall, clock: ManualClock, id: string) {
  return new AsyncOperationRunner({ store, call, clock, log: silentLogger, config, random: () => 0.5 }, id);
}

async function row(db: Db, id: string) {
  return (await db.select().from(operations).where(eq(operations.id, id)))[0]!;
}

describe("async operations", () => {
  it("a queued call is made, its outcome committed with a delivery, and the webhook worker posts it to the agent's callback path", async () => {
    const { db, clock, agent, store, model } = await setup();
    const { row: queued } = await store.enqueue(newOp(agent, clock));
    expect(queued.state).toBe("queued");
    expect(await runner(store, httpCall(model, clock), clock, "opw_a").runOnce()).toBe(1);
    expect(model.seen).toHaveLength(1);
    const done = await row(db, queued.id);
    expect(done).toMatchObject({ state: "succeeded", status: 200, attempts: 1, claimedBy: null });
    expect(done.deliveryId).toBeTruthy();

    // The agent's side: the gateway's webhook worker wakes it and posts the outcome to /.agentvm/operations/<id>.
    const agentServer = await startAgentServer([200]);
    closers.push(() => agentServer.close());
    const worker = createDeliveryWorker({
      db,
      clock,
      log: silentLogger,
      forward: fetchForward(agentServer.url),
      config: defaultWebhookConfig,
      random: () => 0.5,
    });
    expect(await worker.runOnce()).toBe(1);
    expect(agentServer.seen).toHaveLength(1);
    const got = agentServer.seen[0]!;
    expect(got.url).toBe(`/.agentvm/operations/${queued.id}`);
    expect(got.headers["x-agentvm-operation-id"]).toBe(queued.id);
    expect(got.headers["x-agentvm-operation-status"]).toBe("200");
    expect(new TextDecoder().decode(got.body)).toBe('{"answer":42}');
    const read = await store.read(agent.agentId, queued.id);
    expect(read?.outcome?.deliveredAt).toBeInstanceOf(Date);
  });

  it("the hidden endpoint takes no intake and is not listed", async () => {
    const { db, clock, agent, store, model } = await setup();
    const { row: queued } = await store.enqueue(newOp(agent, clock));
    await runner(store, httpCall(model, clock), clock, "opw_a").runOnce();
    expect((await row(db, queued.id)).state).toBe("succeeded");
    const app = withTestAuth(createWebhookRoutes({ db, clock, log: silentLogger, forward: fetchForward(model.url), config: defaultWebhookConfig }), {
      admin: caller(agent.tenantId),
    });
    const intake = await app.request(`/hooks/${agent.agentId}/.operations`, { method: "POST", body: "{}" });
    expect(intake.status).toBe(404);
    const list = await app.request(`/v1/agents/${agent.agentId}/webhooks`, { headers: { authorization: "Bearer admin" } });
    expect(list.status).toBe(200);
    expect(((await list.json()) as { endpoints: unknown[] }).endpoints).toEqual([]);
  });

  it("a POST whose host was lost mid-call is not repeated: it fails as interrupted, and the agent is told", async () => {
    const { db, clock, agent, store, model } = await setup();
    const { row: queued } = await store.enqueue(newOp(agent, clock));
    // Host A claims the call and dies before recording anything.
    expect(await store.claimDue({ now: new Date(clock.now()), limit: 1, leaseMs: config.leaseMs, workerId: "opw_dead" })).toHaveLength(1);
    const b = runner(store, httpCall(model, clock), clock, "opw_b");
    expect(await b.runOnce()).toBe(0); // the lease still holds
    clock.advance(config.leaseMs + 1);
    expect(await b.runOnce()).toBe(1);
    expect(model.seen).toHaveLength(0);
    const done = await row(db, queued.id);
    expect(done.state).toBe("failed");
    expect(done.error?.message).toMatch(/interrupted/);
    const delivery = (await db.select().from(webhookDeliveries).where(eq(webhookDeliveries.externalId, queued.id)))[0]!;
    expect(JSON.parse(new TextDecoder().decode(delivery.body)).error.operationId).toBe(queued.id);
  });

  it("a call with an Idempotency-Key whose host was lost is made again by another host", async () => {
    const { db, clock, agent, store, model } = await setup();
    const { row: queued } = await store.enqueue(newOp(agent, clock, { idempotencyKey: "k-1" }));
    await store.claimDue({ now: new Date(clock.now()), limit: 1, leaseMs: config.leaseMs, workerId: "opw_dead" });
    clock.advance(config.leaseMs + 1);
    expect(await runner(store, httpCall(model, clock), clock, "opw_b").runOnce()).toBe(1);
    expect(model.seen).toHaveLength(1);
    expect(await row(db, queued.id)).toMatchObject({ state: "succeeded", status: 200, attempts: 2 });
  });

  it("a transient answer is retried with backoff where a repeat is safe, and settled after the last attempt", async () => {
    const { db, clock, agent, store } = await setup();
    const flaky = await startAgentServer([503, 503, 503]);
    closers.push(() => flaky.close());
    const { row: queued } = await store.enqueue(newOp(agent, clock, { method: "GET" }));
    const r = runner(store, httpCall(flaky, clock), clock, "opw_a");
    expect(await r.runOnce()).toBe(1);
    expect((await row(db, queued.id)).state).toBe("queued");
    expect(await r.runOnce()).toBe(0); // not due before its backoff
    clock.advance(1000);
    expect(await r.runOnce()).toBe(1);
    clock.advance(2000);
    expect(await r.runOnce()).toBe(1);
    expect(flaky.seen).toHaveLength(3);
    expect(await row(db, queued.id)).toMatchObject({ state: "succeeded", status: 503, attempts: 3 });
  });

  it("a POST without a key is made once even when it fails; a deadline that passes fails the call", async () => {
    const { db, clock, agent, store } = await setup();
    const down = await startAgentServer([503]);
    closers.push(() => down.close());
    const { row: post } = await store.enqueue(newOp(agent, clock));
    const r = runner(store, httpCall(down, clock), clock, "opw_a");
    await r.runOnce();
    expect(down.seen).toHaveLength(1);
    expect(await row(db, post.id)).toMatchObject({ state: "succeeded", status: 503, attempts: 1 });

    const { row: late } = await store.enqueue(newOp(agent, clock, { method: "GET", deadlineAt: new Date(clock.now() + 10) }));
    clock.advance(20);
    await r.runOnce();
    expect(down.seen).toHaveLength(1);
    expect(await row(db, late.id)).toMatchObject({ state: "failed", error: { code: "gateway_timeout" } });
  });

  it("a call that hangs past the deadline is aborted and fails", async () => {
    const { db, clock, agent, store } = await setup();
    const { row: queued } = await store.enqueue(newOp(agent, clock, { method: "GET", deadlineAt: new Date(clock.now() + 5000) }));
    const hang: AsyncCall = (_op, signal) =>
      new Promise((_resolve, reject) =>
        signal.addEventListener("abort", () => reject(signal.reason instanceof AppError ? signal.reason : new Error("aborted"))),
      );
    const r = runner(store, hang, clock, "opw_a");
    const run = r.runOnce();
    await new Promise((res) => setTimeout(res, 50));
    clock.advance(5000);
    await run;
    expect(await row(db, queued.id)).toMatchObject({ state: "failed", error: { code: "gateway_timeout" } });
  });

  it("the same Idempotency-Key queues once", async () => {
    const { clock, agent, store } = await setup();
    const first = await store.enqueue(newOp(agent, clock, { idempotencyKey: "same" }));
    const second = await store.enqueue(newOp(agent, clock, { idempotencyKey: "same", requestHash: "other" }));
    expect(first.queued).toBe(true);
    expect(second).toMatchObject({ queued: false, row: { id: first.row.id, requestHash: "h1" } });
  });
});

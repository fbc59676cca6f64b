// Delivery of stored webhooks to a real upstream over HTTP: retries with backoff, dead letters, leases, SKIP LOCKED, redelivery.
import { afterEach, describe, expect, it } from "vitest";
import { and, eq } from "drizzle-orm";
import { ManualClock, systemClock, type Clock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import { silentLogger } from "../../lib/log.ts";
import { openDatabase } from "../../schema/db.ts";
import { auditLog } from "../../schema/core.ts";
import { webhookAttempts, webhookDeliveries } from "../../schema/webhooks.ts";
import type { Db } from "../../schema/db.ts";
import { createWebhookModule } from "../../gateway/webhooks/index.ts";
import { createWebhookRoutes } from "../../gateway/webhooks/routes.ts";
import { createDeliveryWorker } from "../../gateway/webhooks/worker.ts";
import { createDbWebhookStore } from "../../gateway/webhooks/store.ts";
import { createDbAuditLog } from "../../schema/audit-log.ts";
import { defaultWebhookConfig, type WebhookConfig, type WebhookDeps } from "../../gateway/webhooks/types.ts";
import { freshDatabase } from "../helpers/db.ts";
import {
  caller,
  deleteAgent,
  fetchForward,
  seedAgent,
  seedEndpoint,
  standardHeaders,
  startAgentServer,
  withTestAuth,
  type AgentServer,
} from "../helpers/webhook-fixtures.ts";

const servers: AgentServer[] = [];
const databases: { close(): Promise<void> }[] = [];

afterEach(async () => {
  for (const s of servers.splice(0)) await s.close();
  for (const d of databases.splice(0)) await d.close();
});

const config: WebhookConfig = { ...defaultWebhookConfig, backoffBaseMs: 1_000, backoffMaxMs: 60_000, maxAttempts: 3, attemptTimeoutMs: 5_000, leaseMs: 30_000 };

async function agentServer(script: AgentServer["script"]): Promise<AgentServer> {
  const s = await startAgentServer(script);
  servers.push(s);
  return s;
}

/** Each test its own database: a worker claims every due delivery in it, whoever stored them. */
async function testDb(): Promise<Db> {
  const database = await freshDatabase({ maxConnections: 8 });
  databases.push(database);
  return database.db;
}

/** An agent, an endpoint, routes and a worker over `upstream`, able to receive a webhook. */
async function setup(opts: {
  upstream: AgentServer;
  clock?: Clock;
  config?: Partial<WebhookConfig>;
  forward?: WebhookDeps["forward"];
  body?: string;
  db?: Db;
}) {
  const db = opts.db ?? (await testDb());
  const clock = opts.clock ?? new ManualClock(Date.UTC(2026, 3, 1));
  const agent = await seedAgent(db);
  const endpoint = await seedEndpoint(db, agent, { path: "/inbox?from=webhook" });
  const deps: WebhookDeps = {
    db,
    clock,
    log: silentLogger,
    forward: opts.forward ?? fetchForward(opts.upstream.url),
    config: { ...config, ...opts.config },
    random: () => 0.5,
  };
  const app = withTestAuth(createWebhookRoutes(deps), { admin: caller(agent.tenantId) });
  const send = async (body = opts.body ?? '{"event":"ping"}', id?: string) => {
    const headers = await standardHeaders(endpoint.secret, body, { timestampS: Math.floor(clock.now() / 1000), ...(id ? { id } : {}) });
    const res = await app.request(`/hooks/${agent.agentId}/${endpoint.name}`, { method: "POST", headers, body });
    expect(res.status).toBe(202);
    return { deliveryId: ((await res.json()) as { deliveryId: string }).deliveryId, headers };
  };
  return { db, clock, agent, endpoint, deps, app, send, worker: createDeliveryWorker(deps) };
}

async function delivery(db: Db, id: string) {
  const [row] = await db.select().from(webhookDeliveries).where(eq(webhookDeliveries.id, id));
  return row!;
}
async function attempts(db: Db, id: string) {
  return db.select().from(webhookAttempts).where(eq(webhookAttempts.deliveryId, id)).orderBy(webhookAttempts.attempt);
}
async function audits(db: Db, id: string) {
  return db.select().from(auditLog).where(eq(auditLog.target, id)).orderBy(auditLog.id);
}

describe("delivery worker", () => {
  it("the agent answering 500 twice then 200: three attempts recorded with backoff, delivered, audited", async () => {
    const upstream = await agentServer([{ status: 500, body: "boom" }, 500, 200]);
    const clock = new ManualClock(Date.UTC(2026, 3, 1));
    const { db, send, worker } = await setup({ upstream, clock, body: '{"order":42}' });
    const { deliveryId, headers } = await send();

    expect(await worker.runOnce()).toBe(1);
    let row = await delivery(db, deliveryId);
    expect(row.status).toBe("pending");
    // random() = 0.5: 75 % of the 1 s step.
    expect(row.nextAttemptAt.getTime() - clock.now()).toBe(750);
    expect(row.lastError).toBe("agent answered 500: boom");
    expect(await worker.runOnce()).toBe(0); // not due yet

    clock.advance(750);
    expect(await worker.runOnce()).toBe(1);
    row = await delivery(db, deliveryId);
    expect(row.nextAttemptAt.getTime() - clock.now()).toBe(1_500); // 75 % of 2 s

    clock.advance(1_500);
    expect(await worker.runOnce()).toBe(1);
    row = await delivery(db, deliveryId);
    expect(row.status).toBe("delivered");
    expect(row.deliveredAt?.getTime()).toBe(clock.now());
    expect(row.attempts).toBe(3);

    const log = await attempts(db, deliveryId);
    expect(log.map((a) => [a.attempt, a.outcome, a.statusCode])).toEqual([
      [1, "http_error", 500],
      [2, "http_error", 500],
      [3, "ok", 200],
    ]);
    for (const a of log) expect(a.durationMs).toBeGreaterThanOrEqual(0);

    // The agent got the original body and signature headers each time, with one delivery id.
    expect(upstream.seen).toHaveLength(3);
    for (const [i, seen] of upstream.seen.entries()) {
      expect(seen.method).toBe("POST");
      expect(seen.url).toBe("/inbox?from=webhook");
      expect(Buffer.from(seen.body).toString()).toBe('{"order":42}');
      expect(seen.headers["webhook-signature"]).toBe(headers["webhook-signature"]);
      expect(seen.headers["webhook-id"]).toBe(headers["webhook-id"]);
      expect(seen.headers["x-webhook-delivery-id"]).toBe(deliveryId);
      expect(seen.headers["x-webhook-attempt"]).toBe(String(i + 1));
      expect(seen.headers["x-request-id"]).toBe(log[i]!.requestId);
    }
    const audit = await audits(db, deliveryId);
    expect(audit.map((a) => a.action)).toEqual(["webhook.delivery.delivered"]);
    expect(audit[0]!.detail).toMatchObject({ attempt: 3, statusCode: 200 });
  });

  it("dead-letters after maxAttempts, then redelivery gives it a fresh budget and it is delivered", async () => {
    const upstream = await agentServer([503]);
    const clock = new ManualClock(Date.UTC(2026, 3, 1));
    const { db, send, worker, app } = await setup({ upstream, clock });
    const { deliveryId } = await send();
    for (let i = 0; i < 3; i++) {
      expect(await worker.runOnce()).toBe(1);
      clock.advance(60_000);
    }
    let row = await delivery(db, deliveryId);
    expect(row.status).toBe("dead");
    expect(row.deadAt).not.toBeNull();
    expect(await worker.runOnce()).toBe(0);
    expect((await audits(db, deliveryId)).map((a) => a.action)).toEqual(["webhook.delivery.dead_lettered"]);

    upstream.script = [200];
    const res = await app.request(`/v1/webhook-deliveries/${deliveryId}/redeliver`, { method: "POST", headers: { authorization: "Bearer admin" } });
    expect(res.status).toBe(202);
    expect(await worker.runOnce()).toBe(1);
    row = await delivery(db, deliveryId);
    expect(row.status).toBe("delivered");
    expect(row.attempts).toBe(4);
    expect((await audits(db, deliveryId)).map((a) => a.action)).toEqual([
      "webhook.delivery.dead_lettered",
      "webhook.delivery.redeliver",
      "webhook.delivery.delivered",
    ]);

    const view = (await (await app.request(`/v1/webhook-deliveries/${deliveryId}`, { headers: { authorization: "Bearer admin" } })).json()) as {
      attempts: { outcome: string; statusCode: number | null }[];
      status: string;
    };
    expect(view.status).toBe("delivered");
    expect(view.attempts.map((a) => a.statusCode)).toEqual([503, 503, 503, 200]);
  });

  it("waits at least what the agent's Retry-After or the gateway's retryAfterS asks", async () => {
    const upstream = await agentServer([{ status: 503, headers: { "retry-after": "45" } }, 200]);
    const clock = new ManualClock(Date.UTC(2026, 3, 1));
    const { db, send, worker } = await setup({ upstream, clock });
    const { deliveryId } = await send();
    await worker.runOnce();
    expect((await delivery(db, deliveryId)).nextAttemptAt.getTime() - clock.now()).toBe(45_000);

    const busy = await setup({
      upstream,
      clock,
      db,
      forward: () => Promise.reject(new AppError("queue_full", "too many requests wait for this agent", { retryAfterS: 30 })),
    });
    const second = await busy.send();
    await busy.worker.runOnce();
    const row = await delivery(db, second.deliveryId);
    expect(row.nextAttemptAt.getTime() - clock.now()).toBe(30_000);
    expect(row.lastError).toBe("queue_full: too many requests wait for this agent");
    expect((await attempts(db, second.deliveryId))[0]).toMatchObject({ outcome: "error", statusCode: null });
  });

  it("a crashed worker's claim expires and another worker delivers it; the late worker cannot overwrite the outcome", async () => {
    const upstream = await agentServer([200]);
    const clock = new ManualClock(Date.UTC(2026, 3, 1));
    const { db, send, worker } = await setup({ upstream, clock });
    const { deliveryId } = await send();

    // Worker "ghost" claims it and is never heard from again.
    const store = createDbWebhookStore(db, createDbAuditLog(db));
    const [ghost] = await store.claimDue({ now: new Date(clock.now()), limit: 10, leaseMs: config.leaseMs, workerId: "ghost" });
    expect(ghost?.delivery.id).toBe(deliveryId);
    expect(await worker.runOnce()).toBe(0); // leased
    clock.advance(config.leaseMs - 1);
    expect(await worker.runOnce()).toBe(0);
    clock.advance(1);
    expect(await worker.runOnce()).toBe(1);
    expect((await delivery(db, deliveryId)).status).toBe("delivered");
    expect((await attempts(db, deliveryId)).map((a) => [a.attempt, a.worker, a.outcome])).toEqual([
      [1, "ghost", "lease_expired"],
      [2, worker.id, "ok"],
    ]);

    const late = await store.recordAttempt(
      ghost!,
      { outcome: "http_error", statusCode: 500, error: "late", durationMs: 1, finishedAt: new Date(clock.now()) },
      { status: "dead" },
      undefined,
    );
    expect(late).toBe(false);
    expect((await delivery(db, deliveryId)).status).toBe("delivered");
    expect(upstream.seen).toHaveLength(1);
  });

  it("two workers sharing the database never claim the same delivery (FOR UPDATE SKIP LOCKED)", async () => {
    const upstream = await agentServer([200]);
    const { db, send, deps } = await setup({ upstream, clock: systemClock, config: { concurrency: 4 } });
    const ids = new Set<string>();
    for (let i = 0; i < 24; i++) ids.add((await send(`{"i":${i}}`)).deliveryId);
    const a = createDeliveryWorker(deps, { workerId: "a" });
    const b = createDeliveryWorker(deps, { workerId: "b" });
    for (;;) {
      const [na, nb] = await Promise.all([a.runOnce(), b.runOnce()]);
      if (na + nb === 0) break;
    }
    const seenIds = upstream.seen.map((s) => String(s.headers["x-webhook-delivery-id"]));
    expect(seenIds.sort()).toEqual([...ids].sort());
    const workers = new Set(
      (
        await db
          .select({ worker: webhookAttempts.worker })
          .from(webhookAttempts)
          .innerJoin(webhookDeliveries, eq(webhookDeliveries.id, webhookAttempts.deliveryId))
          .where(eq(webhookDeliveries.endpointId, (await delivery(db, [...ids][0]!)).endpointId))
      ).map((r) => r.worker),
    );
    expect(workers).toEqual(new Set(["a", "b"]));
  });

  it("an agent that never answers is cut off at the attempt timeout and retried", async () => {
    const upstream = await agentServer(["hang", 200]);
    const { db, send, worker } = await setup({ upstream, clock: systemClock, config: { attemptTimeoutMs: 300, leaseMs: 5_000 } });
    const { deliveryId } = await send();
    const started = Date.now();
    await worker.runOnce();
    expect(Date.now() - started).toBeLessThan(3_000);
    const [first] = await attempts(db, deliveryId);
    expect(first).toMatchObject({ outcome: "error", statusCode: null });
    expect(first!.error).toMatch(/^gateway_timeout: no answer within 300 ms/);
    expect(first!.durationMs).toBeGreaterThanOrEqual(250);
    expect((await delivery(db, deliveryId)).status).toBe("pending");
  });

  it("a delivery for a deleted agent is dead-lettered without calling anything", async () => {
    const upstream = await agentServer([200]);
    const { db, send, worker, agent } = await setup({ upstream });
    const { deliveryId } = await send();
    await deleteAgent(db, agent.agentId);
    await worker.runOnce();
    expect(await delivery(db, deliveryId)).toMatchObject({ status: "dead", lastError: "the agent was deleted" });
    expect(upstream.seen).toHaveLength(0);
  });

  it("started in-process, intake kicks the worker: delivered at once, not at the next poll", async () => {
    const upstream = await agentServer([200]);
    const agentRows = await setup({ upstream, clock: systemClock });
    const module = createWebhookModule({ ...agentRows.deps, config: { ...agentRows.deps.config, pollIntervalMs: 60_000 } });
    module.worker.start();
    try {
      const body = '{"kick":true}';
      const headers = await standardHeaders(agentRows.endpoint.secret, body, { timestampS: Math.floor(Date.now() / 1000) });
      await module.worker.runOnce(); // nothing due; the first poll has passed
      const t0 = Date.now();
      const res = await module.routes.request(`/hooks/${agentRows.agent.agentId}/${agentRows.endpoint.name}`, { method: "POST", headers, body });
      expect(res.status).toBe(202);
      await upstream.received(1, 5_000);
      expect(Date.now() - t0).toBeLessThan(5_000);
      const { deliveryId } = (await res.json()) as { deliveryId: string };
      for (let i = 0; i < 50 && (await delivery(agentRows.db, deliveryId)).status !== "delivered"; i++) await new Promise((r) => setTimeout(r, 20));
      expect((await delivery(agentRows.db, deliveryId)).status).toBe("delivered");
    } finally {
      await module.worker.stop();
    }
  });
});

describe("on embedded PGlite (npm start without DATABASE_URL)", () => {
  it("stores, claims and delivers the same way", async () => {
    const lite = await openDatabase({ pgliteMemory: true });
    try {
      const upstream = await agentServer([500, 200]);
      const clock = new ManualClock(Date.UTC(2026, 3, 1));
      const { db, send, worker } = await setup({ upstream, clock, db: lite.db });
      const { deliveryId } = await send('{"lite":"\u00e9\r\n"}');
      await worker.runOnce();
      clock.advance(60_000);
      await worker.runOnce();
      expect((await delivery(db, deliveryId)).status).toBe("delivered");
      expect(upstream.seen.map((s) => s.headers["x-webhook-delivery-id"])).toEqual([deliveryId, deliveryId]);
      expect(Buffer.from(upstream.seen[1]!.body).toString()).toBe('{"lite":"\u00e9\r\n"}');
      const done = await db
        .select()
        .from(auditLog)
        .where(and(eq(auditLog.target, deliveryId), eq(auditLog.action, "webhook.delivery.delivered")));
      expect(done).toHaveLength(1);
    } finally {
      await lite.close();
    }
  });
});

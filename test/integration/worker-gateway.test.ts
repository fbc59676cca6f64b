// The gateway as a Worker in workerd (wrangler.toml), Postgres through the Hyperdrive binding, a fleet-agent on loopback.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eq, inArray } from "drizzle-orm";
import { generateKeyPair, exportJWK, SignJWT } from "jose";
import WebSocket from "ws";
import { tenants } from "../../schema/core.ts";
import { webhookDeliveries } from "../../schema/webhooks.ts";
import { createDbWebhookStore } from "../../gateway/webhooks/store.ts";
import { createDbAuditLog } from "../../schema/audit-log.ts";
import { freshDatabase } from "../helpers/db.ts";
import { standardHeaders } from "../helpers/webhook-fixtures.ts";
import { startWorker, type WorkerUnderTest } from "../helpers/worker-harness.ts";
import { gzipAgentImage, startHostInProcess, testComponentSecret, waitFor, type InProcessHost } from "../helpers/worker-stack.ts";
import { readEventStream } from "../helpers/streams.ts";
import { FakeCheckpointDriver } from "../helpers/fake-checkpoint-driver.ts";

let database: Awaited<ReturnType<typeof freshDatabase>>;
let host: InProcessHost;
let worker: WorkerUnderTest;
let signingKey: CryptoKey;
const kid = "test-key";

async function userToken(tenant: string, scope = "agents:invoke agents:admin"): Promise<string> {
  return new SignJWT({ tenant, scope })
    .setProtectedHeader({ alg: "ES256", kid })
    .setIssuer("agentvm-test")
    .setAudience("agentvm")
    .setSubject("tester")
    .setIssuedAt()
    .setExpirationTime("1h")
    .sign(signingKey);
}

beforeAll(async () => {
  database = await freshDatabase();
  await database.db.insert(tenants).values([
    { id: "ten_edge", name: "edge" },
    { id: "ten_other", name: "other" },
  ]);
  // The process driver with checkpoints (copies of the VM's directory): forks for the warm pool's test.
  host = await startHostInProcess(database, { driver: new FakeCheckpointDriver({ images: { gzip: gzipAgentImage } }) });
  const pair = await generateKeyPair("ES256");
  signingKey = pair.privateKey;
  const jwk = { ...(await exportJWK(pair.publicKey)), kid, alg: "ES256", use: "sig" };
  worker = await startWorker({
    pgUrl: database.url,
    vars: { JWKS_JSON: JSON.stringify({ keys: [jwk] }), JWT_ISSUER: "agentvm-test", AGENT_IMAGES: "demo,gzip", LOG_LEVEL: "error" },
    secrets: { COMPONENT_SECRET: testComponentSecret },
  });
}, 120_000);

afterAll(async () => {
  await worker?.close();
  await host?.stop();
  await database?.close();
});

async function call(path: string, init: RequestInit & { token?: string } = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  const bearer = init.token ?? (await userToken("ten_edge"));
  if (bearer) headers.set("authorization", `Bearer ${bearer}`);
  return worker.fetch(path, { ...init, headers });
}

async function createAgent(body: Record<string, unknown> = {}): Promise<string> {
  const res = await call("/v1/agents", { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" } });
  expect(res.status, await res.clone().text()).toBe(201);
  return ((await res.json()) as { id: string }).id;
}

async function counter(id: string): Promise<number> {
  return ((await (await call(`/a/${id}/counter`)).json()) as { count: number }).count;
}

describe("gateway Worker in workerd", () => {
  it("answers its health check without waking anything", async () => {
    const res = await worker.fetch("/healthz");
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ ok: true });
  });

  it("an authenticated call wakes a hibernated agent on the host and streams its SSE events back one by one", async () => {
    const id = await createAgent({ idleTimeoutMs: 60_000 });
    const booted = await call(`/a/${id}/counter`, { method: "POST" });
    expect(booted.status).toBe(200);
    expect(booted.headers.get("x-wake")).toBe("boot");
    expect(await booted.json()).toEqual({ count: 1 });
    const hib = await call(`/v1/agents/${id}/hibernate`, { method: "POST" });
    expect(await hib.json()).toMatchObject({ state: "hibernated" });
    expect(host.host.status(id)?.state).toBe("hibernated");

    const res = await call(`/a/${id}/sse?n=5&intervalMs=300`);
    expect(res.status).toBe(200);
    expect(res.headers.get("x-wake")).toBe("restore");
    expect(res.headers.get("server-timing")).toMatch(/restore;dur=/);
    expect(res.headers.get("x-request-id")).toMatch(/^req_/);
    const { text, arrivals } = await readEventStream(res);
    expect(text.match(/^data: /gm)).toHaveLength(5);
    expect(arrivals).toHaveLength(5);
    expect(arrivals[4]! - arrivals[0]!).toBeGreaterThan(900); // streamed, not buffered until the end
    for (let i = 1; i < 5; i++) expect(arrivals[i]! - arrivals[i - 1]!).toBeGreaterThan(150);
    expect(await counter(id)).toBe(1); // same process, restored: its state survived
  });

  it("request bodies stream in, encoded answers come out intact, redirects pass through", async () => {
    const id = await createAgent();
    const body = new Uint8Array(2 * 1024 * 1024).map((_, i) => i % 251);
    const echo = await call(`/a/${id}/echo`, { method: "POST", body, headers: { "content-type": "application/octet-stream" } });
    expect(echo.status).toBe(200);
    const back = new Uint8Array(await echo.arrayBuffer());
    expect(back.byteLength).toBe(body.byteLength);
    expect(back[54321]).toBe(body[54321]);

    const gz = await createAgent({ image: "gzip" });
    const res = await call(`/a/${gz}/`, { headers: { "accept-encoding": "gzip" } });
    expect(res.status).toBe(200);
    expect(await res.text()).toBe("hello ".repeat(1000)); // decoded once by the client: not double-encoded, not mislabelled
    const redirect = await call(`/a/${gz}/redirect`, { redirect: "manual" });
    expect(redirect.status, await redirect.clone().text()).toBe(302);
    expect(redirect.headers.get("location")).toBe("/elsewhere");
  });

  it("refuses a bad token (401) and hides another tenant's agent (404)", async () => {
    const id = await createAgent();
    const bad = await call(`/a/${id}/`, { token: "not.a.token" });
    expect(bad.status).toBe(401);
    expect(((await bad.json()) as { error: { code: string } }).error.code).toBe("unauthorized");
    const none = await call(`/a/${id}/`, { token: "" });
    expect(none.status).toBe(401);
    const other = await call(`/a/${id}/`, { token: await userToken("ten_other") });
    expect(other.status).toBe(404);
    expect(((await other.json()) as { error: { code: string } }).error.code).toBe("not_found");
    expect(host.host.status(id)).toBeUndefined(); // none of these woke it
  });

  it("a webhook is accepted (202) and delivered right after, waking the agent (waitUntil)", async () => {
    const id = await createAgent();
    const created = await call(`/v1/agents/${id}/webhooks`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ name: "tick", scheme: "standard", path: "/counter" }),
    });
    expect(created.status).toBe(201);
    const { secret } = (await created.json()) as { secret: string };
    const body = JSON.stringify({ event: "ping" });
    const res = await worker.fetch(`/hooks/${id}/tick`, {
      method: "POST",
      headers: await standardHeaders(secret, body, { timestampS: Math.floor(Date.now() / 1000) }),
      body,
    });
    expect(res.status).toBe(202);
    const { deliveryId } = (await res.json()) as { deliveryId: string };
    await waitFor(
      async () => {
        const [row] = await database.db.select({ status: webhookDeliveries.status }).from(webhookDeliveries).where(eq(webhookDeliveries.id, deliveryId));
        return row?.status === "delivered";
      },
      15_000,
      "delivery",
    );
    expect(host.host.status(id)?.state).toBe("running");
    expect(await counter(id)).toBe(1); // the delivery POSTed /counter once
  });

  it("a WebSocket passes through the Worker: the upgrade wakes the agent on its host and frames echo both ways", async () => {
    const id = await createAgent({ idleTimeoutMs: 60_000 });
    const token = await userToken("ten_edge");
    const ws = new WebSocket(`${worker.url.replace(/^http/, "ws")}/a/${id}/ws/echo`, { headers: { authorization: `Bearer ${token}` } });
    await new Promise<void>((resolve, reject) => {
      ws.once("open", () => resolve());
      ws.once("unexpected-response", (_req, res) => reject(new Error(`HTTP ${res.statusCode}`)));
      ws.once("error", reject);
    });
    const replies: string[] = [];
    ws.on("message", (data: Buffer) => replies.push(data.toString()));
    ws.send("hello");
    ws.send("edge");
    await waitFor(() => replies.length === 2, 10_000, "two echoes");
    expect(replies).toEqual(["hello", "edge"]);
    expect((await (await call(`/v1/agents/${id}`)).json()) as { state: string }).toMatchObject({ state: "running" });
    ws.close();
    // Another tenant cannot open it: the same 404 as for a call.
    const other = new WebSocket(`${worker.url.replace(/^http/, "ws")}/a/${id}/ws/echo`, {
      headers: { authorization: `Bearer ${await userToken("ten_other")}` },
    });
    const status = await new Promise<number>((resolve) => {
      other.once("unexpected-response", (_req, res) => resolve(res.statusCode ?? 0));
      other.once("open", () => resolve(101));
      other.once("error", () => resolve(-1));
    });
    expect(status).toBe(404);
  });

  it("a warm pool through the Worker: its top-up runs after the answer (waitUntil), acquire hands out a fork, release resets it", async () => {
    const json = { "content-type": "application/json" };
    const id = await createAgent();
    expect(await counter(id)).toBeGreaterThanOrEqual(0);
    const ckp = await call(`/v1/agents/${id}/checkpoints`, { method: "POST", headers: json, body: "{}" });
    expect(ckp.status, await ckp.clone().text()).toBe(201);
    const created = await call("/v1/pools", {
      method: "POST",
      headers: json,
      body: JSON.stringify({ fromCheckpoint: ((await ckp.json()) as { id: string }).id, size: 2 }),
    });
    expect(created.status, await created.clone().text()).toBe(201);
    const pool = (await created.json()) as { id: string };
    await waitFor(async () => ((await (await call(`/v1/pools/${pool.id}`)).json()) as { ready: number }).ready === 2, 20_000, "the pool to fill");
    const got = await call(`/v1/pools/${pool.id}/acquire`, { method: "POST" });
    expect(got.status, await got.clone().text()).toBe(200);
    const agent = ((await got.json()) as { agent: { id: string } }).agent.id;
    expect(await counter(agent)).toBeGreaterThanOrEqual(0);
    const released = await call(`/v1/pools/${pool.id}/release`, { method: "POST", headers: json, body: JSON.stringify({ agentId: agent }) });
    expect(released.status, await released.clone().text()).toBe(200);
    expect(await (await call(`/v1/pools/${pool.id}`)).json()).toMatchObject({ ready: 2, inUse: 0 });
  });

  it("the cron delivers what is due (a delivery stored without a kick)", async () => {
    const id = await createAgent();
    const created = await call(`/v1/agents/${id}/webhooks`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ name: "later", scheme: "standard", path: "/counter" }),
    });
    expect(created.status).toBe(201);
    const store = createDbWebhookStore(database.db, createDbAuditLog(database.db));
    const endpoint = await store.findIntakeEndpoint(id, "later");
    const stored = await store.storeDelivery(
      {
        endpoint: endpoint!,
        externalId: "ext-1",
        headers: [["content-type", "application/json"]],
        body: new TextEncoder().encode("{}"),
        receivedAt: new Date(),
        requestId: null,
      },
      600,
    );
    expect(stored.kind).toBe("stored");
    const deliveryId = (stored as { deliveryId: string }).deliveryId;
    expect(host.host.status(id)).toBeUndefined();
    await worker.cron();
    const rows = await database.db
      .select({ status: webhookDeliveries.status })
      .from(webhookDeliveries)
      .where(inArray(webhookDeliveries.id, [deliveryId]));
    expect(rows[0]?.status).toBe("delivered");
    expect(await counter(id)).toBe(1);
  });
});

describe("a misconfigured Worker", () => {
  it("answers a 500 envelope naming what is missing, and keeps answering", async () => {
    const broken = await startWorker({ pgUrl: database.url, vars: { JWKS_JSON: "", JWKS_URL: "" }, secrets: {} });
    try {
      for (let i = 0; i < 2; i++) {
        const res = await broken.fetch("/healthz");
        expect(res.status).toBe(500);
        const body = (await res.json()) as { error: { code: string; message: string; requestId: string } };
        expect(body.error.code).toBe("internal");
        expect(body.error.message).toMatch(/COMPONENT_SECRET/);
        expect(body.error.message).toMatch(/JWKS_URL or JWKS_JSON/);
        expect(body.error.requestId).toMatch(/^req_/);
      }
    } finally {
      await broken.close();
    }
  });
});

// Webhook intake and admin API against real Postgres, through app.request() and through a real HTTP server.
import { request as httpRequest } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { serve } from "@hono/node-server";
import { and, eq } from "drizzle-orm";
import type { Hono } from "hono";
import { ManualClock } from "../../lib/clock.ts";
import { silentLogger } from "../../lib/log.ts";
import { auditLog } from "../../schema/core.ts";
import { webhookDeliveries } from "../../schema/webhooks.ts";
import type { GatewayEnv } from "../../contracts/caller.ts";
import { createWebhookRoutes } from "../../gateway/webhooks/routes.ts";
import { defaultWebhookConfig, type WebhookDeps } from "../../gateway/webhooks/types.ts";
import { signStandard } from "../../gateway/webhooks/signature.ts";
import { maxAdminBodyBytes } from "../../gateway/webhooks/api-schemas.ts";
import { encodeCursor } from "../../lib/api.ts";
import { freshDatabase } from "../helpers/db.ts";
import { caller, githubHeaders, seedAgent, seedEndpoint, standardHeaders, withTestAuth } from "../helpers/webhook-fixtures.ts";

type Db = Awaited<ReturnType<typeof freshDatabase>>;

let database: Db;
let app: Hono<GatewayEnv>;
let agent: { tenantId: string; agentId: string };
let other: { tenantId: string; agentId: string };
const clock = new ManualClock(Date.UTC(2026, 2, 1, 12));
const nowS = () => Math.floor(clock.now() / 1000);
let queued = 0;

const adminToken = "admin";
const invokeOnlyToken = "invoker";
const otherTenantToken = "stranger";

beforeAll(async () => {
  database = await freshDatabase();
  agent = await seedAgent(database.db);
  other = await seedAgent(database.db);
  const deps: WebhookDeps = {
    db: database.db,
    clock,
    log: silentLogger,
    forward: () => Promise.reject(new Error("intake never forwards")),
    config: { ...defaultWebhookConfig, maxBodyBytes: 1024, ratePerMinute: 1000 },
  };
  app = withTestAuth(createWebhookRoutes(deps, { onQueued: () => queued++ }), {
    [adminToken]: caller(agent.tenantId),
    [invokeOnlyToken]: caller(agent.tenantId, ["agents:invoke"]),
    [otherTenantToken]: caller(other.tenantId),
  });
});

afterAll(async () => {
  await database?.close();
});

function admin(path: string, init: RequestInit & { token?: string } = {}) {
  const { token = adminToken, ...rest } = init;
  return app.request(path, { ...rest, headers: { authorization: `Bearer ${token}`, "content-type": "application/json", ...rest.headers } });
}

async function createEndpoint(body: Record<string, unknown>, agentId = agent.agentId) {
  const res = await admin(`/v1/agents/${agentId}/webhooks`, { method: "POST", body: JSON.stringify(body) });
  return { res, json: (await res.json()) as Record<string, unknown> };
}

async function storedRows(endpointId: string) {
  return database.db.select().from(webhookDeliveries).where(eq(webhookDeliveries.endpointId, endpointId));
}

describe("admin API", () => {
  it("creates an endpoint and shows its secret only in the creation answer", async () => {
    const { res, json } = await createEndpoint({ name: "stripe", scheme: "standard", path: "/webhooks/stripe?src=gw" });
    expect(res.status).toBe(201);
    expect(json).toMatchObject({ name: "stripe", scheme: "standard", path: "/webhooks/stripe?src=gw", url: `/hooks/${agent.agentId}/stripe` });
    expect(json.secret).toMatch(/^whsec_[A-Za-z0-9+/]{32}$/);
    expect(json.id).toMatch(/^whe_/);

    const list = await admin(`/v1/agents/${agent.agentId}/webhooks`);
    expect(list.status).toBe(200);
    const text = await list.text();
    expect(text).toContain('"stripe"');
    expect(text).not.toContain(json.secret as string);
    const one = await admin(`/v1/agents/${agent.agentId}/webhooks/stripe`);
    expect(await one.json()).not.toHaveProperty("secret");

    const gh = await createEndpoint({ name: "github", scheme: "github", path: "/gh" });
    expect(gh.res.status).toBe(201);
    expect(gh.json.secret).toMatch(/^[0-9a-f]{64}$/);

    const audit = await database.db
      .select()
      .from(auditLog)
      .where(and(eq(auditLog.action, "webhook.endpoint.create"), eq(auditLog.target, json.id as string)));
    expect(audit).toHaveLength(1);
    expect(audit[0]).toMatchObject({ tenantId: agent.tenantId, actor: "tester" });
  });

  it("refuses a duplicate name (409), bad input (400), and answers the one error envelope", async () => {
    await createEndpoint({ name: "dup", scheme: "standard", path: "/" });
    const again = await createEndpoint({ name: "dup", scheme: "github", path: "/" });
    expect(again.res.status).toBe(409);
    expect(again.json).toMatchObject({ error: { code: "conflict" } });
    expect((again.json.error as { requestId: string }).requestId).toMatch(/^req_/);

    for (const body of [
      { name: "no spaces", scheme: "standard", path: "/" },
      { name: "ok", scheme: "svix", path: "/" },
      { name: "ok", scheme: "standard", path: "//evil.example/x" },
      { name: "ok", scheme: "standard", path: "http://evil.example/" },
    ]) {
      const { res, json } = await createEndpoint(body);
      expect(res.status).toBe(400);
      expect(JSON.stringify(json)).not.toMatch(/at .*\.ts:\d+/); // never a stack trace
    }
    const notJson = await admin(`/v1/agents/${agent.agentId}/webhooks`, { method: "POST", body: "{" });
    expect(notJson.status).toBe(400);
  });

  it("needs agents:admin (401 without a token, 403 without the scope) and hides other tenants' and deleted agents (404)", async () => {
    const path = `/v1/agents/${agent.agentId}/webhooks`;
    expect((await app.request(path)).status).toBe(401);
    expect((await admin(path, { token: invokeOnlyToken })).status).toBe(403);
    expect((await admin(path, { token: otherTenantToken })).status).toBe(404);
    const deleted = await seedAgent(database.db, { tenantId: agent.tenantId, deleted: true });
    expect((await createEndpoint({ name: "x", scheme: "standard", path: "/" }, deleted.agentId)).res.status).toBe(404);
    expect((await admin(`/v1/agents/agt_doesnotexist0000/webhooks`)).status).toBe(404);
  });
});

describe("admin API lists and bodies", () => {
  it("pages an agent's endpoints by name across pages with an opaque cursor; a bad cursor is 400", async () => {
    const owner = await seedAgent(database.db, { tenantId: agent.tenantId });
    const names = ["a1", "a2", "b", "c.x", "c_y", "d", "e"];
    for (const name of [...names].reverse()) expect((await createEndpoint({ name, scheme: "standard" }, owner.agentId)).res.status).toBe(201);
    const pages: string[][] = [];
    let cursor: string | null = null;
    do {
      const res: Response = await admin(`/v1/agents/${owner.agentId}/webhooks?limit=3${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
      expect(res.status).toBe(200);
      const page = (await res.json()) as { endpoints: { name: string; path: string }[]; nextCursor: string | null };
      pages.push(page.endpoints.map((e) => e.name));
      cursor = page.nextCursor;
    } while (cursor && pages.length < 10);
    expect(pages.map((p) => p.length)).toEqual([3, 3, 1]);
    expect(pages.flat()).toEqual([...names].sort());
    expect((await admin(`/v1/agents/${owner.agentId}/webhooks?cursor=${encodeURIComponent(encodeCursor([7]))}`)).status).toBe(400);
    expect((await admin(`/v1/agents/${owner.agentId}/webhooks?limit=x`)).status).toBe(400);
  });

  it("validates admin bodies by schema: unknown fields, bad overlaps, and bodies over the limit", async () => {
    const unknown = await createEndpoint({ name: "strict", scheme: "standard", path: "/", secret: "mine" });
    expect(unknown.res.status).toBe(400);
    expect((unknown.json.error as { message: string }).message).toContain("secret");
    await createEndpoint({ name: "rot", scheme: "standard" });
    for (const overlapS of [-1, 1.5, 31 * 86_400, "60"]) {
      const res = await admin(`/v1/agents/${agent.agentId}/webhooks/rot/rotate`, { method: "POST", body: JSON.stringify({ overlapS }) });
      expect(res.status, String(overlapS)).toBe(400);
    }
    // An empty body is {}: the default overlap.
    expect((await admin(`/v1/agents/${agent.agentId}/webhooks/rot/rotate`, { method: "POST" })).status).toBe(200);
    const declared = await admin(`/v1/agents/${agent.agentId}/webhooks`, {
      method: "POST",
      body: JSON.stringify({ name: "big", scheme: "standard", path: `/${"p".repeat(maxAdminBodyBytes)}` }),
    });
    expect(declared.status).toBe(413);
    expect(await declared.json()).toMatchObject({ error: { code: "payload_too_large" } });
  });
});

describe("the OpenAPI document", () => {
  it("describes intake as signed (no bearer) with a raw body, and the admin routes with their bodies and errors", () => {
    const routes = createWebhookRoutes({
      db: database.db,
      clock,
      log: silentLogger,
      forward: () => Promise.reject(new Error("unused")),
      config: defaultWebhookConfig,
    });
    const doc = routes.getOpenAPI31Document({ openapi: "3.1.0", info: { title: "t", version: "1" } });
    const paths = doc.paths as Record<
      string,
      Record<
        string,
        {
          operationId: string;
          security?: unknown[];
          requestBody?: { content: Record<string, { schema: Record<string, unknown> }> };
          responses: Record<string, unknown>;
        }
      >
    >;
    const intake = paths["/hooks/{agentId}/{endpointName}"]!.post!;
    expect(intake.security).toEqual([]);
    expect(intake.requestBody!.content["*/*"]!.schema).toMatchObject({ type: "string", format: "binary" });
    expect(Object.keys(intake.responses)).toEqual(expect.arrayContaining(["202", "401", "404", "409", "413", "429"]));
    const create = paths["/v1/agents/{id}/webhooks"]!.post!;
    expect(create.operationId).toBe("createWebhookEndpoint");
    expect(create.requestBody!.content["application/json"]!.schema).toEqual({ $ref: "#/components/schemas/NewWebhookEndpoint" });
    expect(create.responses["413"]).toBeDefined();
    expect(paths["/v1/agents/{id}/webhooks/{name}/deliveries"]!.get!.operationId).toBe("listWebhookDeliveries");
  });
});

describe("intake", () => {
  let endpoint: { id: string; name: string; secret: string };
  beforeAll(async () => {
    endpoint = await seedEndpoint(database.db, agent, { name: "intake" });
  });
  const hook = () => `/hooks/${agent.agentId}/${endpoint.name}`;

  it("stores the raw body bytes exactly, the headers and the time, then answers 202 {deliveryId}", async () => {
    // Not UTF-8, CRLFs, NULs and trailing whitespace: any re-encoding would change these bytes.
    const body = new Uint8Array([0x7b, 0x22, 0x61, 0x22, 0x3a, 0x31, 0x7d, 0x0d, 0x0a, 0x00, 0xff, 0xfe, 0x80, 0x20, 0x09]);
    const signed = await standardHeaders(endpoint.secret, body, { timestampS: nowS(), id: "msg_exact" });
    const headers = { ...signed, "x-extra": "kept", authorization: "Bearer not-stored" };
    const before = queued;
    const res = await app.request(hook(), { method: "POST", headers, body });
    expect(res.status).toBe(202);
    const { deliveryId } = (await res.json()) as { deliveryId: string };
    expect(deliveryId).toMatch(/^dlv_/);
    expect(queued).toBe(before + 1);

    const [row] = await storedRows(endpoint.id);
    expect(row).toBeDefined();
    expect(row!.id).toBe(deliveryId);
    expect(Buffer.from(row!.body).equals(Buffer.from(body))).toBe(true);
    expect(row!.bodyBytes).toBe(body.byteLength);
    expect(row!).toMatchObject({ externalId: "msg_exact", status: "pending", agentId: agent.agentId, tenantId: agent.tenantId });
    expect(row!.receivedAt.getTime()).toBe(clock.now());
    const stored = Object.fromEntries(row!.headers);
    expect(stored).toMatchObject({ "webhook-id": "msg_exact", "webhook-signature": signed["webhook-signature"], "x-extra": "kept" });
    expect(stored).not.toHaveProperty("authorization");
  });

  it("takes many deliveries to one endpoint at the same time (no lock conflicts), and one of two racing replays", async () => {
    const ep = await seedEndpoint(database.db, agent, { name: "concurrent" });
    const path = `/hooks/${agent.agentId}/concurrent`;
    const post = async (id: string) => {
      const body = `{"id":"${id}"}`;
      return (await app.request(path, { method: "POST", headers: await standardHeaders(ep.secret, body, { timestampS: nowS(), id }), body })).status;
    };
    const statuses = await Promise.all(Array.from({ length: 25 }, (_, i) => post(`c${i}`)));
    expect(statuses).toEqual(Array(25).fill(202));
    const racing = await Promise.all([post("same"), post("same"), post("same")]);
    expect(racing.sort()).toEqual([202, 409, 409]);
    expect(await storedRows(ep.id)).toHaveLength(26);
  });

  it("answers 409 to a replay of a delivery id, naming the delivery it already has, and stores nothing new", async () => {
    const body = '{"n":1}';
    const headers = await standardHeaders(endpoint.secret, body, { timestampS: nowS(), id: "msg_replayed" });
    const first = await app.request(hook(), { method: "POST", headers, body });
    expect(first.status).toBe(202);
    const { deliveryId } = (await first.json()) as { deliveryId: string };
    const count = (await storedRows(endpoint.id)).length;

    const replay = await app.request(hook(), { method: "POST", headers, body });
    expect(replay.status).toBe(409);
    expect(await replay.json()).toMatchObject({ error: { code: "replay", details: { deliveryId } } });
    // Same id, freshly signed later: still the same delivery.
    clock.advance(10_000);
    const resigned = await standardHeaders(endpoint.secret, body, { timestampS: nowS(), id: "msg_replayed" });
    expect((await app.request(hook(), { method: "POST", headers: resigned, body })).status).toBe(409);
    expect((await storedRows(endpoint.id)).length).toBe(count);
  });

  it("refuses bad signatures and stale or future timestamps with 401, storing nothing", async () => {
    const count = (await storedRows(endpoint.id)).length;
    const body = '{"n":2}';
    const good = await standardHeaders(endpoint.secret, body, { timestampS: nowS() });
    const tampered = await app.request(hook(), { method: "POST", headers: good, body: '{"n":3}' });
    expect(tampered.status).toBe(401);
    expect(await tampered.json()).toMatchObject({ error: { code: "invalid_signature" } });

    const stale = await standardHeaders(endpoint.secret, body, { timestampS: nowS() - 301 });
    expect((await app.request(hook(), { method: "POST", headers: stale, body })).status).toBe(401);
    const future = await standardHeaders(endpoint.secret, body, { timestampS: nowS() + 301 });
    expect((await app.request(hook(), { method: "POST", headers: future, body })).status).toBe(401);
    const unsigned = await app.request(hook(), { method: "POST", headers: { "content-type": "application/json" }, body });
    expect(unsigned.status).toBe(401);
    expect((await storedRows(endpoint.id)).length).toBe(count);
  });

  it("answers 413 above the body limit, by Content-Length and by counting a streamed body", async () => {
    const big = "x".repeat(1025);
    const headers = await standardHeaders(endpoint.secret, big, { timestampS: nowS() });
    const declared = await app.request(hook(), { method: "POST", headers, body: big });
    expect(declared.status).toBe(413);
    expect(await declared.json()).toMatchObject({ error: { code: "payload_too_large" } });

    const chunks = [new Uint8Array(600), new Uint8Array(600)];
    const stream = new ReadableStream<Uint8Array>({
      pull(c) {
        const next = chunks.shift();
        if (next) c.enqueue(next);
        else c.close();
      },
    });
    const streamed = await app.request(hook(), { method: "POST", headers, body: stream, duplex: "half" } as RequestInit);
    expect(streamed.status).toBe(413);

    const atLimit = "y".repeat(1024);
    expect(
      (await app.request(hook(), { method: "POST", headers: await standardHeaders(endpoint.secret, atLimit, { timestampS: nowS() }), body: atLimit })).status,
    ).toBe(202);
  });

  it("answers 404 for an unknown agent, endpoint, deleted endpoint or malformed id, and 405 for other methods", async () => {
    const body = "{}";
    const headers = await standardHeaders(endpoint.secret, body, { timestampS: nowS() });
    for (const path of [`/hooks/agt_nobody000000000/intake`, `/hooks/${agent.agentId}/nope`, `/hooks/not-an-id/intake`, `/hooks/${other.agentId}/intake`]) {
      const res = await app.request(path, { method: "POST", headers, body });
      expect(res.status, path).toBe(404);
    }
    expect((await app.request(hook(), { method: "GET" })).status).toBe(405);

    const doomed = await createEndpoint({ name: "doomed", scheme: "standard", path: "/" });
    expect((await admin(`/v1/agents/${agent.agentId}/webhooks/doomed`, { method: "DELETE" })).status).toBe(204);
    const doomedHeaders = await standardHeaders(doomed.json.secret as string, body, { timestampS: nowS() });
    expect((await app.request(`/hooks/${agent.agentId}/doomed`, { method: "POST", headers: doomedHeaders, body })).status).toBe(404);
    expect((await admin(`/v1/agents/${agent.agentId}/webhooks/doomed`)).status).toBe(404);
    // The name is free again.
    expect((await createEndpoint({ name: "doomed", scheme: "standard", path: "/" })).res.status).toBe(201);
  });

  it("verifies GitHub deliveries and uses X-GitHub-Delivery for replays", async () => {
    const gh = await seedEndpoint(database.db, agent, { name: "gh-intake", scheme: "github" });
    const body = '{"zen":"Keep it logically awesome."}';
    const headers = await githubHeaders(gh.secret, body, "8d5d6a2e-0001");
    const res = await app.request(`/hooks/${agent.agentId}/gh-intake`, { method: "POST", headers, body });
    expect(res.status).toBe(202);
    expect((await app.request(`/hooks/${agent.agentId}/gh-intake`, { method: "POST", headers, body })).status).toBe(409);
    const [row] = await storedRows(gh.id);
    expect(row).toMatchObject({ externalId: "8d5d6a2e-0001" });
    const wrong = await githubHeaders("not the secret", body, "8d5d6a2e-0002");
    expect((await app.request(`/hooks/${agent.agentId}/gh-intake`, { method: "POST", headers: wrong, body })).status).toBe(401);
  });

  it("rotation: the old secret verifies during the overlap and not after it; the new one at once", async () => {
    const created = await createEndpoint({ name: "rotating", scheme: "standard", path: "/" });
    const oldSecret = created.json.secret as string;
    const rotated = await admin(`/v1/agents/${agent.agentId}/webhooks/rotating/rotate`, { method: "POST", body: JSON.stringify({ overlapS: 60 }) });
    expect(rotated.status).toBe(200);
    const rj = (await rotated.json()) as { secret: string; previousSecretExpiresAt: string };
    expect(rj.secret).not.toBe(oldSecret);
    expect(new Date(rj.previousSecretExpiresAt).getTime()).toBe(clock.now() + 60_000);

    const post = async (secret: string) => {
      const body = `{"t":${clock.now()}}`;
      return (
        await app.request(`/hooks/${agent.agentId}/rotating`, { method: "POST", headers: await standardHeaders(secret, body, { timestampS: nowS() }), body })
      ).status;
    };
    expect(await post(oldSecret)).toBe(202);
    expect(await post(rj.secret)).toBe(202);
    clock.advance(60_000);
    expect(await post(oldSecret)).toBe(401);
    expect(await post(rj.secret)).toBe(202);
    const view = (await (await admin(`/v1/agents/${agent.agentId}/webhooks/rotating`)).json()) as Record<string, unknown>;
    expect(view.previousSecretExpiresAt).toBeNull();
  });

  it("answers 429 with Retry-After past the endpoint's rate; replays cost nothing", async () => {
    const limitedApp = withTestAuth(
      createWebhookRoutes({
        db: database.db,
        clock,
        log: silentLogger,
        forward: () => Promise.reject(new Error("unused")),
        config: { ...defaultWebhookConfig, ratePerMinute: 3 },
      }),
      {},
    );
    const ep = await seedEndpoint(database.db, agent, { name: "limited" });
    const path = `/hooks/${agent.agentId}/limited`;
    const send = async (id: string) => {
      const body = `{"id":"${id}"}`;
      return limitedApp.request(path, { method: "POST", headers: await standardHeaders(ep.secret, body, { timestampS: nowS(), id }), body });
    };
    expect((await send("r1")).status).toBe(202);
    expect((await send("r1")).status).toBe(409);
    expect((await send("r2")).status).toBe(202);
    expect((await send("r3")).status).toBe(202);
    const limited = await send("r4");
    expect(limited.status).toBe(429);
    expect(limited.headers.get("retry-after")).toBe("20");
    expect(await limited.json()).toMatchObject({ error: { code: "rate_limited" } });
    // The refused one was not kept: it may be sent again once there is room.
    expect((await storedRows(ep.id)).map((r) => r.externalId).sort()).toEqual(["r1", "r2", "r3"]);
    clock.advance(20_000);
    expect((await send("r4")).status).toBe(202);
  });
});

describe("deliveries API", () => {
  it("lists an endpoint's deliveries with attempts, shows one with its body, and is tenant-scoped", async () => {
    const ep = await seedEndpoint(database.db, agent, { name: "listed" });
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      clock.advance(1000);
      const body = `{"i":${i}}`;
      const res = await app.request(`/hooks/${agent.agentId}/listed`, {
        method: "POST",
        headers: await standardHeaders(ep.secret, body, { timestampS: nowS() }),
        body,
      });
      ids.push(((await res.json()) as { deliveryId: string }).deliveryId);
    }
    const page1 = (await (await admin(`/v1/agents/${agent.agentId}/webhooks/listed/deliveries?limit=2`)).json()) as {
      deliveries: { id: string; attempts: unknown[] }[];
      nextCursor: string;
    };
    expect(page1.deliveries.map((d) => d.id)).toEqual([ids[2], ids[1]]);
    expect(page1.deliveries[0]!.attempts).toEqual([]);
    const page2 = (await (
      await admin(`/v1/agents/${agent.agentId}/webhooks/listed/deliveries?limit=2&cursor=${encodeURIComponent(page1.nextCursor)}`)
    ).json()) as { deliveries: { id: string }[]; nextCursor: null };
    expect(page2.deliveries.map((d) => d.id)).toEqual([ids[0]]);
    expect(page2.nextCursor).toBeNull();

    // Deliveries received in the same millisecond are neither skipped nor repeated across pages.
    const sameMs: string[] = [];
    clock.advance(1000);
    for (let i = 0; i < 4; i++) {
      const body = `{"same":${i}}`;
      const res = await app.request(`/hooks/${agent.agentId}/listed`, {
        method: "POST",
        headers: await standardHeaders(ep.secret, body, { timestampS: nowS() }),
        body,
      });
      sameMs.push(((await res.json()) as { deliveryId: string }).deliveryId);
    }
    const paged: string[] = [];
    let cursor: string | null = null;
    do {
      const url: string = `/v1/agents/${agent.agentId}/webhooks/listed/deliveries?limit=1${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
      const page = (await (await admin(url)).json()) as { deliveries: { id: string }[]; nextCursor: string | null };
      paged.push(...page.deliveries.map((d) => d.id));
      cursor = page.nextCursor;
    } while (cursor);
    expect(paged.slice(0, 4).sort()).toEqual([...sameMs].sort());
    expect(paged.slice(4)).toEqual([ids[2], ids[1], ids[0]]);
    for (const bad of ["nope!", encodeCursor(["2026-03-01T12:00:00Z", "dlv_x"]), encodeCursor(["yesterday", "dlv_x"]), encodeCursor([1, 2])]) {
      const res = await admin(`/v1/agents/${agent.agentId}/webhooks/listed/deliveries?cursor=${encodeURIComponent(bad)}`);
      expect(res.status, bad).toBe(400);
      expect(await res.json()).toMatchObject({ error: { code: "bad_request", message: expect.stringContaining("cursor") } });
    }
    for (const q of ["limit=0", "limit=1001", "before=2026-03-01T12:00:00Z"])
      expect((await admin(`/v1/agents/${agent.agentId}/webhooks/listed/deliveries?${q}`)).status, q).toBe(400);

    const one = await admin(`/v1/webhook-deliveries/${ids[0]}`);
    expect(one.status).toBe(200);
    const oj = (await one.json()) as { bodyBase64: string; status: string; endpointName: string };
    expect(Buffer.from(oj.bodyBase64, "base64").toString()).toBe('{"i":0}');
    expect(oj).toMatchObject({ status: "pending", endpointName: "listed" });
    expect((await admin(`/v1/webhook-deliveries/${ids[0]}`, { token: otherTenantToken })).status).toBe(404);
    expect((await admin(`/v1/webhook-deliveries/${ids[0]}/redeliver`, { method: "POST", token: otherTenantToken })).status).toBe(404);
  });
});

describe("through a real HTTP server", () => {
  let server: ReturnType<typeof serve>;
  let base: string;
  let ep: { id: string; name: string; secret: string };

  beforeAll(async () => {
    ep = await seedEndpoint(database.db, agent, { name: "http" });
    await new Promise<void>((resolve) => {
      server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, () => resolve());
    });
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks/${agent.agentId}/http`;
  });
  afterAll(async () => {
    await new Promise<void>((r) => server.close(() => r()));
  });

  /** A raw node:http POST, so the test controls chunking and Content-Length exactly. */
  function rawPost(
    headers: Record<string, string>,
    chunks: Uint8Array[],
  ): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: string }> {
    return new Promise((resolve, reject) => {
      const req = httpRequest(base, { method: "POST", headers }, (res) => {
        let body = "";
        res.on("data", (d: Buffer) => (body += d.toString()));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
      });
      req.on("error", reject);
      for (const c of chunks) req.write(c);
      req.end();
    });
  }

  it("stores the bytes exactly and refuses the replay", async () => {
    const body = new Uint8Array(Array.from({ length: 256 }, (_, i) => i)); // every byte value
    const headers = await standardHeaders(ep.secret, body, { timestampS: nowS(), id: "msg_http_1" });
    const res = await fetch(base, { method: "POST", headers, body });
    expect(res.status).toBe(202);
    expect(res.headers.get("content-type")).toMatch(/application\/json/);
    const { deliveryId } = (await res.json()) as { deliveryId: string };
    const [row] = await database.db.select().from(webhookDeliveries).where(eq(webhookDeliveries.id, deliveryId));
    expect(Buffer.from(row!.body).equals(Buffer.from(body))).toBe(true);

    const replay = await fetch(base, { method: "POST", headers, body });
    expect(replay.status).toBe(409);
  });

  it("answers 413 to a declared oversize body and to a chunked one without a length", async () => {
    const big = new Uint8Array(4096).fill(0x61);
    const headers = await standardHeaders(ep.secret, big, { timestampS: nowS() });
    const declared = await rawPost({ ...headers, "content-length": String(big.byteLength) }, [big]);
    expect(declared.status).toBe(413);
    expect(JSON.parse(declared.body)).toMatchObject({ error: { code: "payload_too_large" } });

    const chunked = await rawPost({ ...headers, "transfer-encoding": "chunked" }, [big.subarray(0, 1000), big.subarray(1000, 2000), big.subarray(2000)]);
    expect(chunked.status).toBe(413);
  });

  it("bounds admin bodies at 64 KiB by counting a chunked body without a length (413, the envelope)", async () => {
    const admins = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/agents/${agent.agentId}/webhooks`;
    const post = (chunks: string[]) =>
      new Promise<{ status: number; body: string }>((resolve, reject) => {
        const req = httpRequest(
          admins,
          { method: "POST", headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json", "transfer-encoding": "chunked" } },
          (res) => {
            let body = "";
            res.on("data", (d: Buffer) => (body += d.toString()));
            res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
          },
        );
        req.on("error", reject);
        for (const c of chunks) req.write(c);
        req.end();
      });
    const padding = "x".repeat(16 * 1024);
    const over = await post(['{"name":"chunky","scheme":"standard","path":"/', padding, padding, padding, padding, '"}']);
    expect(over.status).toBe(413);
    expect(JSON.parse(over.body)).toMatchObject({ error: { code: "payload_too_large", requestId: expect.stringMatching(/^req_/) } });
    // The same request under the limit is read whole (and refused for its 48 KiB path, not its size).
    const under = await post(['{"name":"chunky","scheme":"standard","path":"/', padding, padding, padding, '"}']);
    expect(under.status).toBe(400);
    const fine = await post(['{"name":"chunky",', '"scheme":"standard","path":"/c"}']);
    expect(fine.status).toBe(201);
  });

  it("answers 429 with Retry-After over HTTP too", async () => {
    const limited = withTestAuth(
      createWebhookRoutes({
        db: database.db,
        clock,
        log: silentLogger,
        forward: () => Promise.reject(new Error("unused")),
        config: { ...defaultWebhookConfig, ratePerMinute: 1 },
      }),
      {},
    );
    const lep = await seedEndpoint(database.db, agent, { name: "http-limited" });
    const srv = serve({ fetch: limited.fetch, port: 0, hostname: "127.0.0.1" });
    await new Promise((r) => srv.once("listening", r));
    try {
      const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}/hooks/${agent.agentId}/http-limited`;
      const statuses: number[] = [];
      let retryAfter: string | null = null;
      for (let i = 0; i < 3; i++) {
        const body = `{"i":${i}}`;
        const res = await fetch(url, { method: "POST", headers: await standardHeaders(lep.secret, body, { timestampS: nowS() }), body });
        statuses.push(res.status);
        if (res.status === 429) retryAfter = res.headers.get("retry-after");
        await res.body?.cancel();
      }
      expect(statuses).toEqual([202, 429, 429]);
      expect(Number(retryAfter)).toBe(60);
    } finally {
      await new Promise<void>((r) => srv.close(() => r()));
    }
  });

  it("refuses an unsigned request before reading it into storage", async () => {
    const body = '{"hello":"world"}';
    const sig = await signStandard(ep.secret, "msg_x", nowS(), new TextEncoder().encode(body));
    const res = await fetch(base, { method: "POST", headers: { "webhook-id": "msg_y", "webhook-timestamp": String(nowS()), "webhook-signature": sig }, body });
    expect(res.status).toBe(401);
    const json = (await res.json()) as { error: { message: string } };
    expect(json.error.message).not.toMatch(/\n\s+at /);
  });
});

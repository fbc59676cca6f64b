// The gateway's HTTP contract through app.request(): routing, auth rules, admin API, one error envelope.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generateKeyPair, exportJWK, SignJWT, type JWK } from "jose";
import { openDatabase, type Database } from "../../schema/db.ts";
import { silentLogger } from "../../lib/log.ts";
import { createGateway } from "../../gateway/app.ts";
import { createAgentRepo } from "../../gateway/agents/repo.ts";
import { createJwtAuthenticator } from "../../gateway/auth.ts";
import type { Fleet } from "../../contracts/fleet.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import { fromPrivateJwk, mintToken } from "../../compose/dev-keys.ts";
import { createDbAuditLog } from "../../schema/audit-log.ts";
import { fakeFleet } from "../helpers/fake-fleet.ts";

let database: Database;
let privateJwk: JWK;
const forwarded: { agent: AgentSpec; url: string; headers: Headers }[] = [];

const fleet: Fleet = fakeFleet({
  async forward(agent, req) {
    forwarded.push({ agent, url: req.url, headers: req.headers });
    return new Response(`hello from ${agent.id}`, { headers: { "x-wake": "warm", connection: "close" } });
  },
});

let app: ReturnType<typeof createGateway>;

beforeAll(async () => {
  database = await openDatabase({ pgliteMemory: true });
  const { privateKey } = await generateKeyPair("ES256", { extractable: true });
  privateJwk = { ...(await exportJWK(privateKey)), kid: "k1" };
  const repo = createAgentRepo(database.db);
  await repo.ensureTenant("ten_a", "A");
  await repo.ensureTenant("ten_b", "B");
  app = createGateway({
    agents: repo,
    fleet,
    audit: createDbAuditLog(database.db),
    auth: createJwtAuthenticator({ keys: { jwks: fromPrivateJwk(privateJwk).jwks }, issuer: "agentvm-dev", audience: "agentvm", algorithms: ["ES256"] }),
    log: silentLogger,
    config: {
      domain: "agents.test",
      maxBodyBytes: 1000,
      maxApiBodyBytes: 10_000,
      images: ["demo"],
      agentDefaults: { vcpus: 1, memMiB: 256, idleTimeoutMs: 1000, streamIdleMs: 1000 },
    },
  });
});
afterAll(async () => database?.close());

const token = (tenant = "ten_a", scopes: ("agents:invoke" | "agents:admin" | "usage:read")[] = ["agents:invoke", "agents:admin"]) =>
  mintToken(privateJwk, { tenant, scopes });
const auth = async (t?: string) => ({ authorization: `Bearer ${t ?? (await token())}` });

async function create(body: Record<string, unknown> = {}) {
  const res = await app.request("/v1/agents", { method: "POST", body: JSON.stringify(body), headers: await auth() });
  expect(res.status).toBe(201);
  return (await res.json()) as { id: string; path: string; state: string; idleTimeoutMs: number };
}

describe("gateway app", () => {
  it("GET /healthz answers without touching any agent", async () => {
    const before = forwarded.length;
    const res = await app.request("/healthz");
    expect(res.status).toBe(200);
    expect(forwarded.length).toBe(before);
  });

  it("routes /a/{id}/{path} and {id}.{domain} hosts to the agent with the path inside it", async () => {
    const agent = await create();
    const a = await app.request(`/a/${agent.id}/x/y?z=1`, { headers: await auth() });
    expect(await a.text()).toBe(`hello from ${agent.id}`);
    expect(forwarded.at(-1)!.url).toBe("http://agent/x/y?z=1");
    expect(a.headers.get("connection")).toBeNull();
    const b = await app.request(`http://${agent.id}.agents.test/p?q=2`, { headers: { ...(await auth()), host: `${agent.id}.agents.test` } });
    expect(b.status).toBe(200);
    expect(forwarded.at(-1)!.url).toBe("http://agent/p?q=2");
  });

  it("admin API: create with defaults, list, get, wake, hibernate, delete — scoped to the caller's tenant", async () => {
    const agent = await create({ name: "mine", idleTimeoutMs: 2500 });
    expect(agent.idleTimeoutMs).toBe(2500);
    expect(agent.path).toBe(`/a/${agent.id}/`);
    const list = (await (await app.request("/v1/agents", { headers: await auth() })).json()) as { agents: { id: string }[] };
    expect(list.agents.map((x) => x.id)).toContain(agent.id);
    const otherList = (await (await app.request("/v1/agents", { headers: await auth(await token("ten_b")) })).json()) as { agents: unknown[] };
    expect(otherList.agents).toHaveLength(0);
    expect((await app.request(`/v1/agents/${agent.id}`, { headers: await auth(await token("ten_b")) })).status).toBe(404);
    expect(await (await app.request(`/v1/agents/${agent.id}/wake`, { method: "POST", headers: await auth() })).json()).toMatchObject({ wake: "boot" });
    expect(await (await app.request(`/v1/agents/${agent.id}/hibernate`, { method: "POST", headers: await auth() })).json()).toMatchObject({
      state: "hibernated",
    });
    expect((await app.request(`/v1/agents/${agent.id}`, { method: "DELETE", headers: await auth() })).status).toBe(200);
    expect((await app.request(`/v1/agents/${agent.id}`, { headers: await auth() })).status).toBe(404);
    expect((await app.request(`/a/${agent.id}/`, { headers: await auth() })).status).toBe(404);
  });

  it("every error is the one envelope with the request id, for unknown routes too", async () => {
    const res = await app.request("/nowhere");
    expect(res.status).toBe(404);
    const body = (await res.json()) as { error: { code: string; requestId: string } };
    expect(body.error.code).toBe("not_found");
    expect(body.error.requestId).toBe(res.headers.get("x-request-id"));
  });

  it("refuses a token with an algorithm outside the allowlist, and a non-Bearer scheme", async () => {
    const hs = await new SignJWT({ tenant: "ten_a", scope: "agents:admin" })
      .setProtectedHeader({ alg: "HS256" })
      .setIssuer("agentvm-dev")
      .setAudience("agentvm")
      .setSubject("x")
      .setExpirationTime("1h")
      .sign(new TextEncoder().encode("x".repeat(32)));
    const res = await app.request("/v1/agents", { headers: { authorization: `Bearer ${hs}` } });
    expect(res.status).toBe(401);
    const basic = await app.request("/v1/agents", { headers: { authorization: "Basic dXNlcjpwYXNz" } });
    expect(basic.status).toBe(401);
  });

  it("a token without the admin scope cannot use the admin API; without invoke it cannot call agents", async () => {
    const agent = await create();
    expect((await app.request("/v1/agents", { headers: await auth(await token("ten_a", ["agents:invoke"])) })).status).toBe(403);
    expect((await app.request(`/a/${agent.id}/`, { headers: await auth(await token("ten_a", ["usage:read"])) })).status).toBe(403);
  });

  it("public agents need no token", async () => {
    const agent = await create({ public: true });
    expect((await app.request(`/a/${agent.id}/`)).status).toBe(200);
  });

  it("refuses unknown fields, bad types and oversized admin bodies", async () => {
    const h = await auth();
    expect((await app.request("/v1/agents", { method: "POST", body: JSON.stringify({ colour: "red" }), headers: h })).status).toBe(400);
    expect((await app.request("/v1/agents", { method: "POST", body: JSON.stringify({ vcpus: 0 }), headers: h })).status).toBe(400);
    expect(
      (await app.request("/v1/agents", { method: "POST", body: JSON.stringify({ name: "x".repeat(20_000) }), headers: { ...h, "content-length": "20012" } }))
        .status,
    ).toBe(413);
  });

  it("names what is wrong with a body: each field, unknown fields, the body itself", async () => {
    const h = await auth();
    const message = async (body: string) => {
      const res = await app.request("/v1/agents", { method: "POST", body, headers: h });
      expect(res.status, body.slice(0, 80)).toBe(400);
      const json = (await res.json()) as { error: { code: string; message: string; requestId: string } };
      expect(json.error.code).toBe("bad_request");
      expect(json.error.requestId).toBe(res.headers.get("x-request-id"));
      return json.error.message;
    };
    expect(await message(JSON.stringify({ colour: "red", size: 1 }))).toBe("unknown field(s): colour, size");
    expect(await message(JSON.stringify({ memMiB: "lots" }))).toBe("memMiB: must be an integer from 64 to 65536");
    expect(await message(JSON.stringify({ idleTimeoutMs: 99 }))).toBe("idleTimeoutMs: must be an integer from 100 to 604800000");
    expect(await message(JSON.stringify({ public: "yes" }))).toBe("public: must be true or false");
    expect(await message(JSON.stringify({ name: "a/b" }))).toMatch(/^name: must be 1–100 letters/);
    expect(await message(JSON.stringify({ image: "UPPER" }))).toMatch(/^image: must be a built-in image/);
    expect(await message(JSON.stringify({ limits: { maxBodyBytes: -1 } }))).toBe("limits.maxBodyBytes: must be an integer from 0 to 1125899906842624");
    expect(await message(JSON.stringify({ limits: { other: 1 } }))).toBe("limits: unknown field(s): other");
    expect(await message(JSON.stringify({ limits: null }))).toMatch(/^limits: must be an object/);
    expect(await message(JSON.stringify({ nonWaking: { methods: ["get"] } }))).toMatch(
      /^nonWaking.methods.0: must be a list of at most 100 upper-case HTTP methods/,
    );
    expect(await message("[1]")).toBe("must be a JSON object");
    expect(await message("{not json")).toMatch(/JSON/i);
    // A body naming thousands of unknown fields is not echoed back whole.
    expect((await message(JSON.stringify(Object.fromEntries(Array.from({ length: 900 }, (_, i) => [`f${i}`, 1]))))).length).toBeLessThan(400);
  });

  it("a chunked body over the limit (no declared length) is refused with 413 and the envelope", async () => {
    const chunk = new TextEncoder().encode(`{"name":"${"x".repeat(4000)}`);
    let sent = 0;
    const body = new ReadableStream<Uint8Array>({
      pull(controller) {
        if (sent >= 10) return controller.close();
        sent++;
        controller.enqueue(chunk);
      },
    });
    const res = await app.request("/v1/agents", { method: "POST", body, headers: await auth(), duplex: "half" } as RequestInit);
    expect(res.status).toBe(413);
    const json = (await res.json()) as { error: { code: string; message: string; requestId: string } };
    expect(json.error).toMatchObject({ code: "payload_too_large", message: "body exceeds the 10000-byte limit" });
    expect(json.error.requestId).toBe(res.headers.get("x-request-id"));
    // It stopped reading at the limit: 3 of the 10 chunks are enough to pass it.
    expect(sent).toBeLessThan(10);
  });

  it("a body that breaks off (the client went away) is a 400 rejection, not a 500", async () => {
    let pulls = 0;
    const body = new ReadableStream<Uint8Array>({
      pull(controller) {
        if (pulls++ === 0) return controller.enqueue(new TextEncoder().encode('{"name":"half'));
        controller.error(new TypeError("terminated"));
      },
    });
    const res = await app.request("/v1/agents", { method: "POST", body, headers: await auth(), duplex: "half" } as RequestInit);
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { message: string } }).error.message).toMatch(/cut off/);
  });

  it("a body naming hundreds of unknown fields gets a short answer", async () => {
    const fields = Object.fromEntries(Array.from({ length: 900 }, (_, i) => [`f${i}`, 1]));
    const res = await app.request("/v1/agents", { method: "POST", body: JSON.stringify(fields), headers: await auth() });
    expect(res.status).toBe(400);
    const text = await res.text();
    expect(text.length).toBeLessThan(1000);
    expect((JSON.parse(text) as { error: { message: string } }).error.message).toMatch(/f0/);
  });

  it("the scope is checked before the body: no token is a 401 whatever the body", async () => {
    const res = await app.request("/v1/agents", { method: "POST", body: JSON.stringify({ colour: "red" }) });
    expect(res.status).toBe(401);
    const lease = await app.request("/v1/agents/agt_0000000000000000/leases", {
      method: "POST",
      body: "x".repeat(20_000),
      headers: await auth(await token("ten_a", ["agents:invoke"])),
    });
    expect(lease.status).toBe(403);
    expect((await app.request("/v1/agents?limit=0")).status).toBe(401);
    expect((await app.request("/v1/agents/agt_0000000000000000/logs?tail=x")).status).toBe(401);
  });

  it("leases: ttlMs is required and bounded; a path that is no agent id is invalid_id", async () => {
    const agent = await create();
    const h = await auth();
    const lease = async (body: string) => app.request(`/v1/agents/${agent.id}/leases`, { method: "POST", body, headers: h });
    expect((await lease("")).status).toBe(400);
    expect(((await (await lease("{}")).json()) as { error: { message: string } }).error.message).toBe("ttlMs: must be an integer from 1000 to 86400000");
    expect((await lease(JSON.stringify({ ttlMs: 999 }))).status).toBe(400);
    expect((await lease(JSON.stringify({ ttlMs: 1000 }))).status).toBe(201);
    const bad = await app.request("/v1/agents/not-an-id", { headers: h });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { code: string } }).error.code).toBe("invalid_id");
  });

  it("the OpenAPI document describes the agents API from the schemas that validate it", async () => {
    const res = await app.request("/openapi.json");
    expect(res.status).toBe(200);
    const doc = (await res.json()) as {
      openapi: string;
      paths: Record<
        string,
        Record<
          string,
          {
            operationId: string;
            tags: string[];
            summary: string;
            parameters?: { name: string; in: string; schema: Record<string, unknown> }[];
            responses: Record<string, { content?: Record<string, unknown> }>;
          }
        >
      >;
      components: { schemas: Record<string, { properties?: Record<string, Record<string, unknown>>; additionalProperties?: unknown }> };
    };
    expect(doc.openapi).toBe("3.1.0");
    const ops = Object.values(doc.paths).flatMap((p) => Object.values(p));
    const agentOps = ops.filter((o) => o.tags?.includes("agents")).map((o) => o.operationId);
    expect(agentOps.sort()).toEqual([
      "addAgentLease",
      "createAgent",
      "deleteAgent",
      "dropAgentLease",
      "getAgent",
      "getAgentLogs",
      "hibernateAgent",
      "listAgentEvents",
      "listAgents",
      "updateAgent",
      "wakeAgent",
    ]);
    for (const o of ops.filter((x) => x.tags?.includes("agents"))) expect(o.summary, o.operationId).toBeTruthy();
    const list = doc.paths["/v1/agents"]!.get!;
    const limit = list.parameters!.find((p) => p.name === "limit")!;
    expect(limit).toMatchObject({ in: "query", schema: { default: 100, maximum: 1000, minimum: 1 } });
    expect(list.parameters!.map((p) => p.name).sort()).toEqual(["cursor", "image", "limit", "namePrefix", "state"]);
    expect(list.responses["400"]!.content!["application/json"]).toEqual({ schema: { $ref: "#/components/schemas/Error" } });
    const events = doc.paths["/v1/agents/{id}/events"]!.get!;
    expect(events.parameters!.map((p) => `${p.in}:${p.name}`).sort()).toEqual(["path:id", "query:cursor", "query:limit", "query:since", "query:until"]);
    expect(Object.keys(doc.paths["/v1/agents/{id}/logs"]!.get!.responses["200"]!.content!).sort()).toEqual(["text/event-stream", "text/plain"]);
    for (const name of ["Agent", "AgentList", "AgentEvent", "AgentEventList", "CreateAgent", "UpdateAgent", "Lease", "Wake", "NonWakingRules", "Error"])
      expect(doc.components.schemas, name).toHaveProperty(name);
    // Bodies refuse unknown fields, and the document says so.
    expect(doc.components.schemas.CreateAgent!.additionalProperties).toBe(false);
    expect(doc.components.schemas.CreateAgent!.properties!.memMiB).toMatchObject({ type: "integer", minimum: 64, maximum: 65536 });
  });
});

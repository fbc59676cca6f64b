// The gateway's HTTP contract through app.request(): routing, auth rules, admin API, one error envelope.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generateKeyPair, exportJWK, SignJWT, type JWK } from "jose";
import { openDatabase, type Database } from "../../schema/db.ts";
import { silentLogger } from "../../lib/log.ts";
import { createGateway } from "../../gateway/app.ts";
import { createAgentRepo } from "../../gateway/agent-repo.ts";
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
    config: { domain: "agents.test", maxBodyBytes: 1000, maxApiBodyBytes: 10_000, images: ["demo"], agentDefaults: { vcpus: 1, memMiB: 256, idleTimeoutMs: 1000, streamIdleMs: 1000 } },
  });
});
afterAll(async () => database?.close());

const token = (tenant = "ten_a", scopes: ("agents:invoke" | "agents:admin" | "usage:read")[] = ["agents:invoke", "agents:admin"]) => mintToken(privateJwk, { tenant, scopes });
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
    expect(await (await app.request(`/v1/agents/${agent.id}/hibernate`, { method: "POST", headers: await auth() })).json()).toMatchObject({ state: "hibernated" });
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
    const hs = await new SignJWT({ tenant: "ten_a", scope: "agents:admin" }).setProtectedHeader({ alg: "HS256" }).setIssuer("agentvm-dev").setAudience("agentvm").setSubject("x").setExpirationTime("1h").sign(new TextEncoder().encode("x".repeat(32)));
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
    expect((await app.request("/v1/agents", { method: "POST", body: JSON.stringify({ name: "x".repeat(20_000) }), headers: { ...h, "content-length": "20012" } })).status).toBe(413);
  });
});

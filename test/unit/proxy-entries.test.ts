// The same proxy rules on the other entries: the Hono app (what the Worker runs, through app.request) and the Node fast
// path over a fleet without `withHold` (a remote fleet): non-waking answers, tenant limit, body limit, response and idle timeouts.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { generateKeyPair, exportJWK, type JWK } from "jose";
import { openDatabase, type Database } from "../../schema/db.ts";
import { createDbAuditLog } from "../../schema/audit-log.ts";
import { createLogger, silentLogger } from "../../lib/log.ts";
import { createGateway } from "../../gateway/app.ts";
import { createAgentRepo, type AgentRepo } from "../../gateway/agents/repo.ts";
import { createJwtAuthenticator } from "../../gateway/auth.ts";
import { createAgentSettingsStore } from "../../gateway/proxy/agents.ts";
import { createProxyCore, defaultProxyConfig } from "../../gateway/proxy/core.ts";
import { createNodeProxy } from "../../gateway/node/fast-path/handler.ts";
import type { Fleet } from "../../contracts/fleet.ts";
import type { VmStatus } from "../../contracts/agent.ts";
import { fromPrivateJwk, mintToken } from "../../compose/dev-keys.ts";
import { fakeFleet } from "../helpers/fake-fleet.ts";

let database: Database;
let privateJwk: JWK;
let repo: AgentRepo;
const calls: { path: string; method: string }[] = [];
const state: VmStatus["state"] = "hibernated";

/** A fleet that answers from memory: `/slow` never answers, `/drip` sends one chunk then goes silent. */
const fleet: Fleet = fakeFleet({
  async forward(agent, req, ctx) {
    const url = new URL(req.url);
    calls.push({ path: url.pathname, method: req.method });
    if (req.body) await req.arrayBuffer(); // reads the body as an agent would (the body limit applies as it flows)
    if (url.pathname === "/slow") {
      return new Promise<Response>((_resolve, reject) => ctx.signal?.addEventListener("abort", () => reject(new Error("aborted"))));
    }
    if (url.pathname === "/drip") {
      const body = new ReadableStream<Uint8Array>({ start: (c) => c.enqueue(new TextEncoder().encode("first\n")) });
      return new Response(body, { headers: { "x-wake": "warm" } });
    }
    return new Response(`hello ${agent.id} ${url.pathname}`, { headers: { "x-wake": "warm", connection: "close" } });
  },
  async wake() {
    return { wake: "boot", runId: "run_x", timings: {} };
  },
  async status(agentId) {
    return { agentId, vmId: "vm_x", state, inFlight: 0, leases: 0, runId: undefined, lastWakeAt: undefined, lastActivityAt: undefined };
  },
});

const config = {
  domain: undefined,
  maxBodyBytes: 1000,
  maxApiBodyBytes: 10_000,
  images: ["demo"],
  agentDefaults: { vcpus: 1, memMiB: 256, idleTimeoutMs: 1000, streamIdleMs: 1000 },
  proxy: { ...defaultProxyConfig, tenantMaxConcurrent: 2, responseTimeoutMs: 300, proxyIdleTimeoutMs: 400 },
};

let app: ReturnType<typeof createGateway>;
let auth: ReturnType<typeof createJwtAuthenticator>;

beforeAll(async () => {
  database = await openDatabase({ pgliteMemory: true });
  const { privateKey } = await generateKeyPair("ES256", { extractable: true });
  privateJwk = { ...(await exportJWK(privateKey)), kid: "k1" };
  repo = createAgentRepo(database.db);
  await repo.ensureTenant("ten_a", "A");
  auth = createJwtAuthenticator({ keys: { jwks: fromPrivateJwk(privateJwk).jwks }, issuer: "agentvm-dev", audience: "agentvm", algorithms: ["ES256"] });
  app = createGateway({
    agents: repo,
    fleet,
    audit: createDbAuditLog(database.db),
    auth,
    log: silentLogger,
    config,
    settings: createAgentSettingsStore(database.db),
  });
});
afterAll(async () => database?.close());

const token = () => mintToken(privateJwk, { tenant: "ten_a", scopes: ["agents:invoke", "agents:admin"] });

async function create(body: Record<string, unknown> = {}) {
  const res = await app.request("/v1/agents", { method: "POST", body: JSON.stringify(body), headers: { authorization: `Bearer ${await token()}` } });
  expect(res.status).toBe(201);
  return (await res.json()) as { id: string };
}

describe("the Hono entry (Workers)", () => {
  it("answers non-waking traffic itself with the agent's state, and forwards the rest", async () => {
    const agent = await create({ public: true });
    const before = calls.length;
    const bot = await app.request(`/a/${agent.id}/`, { headers: { "user-agent": "kube-probe/1.30" } });
    expect(bot.status).toBe(200);
    expect(bot.headers.get("x-wake")).toBe("none");
    expect(await bot.json()).toMatchObject({ state: "hibernated", answeredBy: "gateway" });
    expect((await app.request(`/a/${agent.id}/robots.txt`)).headers.get("content-type")).toContain("text/plain");
    expect(calls.length).toBe(before);
    expect(await (await app.request(`/a/${agent.id}/x`)).text()).toBe(`hello ${agent.id} /x`);
    expect(calls.length).toBe(before + 1);
  });

  it("504 after the response timeout; 429 beyond the tenant limit while calls hang; a silent body is cut after the idle timeout", async () => {
    const agent = await create({ public: true });
    const hanging = [app.request(`/a/${agent.id}/slow`), app.request(`/a/${agent.id}/slow`)];
    await new Promise((r) => setTimeout(r, 50));
    const over = await app.request(`/a/${agent.id}/x`);
    expect(over.status).toBe(429);
    expect(over.headers.get("retry-after")).toBe("1");
    for (const res of await Promise.all(hanging)) {
      expect(res.status).toBe(504);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe("gateway_timeout");
    }
    // A response counts against the tenant until its body is read to the end.
    const ok = await app.request(`/a/${agent.id}/x`);
    expect(ok.status).toBe(200);
    await ok.text();

    const drip = await app.request(`/a/${agent.id}/drip`);
    const reader = drip.body!.getReader();
    expect(new TextDecoder().decode((await reader.read()).value)).toBe("first\n");
    const started = Date.now();
    await expect(reader.read()).rejects.toThrow(/idle/);
    expect(Date.now() - started).toBeGreaterThanOrEqual(350);
    // The cut stream gave its tenant slot back.
    const after = await app.request(`/a/${agent.id}/x`);
    expect(after.status).toBe(200);
    await after.text();
  });

  it("per-agent limits set at creation apply on this entry too (413 below the global limit)", async () => {
    const agent = await create({ public: true, limits: { maxBodyBytes: 10 } });
    const res = await app.request(`/a/${agent.id}/x`, { method: "POST", body: "x".repeat(11) });
    expect(res.status).toBe(413);
  });
});

describe("the Node fast path over a fleet without withHold (remote hosts)", () => {
  let server: Server;
  let base: string;
  const lines: Record<string, unknown>[] = [];

  beforeAll(async () => {
    const log = createLogger({ write: (l) => lines.push(JSON.parse(l) as Record<string, unknown>) });
    const core = createProxyCore({ agents: repo, fleet, log, maxBodyBytes: 1000, proxy: config.proxy });
    const proxy = createNodeProxy({ core, fleet, auth, domain: undefined, log });
    server = createServer((req, res) => {
      if (!proxy.handle(req, res, false)) res.writeHead(404).end();
    });
    server.on("upgrade", (req, socket, head) => proxy.upgrade(req, socket, head));
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((r) => server.close(() => r())));

  it("forwards through fleet.forward with the same header rules and answers", async () => {
    const agent = await create({ public: true });
    const res = await fetch(`${base}/a/${agent.id}/hello?q=1`);
    expect(res.status).toBe(200);
    expect(res.headers.get("x-request-id")).toMatch(/^req_/);
    expect(res.headers.get("connection")).not.toBe("close"); // hop-by-hop from the agent dropped
    expect(await res.text()).toBe(`hello ${agent.id} /hello`);
    const bot = await fetch(`${base}/a/${agent.id}/healthz`);
    expect(bot.headers.get("x-wake")).toBe("none");
  });

  // These two once answered 200 on this path (its own copy of the forward skipped both limits): now it is forwardCall's.
  it("refuses a chunked body over the agent's body limit with 413, as the Hono path does", async () => {
    const agent = await create({ public: true, limits: { maxBodyBytes: 1000 } });
    const chunks = Array.from({ length: 10 }, () => new Uint8Array(1000).fill(120));
    const body = new ReadableStream<Uint8Array>({
      pull(c) {
        const next = chunks.shift();
        if (next) c.enqueue(next);
        else c.close();
      },
    });
    const res = await fetch(`${base}/a/${agent.id}/upload`, { method: "POST", body, duplex: "half" } as RequestInit);
    expect(res.headers.get("content-length")).not.toBe(null); // an error envelope, not a streamed agent answer
    expect(res.status).toBe(413);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe("payload_too_large");
  });

  it("cuts a response body that stalls after the agent's idle timeout", async () => {
    const agent = await create({ public: true, limits: { proxyIdleTimeoutMs: 300 } });
    const res = await fetch(`${base}/a/${agent.id}/drip`);
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    expect(new TextDecoder().decode((await reader.read()).value)).toBe("first\n");
    const started = Date.now();
    await expect(reader.read()).rejects.toThrow();
    const waited = Date.now() - started;
    expect(waited).toBeGreaterThanOrEqual(250);
    expect(waited).toBeLessThan(2000);
  });

  it("504 after the response timeout, and WebSockets are refused with a clear error", async () => {
    const agent = await create({ public: true });
    const res = await fetch(`${base}/a/${agent.id}/slow`);
    expect(res.status).toBe(504);
    const { request } = await import("node:http");
    const refusal = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = request(`${base}/a/${agent.id}/ws`, {
        headers: { connection: "Upgrade", upgrade: "websocket", "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==", "sec-websocket-version": "13" },
      });
      req.on("response", (r) => {
        let body = "";
        r.on("data", (c: Buffer) => (body += c.toString()));
        r.on("end", () => resolve({ status: r.statusCode ?? 0, body }));
      });
      req.on("upgrade", () => reject(new Error("upgraded")));
      req.on("error", reject);
      req.end();
    });
    expect(refusal.status).toBe(502);
    expect(refusal.body).toContain("cannot relay WebSockets");
  });
});

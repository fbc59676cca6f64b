// The standalone gateway (`npm run gateway`) and fleet-agent (`npm run fleet-agent`) as separate processes over real sockets and Postgres.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { and, desc, eq } from "drizzle-orm";
import { agents, hosts, tenants, vmEvents } from "../../schema/core.ts";
import { ensureDevKeys, mintToken, type DevKeys } from "../../compose/dev-keys.ts";
import { freshDatabase } from "../helpers/db.ts";
import { spawnNode, testComponentSecret, waitFor, type Child } from "../helpers/worker-stack.ts";
import { readEventStream } from "../helpers/streams.ts";

let database: Awaited<ReturnType<typeof freshDatabase>>;
let hostProc: Child & { match: RegExpMatchArray };
let hostId: string;
let gatewayProc: Child;
let gatewayUrl: string;
let keys: DevKeys;
let token: string;
const dirs: string[] = [];

beforeAll(async () => {
  database = await freshDatabase();
  const hostDir = mkdtempSync(join(tmpdir(), "agentvm-host-"));
  const gatewayDir = mkdtempSync(join(tmpdir(), "agentvm-gw-"));
  dirs.push(hostDir, gatewayDir);
  const host = await spawnNode(
    "scripts/fleet-agent.ts",
    {
      DATABASE_URL: database.url,
      COMPONENT_SECRET: testComponentSecret,
      DATA_DIR: hostDir,
      INGRESS_PORT: "0",
      DRIVER: "process",
      REAPER_INTERVAL_MS: "100",
      HEARTBEAT_INTERVAL_MS: "500",
      DRAIN_TIMEOUT_MS: "2000",
    },
    /fleet-agent (host_[0-9a-z]+) serving gateways at (http:\/\/\S+)/,
  );
  hostProc = host;
  hostId = host.match[1]!;
  keys = await ensureDevKeys(gatewayDir);
  const gateway = await spawnNode(
    "scripts/gateway.ts",
    { DATABASE_URL: database.url, COMPONENT_SECRET: testComponentSecret, DATA_DIR: gatewayDir, PORT: "0", AGENT_IMAGES: "demo,nosuch", LOG_LEVEL: "error" },
    /gateway listening at (http:\/\/\S+)/,
  );
  gatewayProc = gateway;
  gatewayUrl = gateway.match[1]!;
  token = await mintToken(keys.privateJwk, { tenant: "ten_remote", scopes: ["agents:invoke", "agents:admin"] });
  await database.db.insert(tenants).values([
    { id: "ten_remote", name: "remote" },
    { id: "ten_other", name: "other" },
  ]);
}, 120_000);

afterAll(async () => {
  await gatewayProc?.stop();
  await hostProc?.stop();
  await database?.close();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

async function call(path: string, init: RequestInit & { token?: string } = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  const bearer = init.token ?? token;
  if (bearer) headers.set("authorization", `Bearer ${bearer}`);
  return fetch(gatewayUrl + path, { ...init, headers });
}

async function createAgent(body: Record<string, unknown> = {}): Promise<string> {
  const res = await call("/v1/agents", { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" } });
  expect(res.status).toBe(201);
  return ((await res.json()) as { id: string }).id;
}

async function agentJson(id: string): Promise<{ state: string; inFlight: number }> {
  return (await (await call(`/v1/agents/${id}`)).json()) as { state: string; inFlight: number };
}

describe("gateway process → fleet-agent process", () => {
  it("registers the host with its ingress URL and heartbeats", async () => {
    const [row] = await database.db.select().from(hosts).where(eq(hosts.id, hostId));
    expect(row?.url).toBe(hostProc.match[2]);
    expect(row?.driver).toBe("process");
    const first = row!.lastHeartbeatAt.getTime();
    await waitFor(
      async () => {
        const [again] = await database.db.select().from(hosts).where(eq(hosts.id, hostId));
        return again!.lastHeartbeatAt.getTime() > first;
      },
      5000,
      "a newer heartbeat",
    );
  });

  it("wake → call → hibernate → wake across the process boundary; the agent is placed on the host", async () => {
    const id = await createAgent({ idleTimeoutMs: 60_000 });
    const first = await call(`/a/${id}/counter`, { method: "POST" });
    expect(first.status).toBe(200);
    expect(first.headers.get("x-wake")).toBe("boot");
    expect(first.headers.get("server-timing")).toMatch(/boot;dur=/);
    expect(first.headers.get("x-request-id")).toMatch(/^req_/);
    expect(await first.json()).toEqual({ count: 1 });
    const [placed] = await database.db.select({ hostId: agents.hostId }).from(agents).where(eq(agents.id, id));
    expect(placed?.hostId).toBe(hostId);

    const warm = await call(`/a/${id}/counter`, { method: "POST" });
    expect(warm.headers.get("x-wake")).toBe("warm");
    expect(await warm.json()).toEqual({ count: 2 });

    const hib = await call(`/v1/agents/${id}/hibernate`, { method: "POST" });
    expect(await hib.json()).toMatchObject({ state: "hibernated" });
    expect((await agentJson(id)).state).toBe("hibernated");

    const woke = await call(`/a/${id}/counter`, { method: "POST" });
    expect(woke.headers.get("x-wake")).toBe("restore");
    expect(await woke.json()).toEqual({ count: 3 });

    const wake = await call(`/v1/agents/${id}/wake`, { method: "POST" });
    expect(await wake.json()).toMatchObject({ state: "running", wake: "warm" });
    const lease = await call(`/v1/agents/${id}/leases`, {
      method: "POST",
      body: JSON.stringify({ ttlMs: 60_000 }),
      headers: { "content-type": "application/json" },
    });
    expect(lease.status).toBe(201);
    const { leaseId } = (await lease.json()) as { leaseId: string };
    expect((await call(`/v1/agents/${id}/leases/${leaseId}`, { method: "DELETE" })).status).toBe(200);
    expect((await call(`/v1/agents/${id}/leases/${leaseId}`, { method: "DELETE" })).status).toBe(404);
  });

  it("the host hibernates an idle agent by itself", async () => {
    const id = await createAgent({ idleTimeoutMs: 800 });
    expect((await call(`/a/${id}/`)).status).toBe(200);
    await waitFor(async () => (await agentJson(id)).state === "hibernated", 8000, "idle hibernation");
    // The host writes its event log off the request path: the row may land just after the state is visible.
    const lastEvent = async () => (await database.db.select().from(vmEvents).where(eq(vmEvents.agentId, id)).orderBy(desc(vmEvents.id)).limit(1))[0];
    await waitFor(async () => (await lastEvent())?.toState === "hibernated", 3000, "the hibernation in the event log");
    expect(await lastEvent()).toMatchObject({ toState: "hibernated", reason: "idle", hostId });
  });

  it("streams: SSE events arrive one by one, request bodies stream in", async () => {
    const id = await createAgent();
    const res = await call(`/a/${id}/sse?n=5&intervalMs=300`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("text/event-stream");
    const { arrivals } = await readEventStream(res);
    expect(arrivals).toHaveLength(5);
    // Buffered delivery would land all five at once; streamed ones arrive ~300 ms apart.
    expect(arrivals[4]! - arrivals[0]!).toBeGreaterThan(900);
    for (let i = 1; i < 5; i++) expect(arrivals[i]! - arrivals[i - 1]!).toBeGreaterThan(150);

    const body = new Uint8Array(3 * 1024 * 1024).map((_, i) => i % 251);
    const echo = await call(`/a/${id}/echo`, { method: "POST", body, headers: { "content-type": "application/octet-stream" } });
    expect(echo.status).toBe(200);
    const back = new Uint8Array(await echo.arrayBuffer());
    expect(back.byteLength).toBe(body.byteLength);
    expect(back[12345]).toBe(body[12345]);
  });

  it("a client that goes away mid-stream releases the agent on the host", async () => {
    const id = await createAgent();
    const abort = new AbortController();
    const res = await call(`/a/${id}/sse?n=100000&intervalMs=50`, { signal: abort.signal });
    const reader = res.body!.getReader();
    await reader.read();
    await reader.read();
    expect((await agentJson(id)).inFlight).toBe(1);
    abort.abort();
    await waitFor(async () => (await agentJson(id)).inFlight === 0, 5000, "the stream released on the host");
  });

  it("errors keep their codes across the hop; the agent's own statuses pass through as its own", async () => {
    const id = await createAgent();
    const own = await call(`/a/${id}/status/503`);
    expect(own.status).toBe(503);
    expect(await own.json()).toEqual({ status: 503 });
    expect(own.headers.get("x-agentvm-error")).toBeNull();

    const broken = await createAgent({ image: "nosuch" });
    const failed = await call(`/a/${broken}/`);
    expect(failed.status).toBe(503);
    expect(failed.headers.get("retry-after")).toBe("5");
    const body = (await failed.json()) as { error: { code: string; requestId: string } };
    expect(body.error.code).toBe("wake_failed");
    expect(body.error.requestId).toBe(failed.headers.get("x-request-id"));

    expect((await call(`/a/${id}/`, { token: "" })).status).toBe(401);
    expect((await call(`/a/${id}/`, { token: "bad.token.here" })).status).toBe(401);
    const other = await mintToken(keys.privateJwk, { tenant: "ten_other", scopes: ["agents:invoke", "agents:admin"] });
    expect((await call(`/a/${id}/`, { token: other })).status).toBe(404);
  });

  it("SIGTERM: the fleet-agent drains and hibernates its agents, exits 0; then calls answer 503 with Retry-After (never a bare 502)", async () => {
    const id = await createAgent();
    expect((await call(`/a/${id}/`)).status).toBe(200);
    expect(await hostProc.stop()).toBe(0);
    const rows = await database.db
      .select()
      .from(vmEvents)
      .where(and(eq(vmEvents.agentId, id), eq(vmEvents.toState, "hibernated")));
    expect(rows.map((r) => r.reason)).toEqual(["shutdown"]);
    const res = await call(`/a/${id}/`);
    expect(res.status).toBe(503);
    expect(Number(res.headers.get("retry-after"))).toBeGreaterThan(0);
    expect(((await res.json()) as { error: { code: string; message: string } }).error).toMatchObject({
      code: "host_unavailable",
      message: expect.stringMatching(/unreachable/),
    });
  });
});

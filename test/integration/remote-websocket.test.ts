// WebSockets across processes: a standalone gateway (`scripts/gateway.ts`) → the host ingress of a fleet-agent (process driver), with the `ws` client and the demo workload.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { and, eq } from "drizzle-orm";
import type WebSocket from "ws";
import { componentKey } from "../../lib/host-token.ts";
import { agents, tenants, vmEvents } from "../../schema/core.ts";
import { hostErrorHeader, hostOpPaths, hostTokenHeader, signHostCall } from "../../contracts/host-protocol.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import { ensureDevKeys, mintToken } from "../../compose/dev-keys.ts";
import { freshDatabase } from "../helpers/db.ts";
import { openWebSocket, type Opened } from "../helpers/streams.ts";
import { spawnNode, startHostInProcess, testComponentSecret, waitFor, type Child, type InProcessHost } from "../helpers/worker-stack.ts";

let database: Awaited<ReturnType<typeof freshDatabase>>;
let host: InProcessHost;
let gateway: Child & { match: RegExpMatchArray };
let gatewayUrl: string;
let token: string;
const dirs: string[] = [];

beforeAll(async () => {
  database = await freshDatabase();
  await database.db.insert(tenants).values({ id: "ten_ws", name: "ws" });
  host = await startHostInProcess(database);
  const gatewayDir = mkdtempSync(join(tmpdir(), "agentvm-gw-"));
  dirs.push(gatewayDir);
  const keys = await ensureDevKeys(gatewayDir);
  gateway = await spawnNode(
    "scripts/gateway.ts",
    {
      DATABASE_URL: database.url,
      COMPONENT_SECRET: testComponentSecret,
      DATA_DIR: gatewayDir,
      PORT: "0",
      AGENT_IMAGES: "demo",
      LOG_LEVEL: "error",
      PLACEMENT_CACHE_MS: "0",
    },
    /gateway listening at (http:\/\/\S+)/,
  );
  gatewayUrl = gateway.match[1]!;
  token = await mintToken(keys.privateJwk, { tenant: "ten_ws", scopes: ["agents:invoke", "agents:admin"] });
}, 120_000);

afterAll(async () => {
  await gateway?.stop();
  await host?.stop();
  await database?.close();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

async function call(path: string, init: RequestInit = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  headers.set("authorization", `Bearer ${token}`);
  if (init.body) headers.set("content-type", "application/json");
  return fetch(gatewayUrl + path, { ...init, headers });
}

async function createAgent(body: Record<string, unknown>): Promise<string> {
  const res = await call("/v1/agents", { method: "POST", body: JSON.stringify(body) });
  expect(res.status).toBe(201);
  return ((await res.json()) as { id: string }).id;
}

interface Refused {
  status: number;
  body: string;
  headers: Record<string, string>;
}

function open(url: string, headers: Record<string, string> = { authorization: `Bearer ${token}` }): Promise<Opened> {
  return openWebSocket(url, headers);
}

const viaGateway = (path: string) => gatewayUrl.replace(/^http/, "ws") + path;

function closed(ws: WebSocket): Promise<{ code: number; reason: string }> {
  return new Promise((resolve) => ws.once("close", (code, reason) => resolve({ code, reason: reason.toString() })));
}

describe("WebSockets: standalone gateway → host ingress", () => {
  it("the upgrade wakes the agent on its host; text and binary frames come back unchanged", async () => {
    const id = await createAgent({ idleTimeoutMs: 60_000 });
    expect(host.host.status(id)).toBeUndefined();
    const { ws, response } = await open(viaGateway(`/a/${id}/ws/echo`));
    expect(response.headers["x-wake"]).toBe("boot");
    expect(response.headers["x-request-id"]).toMatch(/^req_/);
    expect(host.host.status(id)?.state).toBe("running");

    const replies: { data: Buffer; binary: boolean }[] = [];
    ws.on("message", (data: Buffer, binary) => replies.push({ data, binary }));
    const big = Buffer.alloc(2 * 1024 * 1024);
    for (let i = 0; i < big.length; i++) big[i] = (i * 31) & 0xff;
    ws.send("hello");
    ws.send(big);
    ws.send("bye");
    await waitFor(() => replies.length === 3, 10_000, "three echoes");
    expect(replies[0]).toEqual({ data: Buffer.from("hello"), binary: false });
    expect(replies[1]!.binary).toBe(true);
    expect(replies[1]!.data.equals(big)).toBe(true);
    expect(replies[2]!.data.toString()).toBe("bye");
    const gone = closed(ws);
    ws.close(1000, "done");
    expect((await gone).code).toBe(1000);
    // The host's ticket is released once the socket is gone.
    await waitFor(() => host.host.status(id)?.inFlight === 0, 3000, "ticket released on the host");
  });

  it("server push keeps the agent awake on its host (frames counted there); once quiet the host hibernates it and the client gets 1001", async () => {
    const id = await createAgent({ idleTimeoutMs: 300, streamIdleMs: 600 });
    const { ws } = await open(viaGateway(`/a/${id}/ws/push?intervalMs=100&n=20`));
    const messages: number[] = [];
    ws.on("message", (d: Buffer) => messages.push((JSON.parse(d.toString()) as { i: number }).i));
    const end = closed(ws);
    await new Promise((r) => setTimeout(r, 1500)); // well past idle timeout + stream idle window
    expect(host.host.status(id)?.state).toBe("running");
    const { code, reason } = await end;
    expect(messages).toEqual(Array.from({ length: 20 }, (_, i) => i));
    expect(code).toBe(1001);
    expect(reason).toBe("agent hibernating");
    await waitFor(() => host.host.status(id)?.state === "hibernated", 3000, "hibernated");
  });

  it("an idle socket gets 1001 when the host hibernates the agent; the reconnect wakes it (x-wake: restore on the 101)", async () => {
    const id = await createAgent({ idleTimeoutMs: 300, streamIdleMs: 400 });
    const first = await open(viaGateway(`/a/${id}/ws/echo`));
    expect(first.response.headers["x-wake"]).toBe("boot");
    const { code, reason } = await closed(first.ws);
    expect(code).toBe(1001);
    expect(reason).toBe("agent hibernating");
    await waitFor(() => host.host.status(id)?.state === "hibernated", 3000, "hibernated");
    await host.host.flush();
    const events = await database.db
      .select()
      .from(vmEvents)
      .where(and(eq(vmEvents.agentId, id), eq(vmEvents.toState, "hibernated")));
    expect(events[0]?.reason).toBe("idle");

    const again = await open(viaGateway(`/a/${id}/ws/echo`));
    expect(again.response.headers["x-wake"]).toBe("restore");
    expect(host.host.status(id)?.state).toBe("running");
    const reply = new Promise<string>((r) => again.ws.once("message", (d: Buffer) => r(d.toString())));
    again.ws.send("back");
    expect(await reply).toBe("back");
    const gone = closed(again.ws);
    again.ws.close();
    await gone;
  });

  it("the agent's proxy idle timeout travels in the token: the host closes a silent socket with 1001 'idle timeout', the agent stays up", async () => {
    const id = await createAgent({ idleTimeoutMs: 60_000, streamIdleMs: 60_000 });
    const patch = await call(`/v1/agents/${id}`, { method: "PATCH", body: JSON.stringify({ limits: { proxyIdleTimeoutMs: 500 } }) });
    expect(patch.status).toBe(200);
    const { ws } = await open(viaGateway(`/a/${id}/ws/echo`));
    const opened = Date.now();
    const { code, reason } = await closed(ws);
    expect(code).toBe(1001);
    expect(reason).toBe("idle timeout");
    expect(Date.now() - opened).toBeGreaterThanOrEqual(450);
    expect(host.host.status(id)?.state).toBe("running");
    await waitFor(() => host.host.status(id)?.inFlight === 0, 3000, "ticket released");
  });

  it("the agent's refusal and the gateway's own errors reach the client", async () => {
    const id = await createAgent({ idleTimeoutMs: 60_000 });
    const refused = (await open(viaGateway(`/a/${id}/ws/nope`)).catch((e: unknown) => e)) as Refused;
    expect(refused.status).toBe(404);
    expect(refused.body).toBe("no socket\n");
    const anon = (await open(viaGateway(`/a/${id}/ws/echo`), {}).catch((e: unknown) => e)) as Refused;
    expect(anon.status).toBe(401);
    expect((JSON.parse(anon.body) as { error: { code: string } }).error.code).toBe("unauthorized");
  });
});

describe("the host ingress's WebSocket route", () => {
  const viaHost = () => host.url.replace(/^http/, "ws") + hostOpPaths.websocket;

  async function spec(): Promise<AgentSpec> {
    const id = await createAgent({ idleTimeoutMs: 60_000 });
    const [row] = await database.db.select().from(agents).where(eq(agents.id, id));
    // With the lease generation its placement at creation gave it: a host wakes no copy of an older generation.
    return {
      id,
      tenantId: row!.tenantId,
      image: row!.image,
      vcpus: 1,
      memMiB: 256,
      idleTimeoutMs: 60_000,
      streamIdleMs: 60_000,
      allowEgress: false,
      generation: row!.generation,
    };
  }
  const websocketCall = (agent: AgentSpec) => ({
    op: "websocket" as const,
    agent,
    reason: "request" as const,
    path: "/ws/echo",
    requestId: "req_direct0001",
    proxyIdleTimeoutMs: 60_000,
    responseTimeoutMs: 30_000,
  });

  it("refuses an upgrade without a token, with another secret's token or with another op's token: 401 envelope, no wake", async () => {
    const agent = await spec();
    const wrongKey = await signHostCall(componentKey("another-component-secret-0123456789abcdef"), host.hostId, websocketCall(agent));
    const otherOp = await signHostCall(componentKey(testComponentSecret), host.hostId, { op: "wake", agent, reason: "request" });
    const otherHost = await signHostCall(componentKey(testComponentSecret), "host_elsewhere", websocketCall(agent));
    const attempts: Record<string, string>[] = [
      {},
      { [hostTokenHeader]: wrongKey },
      { [hostTokenHeader]: otherOp },
      { [hostTokenHeader]: otherHost },
      { [hostTokenHeader]: "not-a-token" },
    ];
    for (const headers of attempts) {
      const err = (await open(viaHost(), headers).catch((e: unknown) => e)) as Refused;
      expect(err.status).toBe(401);
      expect(err.headers[hostErrorHeader]).toBe("unauthorized");
      expect((JSON.parse(err.body) as { error: { code: string } }).error.code).toBe("unauthorized");
    }
    expect(host.host.status(agent.id)).toBeUndefined();
  });

  it("a valid token opens the socket straight to the agent (the gateway's only job is joining bytes)", async () => {
    const agent = await spec();
    const good = await signHostCall(componentKey(testComponentSecret), host.hostId, websocketCall(agent));
    const { ws, response } = await open(viaHost(), { [hostTokenHeader]: good });
    expect(response.headers["x-wake"]).toBe("boot");
    expect(response.headers["x-request-id"]).toBe("req_direct0001");
    const reply = new Promise<string>((r) => ws.once("message", (d: Buffer) => r(d.toString())));
    ws.send("direct");
    expect(await reply).toBe("direct");
    const gone = closed(ws);
    ws.close();
    await gone;
    await waitFor(() => host.host.status(agent.id)?.inFlight === 0, 3000, "ticket released");
  });

  it("an unknown upgrade path is 404 with the host's envelope", async () => {
    const err = (await open(`${host.url.replace(/^http/, "ws")}/v1/nothing`, {}).catch((e: unknown) => e)) as Refused;
    expect(err.status).toBe(404);
    expect(err.headers[hostErrorHeader]).toBe("not_found");
  });
});

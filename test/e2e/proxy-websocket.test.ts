// WebSockets through the gateway with a real `ws` client and the demo workload: wake on upgrade, frames both ways,
// server push keeps the agent awake, close 1001 before hibernating, reconnect wakes, pings do not pin the VM.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eq } from "drizzle-orm";
import type WebSocket from "ws";
import { vmEvents } from "../../schema/core.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";
import { waitFor } from "../helpers/wait.ts";
import { openWebSocket, type Opened } from "../helpers/streams.ts";

let sys: TestSystem;

beforeAll(async () => {
  sys = await startSystem();
});
afterAll(async () => {
  await sys?.stop();
});

const wsUrl = (path: string) => sys.url.replace(/^http/, "ws") + path;

function open(path: string, token: string | null = sys.demo.token): Promise<Opened> {
  return openWebSocket(wsUrl(path), token ? { authorization: `Bearer ${token}` } : {});
}

function closed(ws: WebSocket): Promise<{ code: number; reason: string; at: number }> {
  return new Promise((resolve) => ws.once("close", (code, reason) => resolve({ code, reason: reason.toString(), at: Date.now() })));
}

describe("WebSockets", () => {
  it("the upgrade wakes a sleeping agent; text and binary frames come back unchanged", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    expect(await sys.state(agent.id)).toBe("creating");
    const { ws, response } = await open(`/a/${agent.id}/ws/echo`);
    expect(response.headers["x-wake"]).toBe("boot");
    expect(response.headers["x-request-id"]).toMatch(/^req_/);
    expect(await sys.state(agent.id)).toBe("running");

    const replies: { data: Buffer; binary: boolean }[] = [];
    ws.on("message", (data: Buffer, binary) => replies.push({ data, binary }));
    const big = Buffer.alloc(3 * 1024 * 1024);
    for (let i = 0; i < big.length; i++) big[i] = (i * 31) & 0xff;
    ws.send("hello");
    ws.send(big);
    ws.send("bye");
    await waitFor(async () => replies.length === 3, 10_000);
    expect(replies[0]).toEqual({ data: Buffer.from("hello"), binary: false });
    expect(replies[1]!.binary).toBe(true);
    expect(replies[1]!.data.equals(big)).toBe(true);
    expect(replies[2]!.data.toString()).toBe("bye");
    const gone = closed(ws);
    ws.close(1000, "done");
    expect((await gone).code).toBe(1000);
    await waitFor(async () => ((await (await sys.call(`/v1/agents/${agent.id}`)).json()) as { inFlight: number }).inFlight === 0, 3000);
  });

  it("server push keeps the agent awake with no inbound traffic; once quiet it hibernates, the client gets 1001, and a reconnect wakes it", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 300, streamIdleMs: 600 });
    const { ws } = await open(`/a/${agent.id}/ws/push?intervalMs=100&n=25`);
    const messages: { i: number }[] = [];
    ws.on("message", (d: Buffer) => messages.push(JSON.parse(d.toString()) as { i: number }));
    const end = closed(ws);
    // 2.5 s of pushes: far beyond idle timeout + stream idle window, yet the agent must stay up.
    await new Promise((r) => setTimeout(r, 2000));
    expect(await sys.state(agent.id)).toBe("running");
    const pushEnded = Date.now() + 500;
    const { code, reason, at } = await end;
    expect(messages.map((m) => m.i)).toEqual(Array.from({ length: 25 }, (_, i) => i));
    expect(code).toBe(1001);
    expect(reason).toBe("agent hibernating");
    // Not before the stream was quiet for its window.
    expect(at - pushEnded).toBeGreaterThanOrEqual(500);
    await waitFor(async () => (await sys.state(agent.id)) === "hibernated", 3000);
    await sys.host.flush();
    const events = await sys.database.db.select().from(vmEvents).where(eq(vmEvents.agentId, agent.id));
    expect(events.find((e) => e.toState === "hibernated")?.reason).toBe("idle");
    const before = await sys.wakes(agent.id);

    const again = await open(`/a/${agent.id}/ws/echo`);
    expect(again.response.headers["x-wake"]).toBe("restore");
    expect(await sys.wakes(agent.id)).toBe(before + 1);
    const reply = new Promise<string>((r) => again.ws.once("message", (d: Buffer) => r(d.toString())));
    again.ws.send("back");
    expect(await reply).toBe("back");
    again.ws.close();
  });

  it("pings alone do not keep the agent awake: the socket gets 1001 and the agent hibernates", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 300, streamIdleMs: 500 });
    const { ws } = await open(`/a/${agent.id}/ws/echo`);
    let pongs = 0;
    ws.on("pong", () => pongs++);
    const pinger = setInterval(() => ws.ping(), 100);
    const { code } = await closed(ws);
    clearInterval(pinger);
    expect(pongs).toBeGreaterThan(3); // the pings did flow, through to the agent and back
    expect(code).toBe(1001);
    await waitFor(async () => (await sys.state(agent.id)) === "hibernated", 3000);
  });

  it("a socket with no bytes either way for the agent's proxy idle timeout is closed with 1001 (the agent stays up)", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000, streamIdleMs: 60_000 });
    const patch = await sys.call(`/v1/agents/${agent.id}`, { method: "PATCH", body: JSON.stringify({ limits: { proxyIdleTimeoutMs: 500 } }) });
    expect(patch.status).toBe(200);
    const { ws } = await open(`/a/${agent.id}/ws/echo`);
    const opened = Date.now();
    const { code, reason, at } = await closed(ws);
    expect(code).toBe(1001);
    expect(reason).toBe("idle timeout");
    expect(at - opened).toBeGreaterThanOrEqual(450);
    expect(await sys.state(agent.id)).toBe("running");
  });

  it("an upgrade the agent refuses is passed on as its response; without a token it is 401 with the error envelope", async () => {
    const agent = await sys.createAgent();
    const refused = await open(`/a/${agent.id}/ws/nope`).catch((e: { status: number; body: string }) => e);
    expect((refused as { status: number }).status).toBe(404);
    expect((refused as { body: string }).body).toBe("no socket\n");
    const anon = await open(`/a/${agent.id}/ws/echo`, null).catch((e: { status: number; body: string; headers: Record<string, string> }) => e);
    const err = anon as { status: number; body: string; headers: Record<string, string> };
    expect(err.status).toBe(401);
    const body = JSON.parse(err.body) as { error: { code: string; requestId: string } };
    expect(body.error.code).toBe("unauthorized");
    expect(body.error.requestId).toBe(err.headers["x-request-id"]);
    const unknown = await open(`/a/agt_doesnotexist/ws/echo`).catch((e: { status: number }) => e);
    expect((unknown as { status: number }).status).toBe(404);
  });
});

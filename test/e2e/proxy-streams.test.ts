// Long streams over real sockets: SSE with no total timeout, the idle timeout with its log line, client aborts seen by
// the agent, background work after 202 that hibernation does not cut, and 504 on a slow agent.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { request } from "node:http";
import { eq } from "drizzle-orm";
import { EventSource } from "undici";
import { createLogger } from "../../lib/log.ts";
import { vmEvents } from "../../schema/core.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";
import { waitFor } from "../helpers/wait.ts";

let sys: TestSystem;
const logLines: Record<string, unknown>[] = [];

beforeAll(async () => {
  sys = await startSystem({
    env: { PROXY_IDLE_TIMEOUT_MS: "1000" },
    log: createLogger({ level: "info", write: (line) => logLines.push(JSON.parse(line) as Record<string, unknown>) }),
  });
});
afterAll(async () => {
  await sys?.stop();
});

async function aborts(id: string): Promise<number> {
  return ((await (await sys.call(`/a/${id}/stats`)).json()) as { aborted: number }).aborted;
}

async function patchLimits(id: string, limits: Record<string, number | null>): Promise<void> {
  const res = await sys.call(`/v1/agents/${id}`, { method: "PATCH", body: JSON.stringify({ limits }) });
  expect(res.status).toBe(200);
}

describe("long streams", () => {
  it("an SSE stream lasting 4× the idle timeout arrives whole while events keep flowing, and keeps the agent awake", async () => {
    const agent = await sys.createAgent({ public: true, idleTimeoutMs: 300, streamIdleMs: 500 });
    const arrivals: number[] = [];
    let midState = "";
    await new Promise<void>((resolve, reject) => {
      const es = new EventSource(`${sys.url}/a/${agent.id}/sse?n=20&intervalMs=200`);
      es.onmessage = (ev) => {
        arrivals.push((JSON.parse(ev.data as string) as { i: number }).i);
        if (arrivals.length === 12) void sys.state(agent.id).then((s) => (midState = s));
        if (arrivals.length === 20) {
          es.close();
          resolve();
        }
      };
      es.onerror = () => {
        if (arrivals.length < 20) reject(new Error(`EventSource failed after ${arrivals.length} events`));
      };
    });
    expect(arrivals).toEqual(Array.from({ length: 20 }, (_, i) => i));
    expect(midState).toBe("running");
  });

  it("a stream silent for longer than the agent's proxy idle timeout is ended with a log line, and the agent sees the abort", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    await patchLimits(agent.id, { proxyIdleTimeoutMs: 400 });
    const before = await aborts(agent.id);
    const started = Date.now();
    const res = await sys.call(`/a/${agent.id}/sse?n=3&intervalMs=3000`);
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    const first = await reader.read();
    expect(new TextDecoder().decode(first.value)).toContain('"i":0');
    await expect(reader.read()).rejects.toThrow();
    const cutAfter = Date.now() - started;
    expect(cutAfter).toBeGreaterThanOrEqual(400);
    expect(cutAfter).toBeLessThan(2500);
    const line = logLines.find((l) => l.msg === "stream idle timeout: ended" && l.agentId === agent.id);
    expect(line).toMatchObject({ level: "warn", limitMs: 400, phase: "streaming" });
    expect(line!.requestId).toBe(res.headers.get("x-request-id"));
    await waitFor(async () => (await aborts(agent.id)) === before + 1, 3000);
  });

  it("a client that goes away mid-response aborts the agent's request at once and frees the agent", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    const before = await aborts(agent.id);
    const ctl = new AbortController();
    const pending = sys.call(`/a/${agent.id}/slow?ms=10000`, { signal: ctl.signal }).catch(() => "aborted");
    await new Promise((r) => setTimeout(r, 300));
    const abortedAt = Date.now();
    ctl.abort();
    expect(await pending).toBe("aborted");
    await waitFor(async () => (await aborts(agent.id)) === before + 1, 3000);
    expect(Date.now() - abortedAt).toBeLessThan(1000);
    const info = (await (await sys.call(`/v1/agents/${agent.id}`)).json()) as { inFlight: number };
    expect(info.inFlight).toBe(0);
  });

  it("a download cut by its client mid-body is seen by the agent too", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    const before = await aborts(agent.id);
    await new Promise<void>((resolve, reject) => {
      const req = request(`${sys.url}/a/${agent.id}/bytes?size=${500 * 1024 * 1024}`, { headers: { authorization: `Bearer ${sys.demo.token}` } }, (res) => {
        let got = 0;
        res.on("data", (c: Buffer) => {
          got += c.length;
          if (got > 1024 * 1024) {
            req.destroy();
            resolve();
          }
        });
      });
      req.on("error", () => undefined);
      req.on("close", () => resolve());
      setTimeout(() => reject(new Error("no data")), 10_000);
      req.end();
    });
    await waitFor(async () => (await aborts(agent.id)) === before + 1, 3000);
  });

  it("background work started after a 202 is not cut by hibernation: its CPU keeps the agent awake until it ends", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 300 });
    const res = await sys.call(`/a/${agent.id}/work?seconds=2`, { method: "POST" });
    expect(res.status).toBe(202);
    const workEnds = Date.now() + 2000;
    await new Promise((r) => setTimeout(r, 1500));
    expect(await sys.state(agent.id)).toBe("running");
    await waitFor(async () => (await sys.state(agent.id)) === "hibernated", 8000);
    await sys.host.flush();
    const events = await sys.database.db.select().from(vmEvents).where(eq(vmEvents.agentId, agent.id));
    const snapshot = events.find((e) => e.toState === "snapshotting");
    expect(snapshot?.reason).toBe("idle");
    expect(snapshot!.at.getTime()).toBeGreaterThanOrEqual(workEnds - 100);
  });
});

describe("timeouts", () => {
  it("an agent slower than its response timeout is a 504 with the envelope, and the agent's request is aborted", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    await patchLimits(agent.id, { responseTimeoutMs: 300 });
    const before = await aborts(agent.id);
    const started = Date.now();
    const res = await sys.call(`/a/${agent.id}/slow?ms=5000`);
    const took = Date.now() - started;
    expect(res.status).toBe(504);
    const body = (await res.json()) as { error: { code: string; message: string; requestId: string } };
    expect(body.error.code).toBe("gateway_timeout");
    expect(body.error.message).toContain("300 ms");
    expect(body.error.requestId).toBe(res.headers.get("x-request-id"));
    expect(took).toBeGreaterThanOrEqual(300);
    expect(took).toBeLessThan(2000);
    await waitFor(async () => (await aborts(agent.id)) === before + 1, 3000);
    // A fast call to the same agent still works, and resetting the limit to the global value lets slow calls finish.
    expect((await sys.call(`/a/${agent.id}/slow?ms=100`)).status).toBe(200);
    await patchLimits(agent.id, { responseTimeoutMs: null });
    const view = (await (await sys.call(`/v1/agents/${agent.id}`)).json()) as { limits: { responseTimeoutMs: number } };
    expect(view.limits.responseTimeoutMs).toBe(300_000);
    expect((await sys.call(`/a/${agent.id}/slow?ms=600`)).status).toBe(200);
  });
});

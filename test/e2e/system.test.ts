// End to end over real sockets with the process driver and real Postgres: wake, proxy, hibernate, leases, bad input.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fileURLToPath } from "node:url";
import { eq } from "drizzle-orm";
import { EventSource } from "undici";
import { generateKeyPair, SignJWT } from "jose";
import { runs, vmEvents } from "../../schema/core.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";
import { waitFor } from "../helpers/wait.ts";

const inspect = [process.execPath, fileURLToPath(new URL("../helpers/workloads/inspect.ts", import.meta.url))];

let sys: TestSystem;

beforeAll(async () => {
  sys = await startSystem({
    images: { inspect, broken: [process.execPath, "-e", "process.exit(7)"] },
    env: { MAX_BODY_BYTES: "100000" },
  });
});
afterAll(async () => {
  await sys?.stop();
});

describe("wake → proxy → hibernate", () => {
  it("first call boots the agent; counter state survives hibernate and wake", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    expect(agent.state).toBe("creating");
    const first = await sys.call(`/a/${agent.id}/counter`, { method: "POST" });
    expect(first.status).toBe(200);
    expect(first.headers.get("x-wake")).toBe("boot");
    expect(first.headers.get("server-timing")).toMatch(/boot;dur=/);
    expect(first.headers.get("x-request-id")).toMatch(/^req_/);
    expect(await first.json()).toEqual({ count: 1 });
    const warm = await sys.call(`/a/${agent.id}/counter`, { method: "POST" });
    expect(warm.headers.get("x-wake")).toBe("warm");
    expect(await warm.json()).toEqual({ count: 2 });

    const hib = await sys.call(`/v1/agents/${agent.id}/hibernate`, { method: "POST" });
    expect(await hib.json()).toMatchObject({ state: "hibernated" });
    expect(await sys.state(agent.id)).toBe("hibernated");

    const woke = await sys.call(`/a/${agent.id}/counter`, { method: "POST" });
    expect(woke.headers.get("x-wake")).toBe("restore");
    expect(await woke.json()).toEqual({ count: 3 });
    expect(await sys.wakes(agent.id)).toBe(2);
  });

  it("hibernates by itself after the idle timeout, not before", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 800 });
    expect((await sys.call(`/a/${agent.id}/`)).status).toBe(200);
    const lastCall = Date.now();
    await waitFor(async () => (await sys.state(agent.id)) === "hibernated", 5000);
    expect(Date.now() - lastCall).toBeGreaterThanOrEqual(800);
    await sys.host.flush();
    const events = await sys.database.db.select().from(vmEvents).where(eq(vmEvents.agentId, agent.id));
    const hibernated = events.find((e) => e.toState === "hibernated");
    expect(hibernated?.reason).toBe("idle");
    expect(events.map((e) => e.toState)).toEqual(["booting", "running", "snapshotting", "hibernated"]);
  });

  it("100 concurrent calls to a sleeping agent cause exactly one wake and 100 successes", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    await sys.call(`/a/${agent.id}/`);
    await sys.call(`/v1/agents/${agent.id}/hibernate`, { method: "POST" });
    expect(await sys.wakes(agent.id)).toBe(1);
    const results = await Promise.all(
      Array.from({ length: 100 }, () =>
        sys
          .call(`/a/${agent.id}/counter`, { method: "POST" })
          .then(async (r) => ({ status: r.status, wake: r.headers.get("x-wake"), body: (await r.json()) as { count: number } })),
      ),
    );
    expect(results.filter((r) => r.status === 200)).toHaveLength(100);
    expect(new Set(results.map((r) => r.body.count)).size).toBe(100);
    // Those that arrived during the wake waited for it; any that arrived after found the agent warm.
    expect(results.filter((r) => r.wake === "restore").length).toBeGreaterThan(0);
    expect(results.every((r) => r.wake === "restore" || r.wake === "warm")).toBe(true);
    expect(await sys.wakes(agent.id)).toBe(2);
  });

  it("streams Server-Sent Events one by one to an EventSource client", async () => {
    const agent = await sys.createAgent({ public: true });
    const arrivals: { i: number; at: number }[] = [];
    await new Promise<void>((resolve, reject) => {
      const es = new EventSource(`${sys.url}/a/${agent.id}/sse?n=5&intervalMs=250`);
      es.onmessage = (ev) => {
        arrivals.push({ i: (JSON.parse(ev.data) as { i: number }).i, at: Date.now() });
        if (arrivals.length === 5) {
          es.close();
          resolve();
        }
      };
      es.onerror = () => {
        if (arrivals.length < 5) reject(new Error("EventSource failed"));
      };
    });
    expect(arrivals.map((a) => a.i)).toEqual([0, 1, 2, 3, 4]);
    // Buffered delivery would bring them all at the end; streamed, they come about 250 ms apart.
    for (let k = 1; k < arrivals.length; k++) expect(arrivals[k]!.at - arrivals[k - 1]!.at).toBeGreaterThan(150);
  });

  it("a keep-awake lease holds the agent past its idle timeout; dropping it lets it sleep", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 400 });
    const res = await sys.call(`/v1/agents/${agent.id}/leases`, { method: "POST", body: JSON.stringify({ ttlMs: 20_000 }) });
    expect(res.status).toBe(201);
    const { leaseId } = (await res.json()) as { leaseId: string };
    await new Promise((r) => setTimeout(r, 1500));
    expect(await sys.state(agent.id)).toBe("running");
    const drop = await sys.call(`/v1/agents/${agent.id}/leases/${leaseId}`, { method: "DELETE" });
    expect(drop.status).toBe(200);
    await waitFor(async () => (await sys.state(agent.id)) === "hibernated", 5000);
  });

  it("background CPU work keeps the agent awake past its idle timeout", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 400 });
    const res = await sys.call(`/a/${agent.id}/work?seconds=2`, { method: "POST" });
    expect(res.status).toBe(202);
    await new Promise((r) => setTimeout(r, 1500));
    expect(await sys.state(agent.id)).toBe("running");
    const slept = await waitFor(async () => (await sys.state(agent.id)) === "hibernated", 6000);
    expect(slept).toBeGreaterThan(0);
  });
});

describe("metering through the whole system", () => {
  it("an awake period is metered, shipped in-process and reported in usage and runs, matching the event log", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    const from = new Date(Date.now() - 60_000).toISOString();
    expect((await sys.call(`/a/${agent.id}/`)).status).toBe(200);
    await new Promise((r) => setTimeout(r, 700));
    expect(await (await sys.call(`/v1/agents/${agent.id}/hibernate`, { method: "POST" })).json()).toMatchObject({ state: "hibernated" });
    await sys.host.flush();
    const events = await sys.database.db.select().from(vmEvents).where(eq(vmEvents.agentId, agent.id));
    const awakeMs = events.find((e) => e.toState === "snapshotting")!.at.getTime() - events.find((e) => e.toState === "running")!.at.getTime();
    const to = new Date(Date.now() + 60_000).toISOString();
    let activeMs = 0;
    await waitFor(async () => {
      const usage = (await (await sys.call(`/v1/usage?from=${from}&to=${to}&groupBy=agent&agentId=${agent.id}`)).json()) as { totals: { activeMs: number } };
      activeMs = usage.totals.activeMs;
      return activeMs > 0;
    }, 10_000);
    // The meter measures on the host's monotonic clock; the event log stamps wall-clock times: they agree closely.
    expect(Math.abs(activeMs - awakeMs)).toBeLessThan(50);
    expect(activeMs).toBeGreaterThanOrEqual(600);
    const runs = (await (await sys.call(`/v1/agents/${agent.id}/runs`)).json()) as { runs: { wakeReason: string; sleepReason: string }[] };
    expect(runs.runs).toHaveLength(1);
    expect(runs.runs[0]).toMatchObject({ wakeReason: "request", sleepReason: "api" });
  });
});

describe("deleting an awake agent", () => {
  it("ends its run with the reason delete (an open run would be recorded as a crash at the host's next start)", async () => {
    const agent = await sys.createAgent();
    expect((await sys.call(`/a/${agent.id}/`)).status).toBe(200);
    expect((await sys.call(`/v1/agents/${agent.id}`, { method: "DELETE" })).status).toBe(200);
    await sys.host.flush();
    const rows = await sys.database.db.select().from(runs).where(eq(runs.agentId, agent.id));
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ sleepReason: "delete" });
    expect(rows[0]!.sleptAt).toBeInstanceOf(Date);
  });
});

describe("proxy behaviour", () => {
  it("forwards method, path, query and body; sets X-Forwarded-* and the request id; strips hop-by-hop and the bearer token", async () => {
    const agent = await sys.createAgent({ image: "inspect" });
    const res = await sys.call(`/a/${agent.id}/some/path?q=1`, { method: "PUT", body: "hello", headers: { "x-client": "c", "proxy-authorization": "secret" } });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-custom")).toBe("yes");
    const seen = (await res.json()) as { method: string; url: string; bytes: number; headers: Record<string, string> };
    expect(seen.method).toBe("PUT");
    expect(seen.url).toBe("/some/path?q=1");
    expect(seen.bytes).toBe(5);
    expect(seen.headers["x-client"]).toBe("c");
    expect(seen.headers["x-forwarded-for"]).toBe("127.0.0.1");
    expect(seen.headers["x-forwarded-proto"]).toBe("http");
    expect(seen.headers["x-forwarded-host"]).toBe(new URL(sys.url).host);
    expect(seen.headers["x-request-id"]).toBe(res.headers.get("x-request-id"));
    expect(seen.headers.authorization).toBeUndefined();
    expect(seen.headers["proxy-authorization"]).toBeUndefined();
  });

  it("drops the headers the client's Connection header names (raw HTTP client)", async () => {
    const agent = await sys.createAgent({ image: "inspect", public: true });
    const { request } = await import("node:http");
    const seen = await new Promise<{ headers: Record<string, string> }>((resolve, reject) => {
      const req = request(`${sys.url}/a/${agent.id}/`, { headers: { connection: "keep-alive, x-drop", "x-drop": "1", "x-keep": "1" } }, (res) => {
        let text = "";
        res.on("data", (c: Buffer) => (text += c.toString()));
        res.on("end", () => resolve(JSON.parse(text) as { headers: Record<string, string> }));
      });
      req.on("error", reject);
      req.end();
    });
    expect(seen.headers["x-drop"]).toBeUndefined();
    expect(seen.headers["x-keep"]).toBe("1");
  });

  it("two Host headers are refused with 400 before any routing, on the API and on agent traffic; the server goes on", async () => {
    const agent = await sys.createAgent({ image: "inspect", public: true });
    const { connect } = await import("node:net");
    const { port, hostname } = new URL(sys.url);
    const raw = (head: string) =>
      new Promise<string>((resolve, reject) => {
        const socket = connect(Number(port), hostname, () => socket.write(head));
        let text = "";
        socket.on("data", (c: Buffer) => (text += c.toString()));
        socket.on("end", () => resolve(text));
        socket.on("error", reject);
      });
    for (const path of ["/healthz", `/a/${agent.id}/`]) {
      const answer = await raw(`GET ${path} HTTP/1.1\r\nHost: ${hostname}\r\nHost: ${agent.id}.elsewhere.test\r\nConnection: close\r\n\r\n`);
      expect(answer.split("\r\n")[0]).toBe("HTTP/1.1 400 Bad Request");
      const body = JSON.parse(answer.slice(answer.indexOf("\r\n\r\n") + 4)) as { error: { code: string; message: string; requestId: string } };
      expect(body.error).toMatchObject({ code: "bad_request", message: "more than one Host header" });
      expect(body.error.requestId).toMatch(/^req_/);
    }
    const upgrade = await raw(
      `GET /a/${agent.id}/ws HTTP/1.1\r\nHost: a\r\nHost: b\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n`,
    );
    expect(upgrade.split("\r\n")[0]).toBe("HTTP/1.1 400 Bad Request");
    expect((await sys.call(`/a/${agent.id}/`)).status).toBe(200);
  });

  it("a client that goes away aborts the upstream request and releases the agent", async () => {
    const agent = await sys.createAgent({ image: "inspect" });
    await sys.call(`/a/${agent.id}/`);
    const ctl = new AbortController();
    const pending = sys.call(`/a/${agent.id}/hang`, { signal: ctl.signal }).catch(() => "aborted");
    await new Promise((r) => setTimeout(r, 300));
    ctl.abort();
    expect(await pending).toBe("aborted");
    await waitFor(async () => {
      const seen = (await (await sys.call(`/a/${agent.id}/aborted`)).json()) as { aborted: number };
      return seen.aborted === 1;
    }, 3000);
    const info = (await (await sys.call(`/v1/agents/${agent.id}`)).json()) as { inFlight: number };
    expect(info.inFlight).toBe(0);
  });
});

describe("bad input", () => {
  async function expectError(res: Response, status: number, code: string) {
    expect(res.status).toBe(status);
    const body = (await res.json()) as { error: { code: string; message: string; requestId: string } };
    expect(body.error.code).toBe(code);
    expect(body.error.message.length).toBeGreaterThan(0);
    expect(body.error.requestId).toBe(res.headers.get("x-request-id"));
  }

  it("unknown agent 404, malformed id 400, missing token 401", async () => {
    await expectError(await sys.call("/a/agt_doesnotexist/"), 404, "not_found");
    await expectError(await sys.call("/a/not-an-id/"), 400, "invalid_id");
    const agent = await sys.createAgent();
    await expectError(await sys.call(`/a/${agent.id}/`, { token: "" }), 401, "unauthorized");
  });

  it("expired, not-yet-valid, forged and wrong-audience tokens are 401; another tenant's agent is 404", async () => {
    const agent = await sys.createAgent();
    const expired = await new SignJWT({ tenant: "ten_demo", scope: "agents:invoke" })
      .setProtectedHeader({ alg: "ES256", kid: sys.keys.privateJwk.kid! })
      .setIssuer("agentvm-dev")
      .setAudience("agentvm")
      .setSubject("x")
      .setExpirationTime(Math.floor(Date.now() / 1000) - 3600)
      .sign(await importPrivate());
    await expectError(await sys.call(`/a/${agent.id}/`, { token: expired }), 401, "unauthorized");
    const future = await new SignJWT({ tenant: "ten_demo", scope: "agents:invoke" })
      .setProtectedHeader({ alg: "ES256", kid: sys.keys.privateJwk.kid! })
      .setIssuer("agentvm-dev")
      .setAudience("agentvm")
      .setSubject("x")
      .setNotBefore(Math.floor(Date.now() / 1000) + 3600)
      .setExpirationTime("2h")
      .sign(await importPrivate());
    await expectError(await sys.call(`/a/${agent.id}/`, { token: future }), 401, "unauthorized");
    const other = await generateKeyPair("ES256");
    const forged = await new SignJWT({ tenant: "ten_demo", scope: "agents:invoke" })
      .setProtectedHeader({ alg: "ES256", kid: sys.keys.privateJwk.kid! })
      .setIssuer("agentvm-dev")
      .setAudience("agentvm")
      .setSubject("x")
      .setExpirationTime("1h")
      .sign(other.privateKey);
    await expectError(await sys.call(`/a/${agent.id}/`, { token: forged }), 401, "unauthorized");
    const wrongAud = await new SignJWT({ tenant: "ten_demo", scope: "agents:invoke" })
      .setProtectedHeader({ alg: "ES256", kid: sys.keys.privateJwk.kid! })
      .setIssuer("agentvm-dev")
      .setAudience("someone-else")
      .setSubject("x")
      .setExpirationTime("1h")
      .sign(await importPrivate());
    await expectError(await sys.call(`/a/${agent.id}/`, { token: wrongAud }), 401, "unauthorized");
    await expectError(await sys.call(`/a/${agent.id}/`, { token: "not.a.jwt" }), 401, "unauthorized");
    await sys.ensureTenant("ten_other");
    const otherTenant = await sys.token({ tenant: "ten_other" });
    await expectError(await sys.call(`/a/${agent.id}/`, { token: otherTenant }), 404, "not_found");
    await expectError(await sys.call(`/v1/agents/${agent.id}`, { token: otherTenant }), 404, "not_found");
    const invokeOnly = await sys.token({ scopes: ["agents:invoke"] });
    await expectError(await sys.call(`/v1/agents`, { token: invokeOnly }), 403, "forbidden");
  });

  it("an oversized body is 413 whether declared or streamed, and the agent stays usable", async () => {
    const agent = await sys.createAgent({ image: "inspect" });
    await expectError(await sys.call(`/a/${agent.id}/`, { method: "POST", body: "x".repeat(100_001) }), 413, "payload_too_large");
    const chunks = new ReadableStream<Uint8Array>({
      start(c) {
        for (let i = 0; i < 30; i++) c.enqueue(new Uint8Array(10_000));
        c.close();
      },
    });
    await expectError(await sys.call(`/a/${agent.id}/`, { method: "POST", body: chunks, duplex: "half" } as RequestInit), 413, "payload_too_large");
    const ok = await sys.call(`/a/${agent.id}/`, { method: "POST", body: "fine" });
    expect(ok.status).toBe(200);
    expect(((await ok.json()) as { bytes: number }).bytes).toBe(4);
  });

  it("a workload that fails to start is a 503 with Retry-After; other agents are untouched", async () => {
    const healthy = await sys.createAgent();
    await sys.call(`/a/${healthy.id}/counter`, { method: "POST" });
    const broken = await sys.createAgent({ image: "broken" });
    const res = await sys.call(`/a/${broken.id}/`);
    expect(res.headers.get("retry-after")).not.toBeNull();
    await expectError(res, 503, "wake_failed");
    expect(await sys.state(broken.id)).toBe("failed");
    const again = await sys.call(`/a/${healthy.id}/counter`);
    expect(await again.json()).toEqual({ count: 1 });
  });

  it("a crashing workload is recorded as a crash and boots again on the next call", async () => {
    const agent = await sys.createAgent({ image: "inspect" });
    expect((await sys.call(`/a/${agent.id}/`)).status).toBe(200);
    const crash = await sys.call(`/a/${agent.id}/crash`);
    expect(crash.status).toBe(502);
    await waitFor(async () => (await sys.state(agent.id)) === "failed", 3000);
    await sys.host.flush();
    const events = await sys.database.db.select().from(vmEvents).where(eq(vmEvents.agentId, agent.id));
    expect(events.some((e) => e.toState === "failed" && e.reason === "crash")).toBe(true);
    const back = await sys.call(`/a/${agent.id}/`);
    expect(back.status).toBe(200);
    expect(back.headers.get("x-wake")).toBe("boot");
  });

  it("an unknown image and bad fields are refused at creation with the field named", async () => {
    const res = await sys.call("/v1/agents", { method: "POST", body: JSON.stringify({ image: "nope" }) });
    await expectError(res, 400, "bad_request");
    const res2 = await sys.call("/v1/agents", { method: "POST", body: JSON.stringify({ memMiB: "lots" }) });
    expect(res2.status).toBe(400);
    expect(((await res2.json()) as { error: { message: string } }).error.message).toContain("memMiB");
    const res3 = await sys.call("/v1/agents", { method: "POST", body: "{not json" });
    await expectError(res3, 400, "bad_request");
  });
});

async function importPrivate() {
  const { importJWK } = await import("jose");
  return importJWK(sys.keys.privateJwk, "ES256");
}

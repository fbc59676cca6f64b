// A host's ingress over real sockets: it serves only calls a gateway signed for this host, this operation and this agent.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SignJWT } from "jose";
import { componentKey } from "../../lib/host-token.ts";
import { newId } from "../../lib/ids.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import { hostErrorHeader, hostTokenHeader, maxStatusesPerCall, signHostCall, type HostCall } from "../../contracts/host-protocol.ts";
import { freshDatabase } from "../helpers/db.ts";
import { inspectImage, startHostInProcess, testComponentSecret, type InProcessHost } from "../helpers/worker-stack.ts";

let database: Awaited<ReturnType<typeof freshDatabase>>;
let host: InProcessHost;
const key = componentKey(testComponentSecret);

beforeAll(async () => {
  database = await freshDatabase();
  host = await startHostInProcess(database, { images: { inspect: inspectImage, broken: [process.execPath, "-e", "process.exit(7)"] } });
});
afterAll(async () => {
  await host?.stop();
  await database?.close();
});

function spec(image = "inspect"): AgentSpec {
  return { id: newId("agent"), tenantId: "ten_test", image, vcpus: 1, memMiB: 128, idleTimeoutMs: 60_000, streamIdleMs: 60_000, allowEgress: false };
}

function forwardCall(agent: AgentSpec, path = "/hello", method = "GET"): HostCall {
  return { op: "forward", agent, reason: "request", method, path, requestId: newId("request") };
}

/** A token made by hand: what a caller without the gateway's code (or with a stolen or stale token) could send. */
async function handToken(call: HostCall, opts: { aud?: string; expS?: number; secret?: string; iss?: string } = {}): Promise<string> {
  const now = Math.floor(Date.now() / 1000);
  return new SignJWT({ call })
    .setProtectedHeader({ alg: "HS256" })
    .setIssuer(opts.iss ?? "agentvm")
    .setSubject("gateway")
    .setAudience(opts.aud ?? `host:${host.hostId}`)
    .setIssuedAt(now - 120)
    .setExpirationTime(now + (opts.expS ?? 30))
    .sign(opts.secret ? new TextEncoder().encode(opts.secret) : key);
}

async function send(path: string, init: RequestInit & { token?: string } = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  if (init.token) headers.set(hostTokenHeader, init.token);
  return fetch(host.url + path, { ...init, headers });
}

/** Refused with the envelope: `unauthorized` (401), or `clock_skew` (503, Retry-After) for a token refused for its times. */
async function expectRefused(res: Response, message: RegExp, code: "unauthorized" | "clock_skew" = "unauthorized"): Promise<void> {
  expect(res.status).toBe(code === "unauthorized" ? 401 : 503);
  expect(res.headers.get(hostErrorHeader)).toBe(code);
  if (code === "clock_skew") expect(res.headers.get("retry-after")).toBe("2");
  const body = (await res.json()) as { error: { code: string; message: string; requestId: string } };
  expect(body.error.code).toBe(code);
  expect(body.error.message).toMatch(message);
  expect(body.error.requestId).toMatch(/^req_/);
}

describe("a host refuses calls that bypass the gateway", () => {
  it("no token", async () => {
    const agent = spec();
    await expectRefused(await send("/v1/forward"), /missing component token/);
    await expectRefused(await send("/v1/status"), /missing component token/);
    await expectRefused(await send("/v1/statuses"), /missing component token/);
    await expectRefused(await send("/v1/wake", { method: "POST" }), /missing component token/);
    expect(host.host.status(agent.id)).toBeUndefined();
  });

  it("an expired token", async () => {
    const agent = spec();
    // An expired token cannot say whether it is old or a clock is off: refused as a skew (the caller retries elsewhere).
    await expectRefused(await send("/v1/forward", { token: await handToken(forwardCall(agent), { expS: -60 }) }), /expired/, "clock_skew");
    expect(host.host.status(agent.id)).toBeUndefined(); // nothing was woken
  });

  it("a token for another host", async () => {
    const agent = spec();
    await expectRefused(await send("/v1/forward", { token: await handToken(forwardCall(agent), { aud: "host:host_someoneelse" }) }), /aud mismatch/);
    await expectRefused(await send("/v1/forward", { token: await signHostCall(key, "host_someoneelse", forwardCall(agent)) }), /aud mismatch/);
    expect(host.host.status(agent.id)).toBeUndefined();
  });

  it("a token signed with another secret, or by another issuer", async () => {
    const agent = spec();
    await expectRefused(
      await send("/v1/forward", { token: await handToken(forwardCall(agent), { secret: "another-secret-of-at-least-32-characters!" }) }),
      /invalid/,
    );
    await expectRefused(await send("/v1/forward", { token: await handToken(forwardCall(agent), { iss: "someone" }) }), /iss mismatch/);
    await expectRefused(await send("/v1/forward", { token: "not.a.jwt" }), /invalid/);
  });

  it("a valid token used for another operation, method or path than it was signed for", async () => {
    const agent = spec();
    const statusToken = await signHostCall(key, host.hostId, { op: "status", agentId: agent.id });
    await expectRefused(await send("/v1/forward", { token: statusToken }), /is for status, not forward/);
    await expectRefused(await send("/v1/wake", { method: "POST", token: statusToken }), /is for status, not wake/);
    await expectRefused(await send("/v1/statuses", { token: statusToken }), /is for status, not statuses/);
    // A batch the gateway would never sign: no ids, or more than one call may carry.
    for (const agentIds of [[], Array.from({ length: maxStatusesPerCall + 1 }, (_, i) => `agt_${String(i).padStart(16, "0")}`)]) {
      await expectRefused(await send("/v1/statuses", { token: await handToken({ op: "statuses", agentIds } as HostCall) }), /no valid call/);
    }
    const getToken = await signHostCall(key, host.hostId, forwardCall(agent, "/hello", "GET"));
    await expectRefused(await send("/v1/forward", { method: "DELETE", token: getToken }), /is for GET, not DELETE/);
    // A claim the gateway would never sign (a spec without its fields) is refused too.
    const bogus = await handToken({ op: "wake", agent: { id: agent.id } } as unknown as HostCall);
    await expectRefused(await send("/v1/wake", { method: "POST", token: bogus }), /no valid call/);
    expect(host.host.status(agent.id)).toBeUndefined();
  });

  it("healthz answers without a token and says nothing about agents", async () => {
    const res = await send("/healthz");
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ ok: true, hostId: host.hostId });
  });
});

describe("calls a gateway signed", () => {
  it("forward wakes the agent and proxies method, path (from the token), headers and body; the token never reaches the agent", async () => {
    const agent = spec();
    const token = await signHostCall(key, host.hostId, forwardCall(agent, "/in/side?x=1", "POST"));
    const res = await send("/v1/forward?ignored=1", {
      method: "POST",
      token,
      headers: { "x-custom-in": "1", authorization: "Basic agent-own", "x-request-id": "req_fromgateway0001" },
      body: "x".repeat(5000),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-wake")).toBe("boot");
    expect(res.headers.get("server-timing")).toMatch(/boot;dur=/);
    expect(res.headers.get(hostErrorHeader)).toBeNull();
    const seen = (await res.json()) as { method: string; url: string; headers: Record<string, string>; bytes: number };
    expect(seen).toMatchObject({ method: "POST", url: "/in/side?x=1", bytes: 5000 });
    expect(seen.headers["x-custom-in"]).toBe("1");
    expect(seen.headers.authorization).toBe("Basic agent-own");
    expect(seen.headers[hostTokenHeader]).toBeUndefined();
    expect(host.host.status(agent.id)?.state).toBe("running");
  });

  it("host errors come back as the envelope, marked as the host's, with Retry-After", async () => {
    const agent = spec("broken");
    const res = await send("/v1/forward", { token: await signHostCall(key, host.hostId, forwardCall(agent)) });
    expect(res.status).toBe(503);
    expect(res.headers.get(hostErrorHeader)).toBe("wake_failed");
    expect(res.headers.get("retry-after")).toBe("5");
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe("wake_failed");
  });

  it("control calls: wake, status, lease, drop-lease, hibernate, remove", async () => {
    const agent = spec();
    const call = async (c: HostCall, method: string, path: string) => {
      const res = await send(path, { method, token: await signHostCall(key, host.hostId, c) });
      expect(res.status).toBe(200);
      return res.json() as Promise<Record<string, unknown>>;
    };
    expect(await call({ op: "wake", agent, reason: "api" }, "POST", "/v1/wake")).toMatchObject({ wake: "boot", runId: expect.stringMatching(/^run_/) });
    expect(await call({ op: "status", agentId: agent.id }, "GET", "/v1/status")).toMatchObject({ status: { agentId: agent.id, state: "running" } });
    const lease = (await call({ op: "lease", agent, ttlMs: 60_000 }, "POST", "/v1/lease")) as { leaseId: string };
    expect(lease.leaseId).toMatch(/^lse_/);
    expect(await call({ op: "drop-lease", agentId: agent.id, leaseId: lease.leaseId }, "POST", "/v1/drop-lease")).toEqual({ dropped: true });
    expect(await call({ op: "hibernate", agentId: agent.id }, "POST", "/v1/hibernate")).toEqual({ state: "hibernated" });
    expect(await call({ op: "remove", agentId: agent.id }, "POST", "/v1/remove")).toEqual({ removed: true });
    expect(await call({ op: "status", agentId: agent.id }, "GET", "/v1/status")).toEqual({ status: null });
  });
});

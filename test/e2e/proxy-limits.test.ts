// Limits and the errors that tell them apart, over real sockets: 429 per tenant, 431, 413 per agent, 502/503/504,
// and non-waking traffic (bots, probes) answered without waking a sleeping agent, with rules GET shows and PATCH changes.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { request } from "node:http";
import { tenants } from "../../schema/core.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";

const node = process.execPath;
// A workload whose responses are malformed (Content-Length together with Transfer-Encoding).
const badResponses = `require("net").createServer((s) => s.on("data", () => s.write("HTTP/1.1 200 OK\\r\\nContent-Length: 5\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\nhello"))).listen(process.env.PORT, "127.0.0.1")`;
// Workloads that take 1.5 s and 4 s to start listening (the wake deadline here is 2.5 s).
const slowBoot = `setTimeout(() => require("http").createServer((q, s) => s.end("ok")).listen(process.env.PORT, "127.0.0.1"), 1500)`;
const tooSlowBoot = slowBoot.replace("1500", "4000");

let sys: TestSystem;

beforeAll(async () => {
  sys = await startSystem({
    images: { bad: [node, "-e", badResponses], slowboot: [node, "-e", slowBoot], tooslow: [node, "-e", tooSlowBoot], broken: [node, "-e", "process.exit(7)"] },
    env: { TENANT_MAX_CONCURRENT: "3", MAX_HEADER_BYTES: "4096", WAKE_QUEUE_LIMIT: "2", MAX_BODY_BYTES: "1000000", WAKE_DEADLINE_MS: "2500" },
  });
});
afterAll(async () => {
  await sys?.stop();
});

async function expectError(res: Response, status: number, code: string): Promise<{ message: string }> {
  expect(res.status).toBe(status);
  const body = (await res.json()) as { error: { code: string; message: string; requestId: string } };
  expect(body.error.code).toBe(code);
  expect(body.error.requestId).toBe(res.headers.get("x-request-id"));
  expect(body.error.requestId).toMatch(/^req_/);
  return body.error;
}

describe("per-tenant concurrency", () => {
  it("the call beyond the tenant's limit is 429 with Retry-After; other tenants are unaffected; slots free up", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    await sys.call(`/a/${agent.id}/`);
    const slow = Array.from({ length: 3 }, () => sys.call(`/a/${agent.id}/slow?ms=1500`));
    await new Promise((r) => setTimeout(r, 300));
    const over = await sys.call(`/a/${agent.id}/`);
    expect(over.headers.get("retry-after")).toBe("1");
    const err = await expectError(over, 429, "rate_limited");
    expect(err.message).toContain("limit is 3");
    // Another tenant's public agent is not counted against the demo tenant.
    const otherToken = await sys.token({ tenant: "ten_other" });
    await sys.database.db.insert(tenants).values({ id: "ten_other", name: "Other" }).onConflictDoNothing();
    const other = await sys.createAgent({ public: true }, otherToken);
    expect((await sys.call(`/a/${other.id}/`, { token: "" })).status).toBe(200);
    for (const r of await Promise.all(slow)) expect(r.status).toBe(200);
    expect((await sys.call(`/a/${agent.id}/`)).status).toBe(200);
  });
});

describe("sizes", () => {
  it("request headers over MAX_HEADER_BYTES are 431 with the envelope", async () => {
    const agent = await sys.createAgent();
    const res = await sys.call(`/a/${agent.id}/`, { headers: { "x-big": "a".repeat(6000) } });
    await expectError(res, 431, "headers_too_large");
  });

  it("a body over the agent's own limit is 413, declared or streamed; the agent's limit never exceeds the global one", async () => {
    const agent = await sys.createAgent({ limits: { maxBodyBytes: 1000 } });
    expect((agent.limits as { maxBodyBytes: number }).maxBodyBytes).toBe(1000);
    await expectError(await sys.call(`/a/${agent.id}/upload`, { method: "POST", body: "x".repeat(1001) }), 413, "payload_too_large");
    const streamed = await rawPost(`/a/${agent.id}/upload`, 20, 100);
    expect(streamed.status).toBe(413);
    expect(JSON.parse(streamed.body)).toMatchObject({ error: { code: "payload_too_large" } });
    const ok = await sys.call(`/a/${agent.id}/upload`, { method: "POST", body: "x".repeat(1000) });
    expect(((await ok.json()) as { bytes: number }).bytes).toBe(1000);
    const patched = await sys.call(`/v1/agents/${agent.id}`, { method: "PATCH", body: JSON.stringify({ limits: { maxBodyBytes: 50_000_000 } }) });
    expect(((await patched.json()) as { limits: { maxBodyBytes: number } }).limits.maxBodyBytes).toBe(1_000_000);
  });
});

describe("errors say whose fault it is", () => {
  it("502 when the agent answers badly, 503 + Retry-After when it cannot wake or too many wait, 504 when it is too slow", async () => {
    const bad = await sys.createAgent({ image: "bad" });
    const e502 = await expectError(await sys.call(`/a/${bad.id}/`), 502, "bad_gateway");
    expect(e502.message).toContain("both Content-Length and Transfer-Encoding");

    const broken = await sys.createAgent({ image: "broken" });
    const r503 = await sys.call(`/a/${broken.id}/`);
    expect(Number(r503.headers.get("retry-after"))).toBeGreaterThan(0);
    await expectError(r503, 503, "wake_failed");

    // WAKE_QUEUE_LIMIT=2: a third caller waiting for the same wake is turned away at once.
    const slow = await sys.createAgent({ image: "slowboot" });
    const results = await Promise.all(Array.from({ length: 3 }, () => sys.call(`/a/${slow.id}/`)));
    const full = results.filter((r) => r.status === 503);
    expect(results.filter((r) => r.status === 200)).toHaveLength(2);
    expect(full).toHaveLength(1);
    for (const r of full) {
      expect(r.headers.get("retry-after")).not.toBeNull();
      await expectError(r, 503, "queue_full");
    }

    // A wake that outlasts the wake deadline: 503 + Retry-After, not a hang.
    const late = await sys.createAgent({ image: "tooslow" });
    const lateStarted = Date.now();
    const r503late = await sys.call(`/a/${late.id}/`);
    expect(r503late.headers.get("retry-after")).not.toBeNull();
    expect((await expectError(r503late, 503, "wake_failed")).message).toContain("did not wake within 2500 ms");
    expect(Date.now() - lateStarted).toBeLessThan(3500);

    const tooSlow = await sys.createAgent({ limits: { responseTimeoutMs: 200 } });
    await expectError(await sys.call(`/a/${tooSlow.id}/slow?ms=2000`), 504, "gateway_timeout");
  });
});

describe("non-waking traffic", () => {
  it("a bot or a probe gets the gateway's answer and does not wake a sleeping agent; a real call does", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    expect((await sys.call(`/a/${agent.id}/counter`, { method: "POST" })).status).toBe(200);
    await sys.call(`/v1/agents/${agent.id}/hibernate`, { method: "POST" });
    expect(await sys.state(agent.id)).toBe("hibernated");
    const woken = await sys.wakes(agent.id);

    const bot = await sys.call(`/a/${agent.id}/`, { headers: { "user-agent": "Mozilla/5.0+(compatible; UptimeRobot/2.0; http://www.uptimerobot.com/)" } });
    expect(bot.status).toBe(200);
    expect(bot.headers.get("x-wake")).toBe("none");
    expect(await bot.json()).toEqual({ ok: true, agent: agent.id, state: "hibernated", answeredBy: "gateway" });
    const robots = await sys.call(`/a/${agent.id}/robots.txt`);
    expect(await robots.text()).toBe("User-agent: *\nDisallow: /\n");
    const probe = await sys.call(`/a/${agent.id}/healthz`, { method: "HEAD" });
    expect(probe.status).toBe(200);
    expect(await sys.state(agent.id)).toBe("hibernated");
    expect(await sys.wakes(agent.id)).toBe(woken);

    const real = await sys.call(`/a/${agent.id}/counter`);
    expect(real.headers.get("x-wake")).toBe("restore");
    expect(await real.json()).toEqual({ count: 1 });
    // Awake, probes are still answered by the gateway: they never reset the agent's idle timer.
    const awakeProbe = await sys.call(`/a/${agent.id}/healthz`);
    expect(awakeProbe.headers.get("x-wake")).toBe("none");
    expect(((await awakeProbe.json()) as { state: string }).state).toBe("running");
  });

  it("GET shows the rules in force; PATCH replaces them, null restores the defaults, bad rules are refused by name", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    const view = (await (await sys.call(`/v1/agents/${agent.id}`)).json()) as {
      nonWaking: { paths: string[]; userAgents: string[] };
      nonWakingDefault: boolean;
    };
    expect(view.nonWakingDefault).toBe(true);
    expect(view.nonWaking.paths).toContain("/healthz");
    expect(view.nonWaking.userAgents).toContain("UptimeRobot");

    const patched = await sys.call(`/v1/agents/${agent.id}`, {
      method: "PATCH",
      body: JSON.stringify({ nonWaking: { paths: ["/status/*"], methods: [], userAgents: [] }, idleTimeoutMs: 45_000 }),
    });
    expect(patched.status).toBe(200);
    const after = (await patched.json()) as { nonWaking: { paths: string[] }; nonWakingDefault: boolean; idleTimeoutMs: number };
    expect(after).toMatchObject({ nonWaking: { paths: ["/status/*"] }, nonWakingDefault: false, idleTimeoutMs: 45_000 });
    // The new rules apply at once (the proxy's cache was invalidated): /healthz now reaches the agent, /status/x does not.
    const health = await sys.call(`/a/${agent.id}/healthz`);
    expect(health.headers.get("x-wake")).toBe("boot");
    expect(await health.text()).toBe("ok");
    expect((await sys.call(`/a/${agent.id}/status/deep`)).headers.get("x-wake")).toBe("none");

    const reset = (await (await sys.call(`/v1/agents/${agent.id}`, { method: "PATCH", body: JSON.stringify({ nonWaking: null }) })).json()) as {
      nonWakingDefault: boolean;
    };
    expect(reset.nonWakingDefault).toBe(true);
    expect((await sys.call(`/a/${agent.id}/healthz`)).headers.get("x-wake")).toBe("none");

    const refused = await sys.call(`/v1/agents/${agent.id}`, { method: "PATCH", body: JSON.stringify({ nonWaking: { paths: ["no-slash"] } }) });
    expect((await expectError(refused, 400, "bad_request")).message).toContain("nonWaking.paths");
    const unknown = await sys.call(`/v1/agents/${agent.id}`, { method: "PATCH", body: JSON.stringify({ image: "demo" }) });
    expect((await expectError(unknown, 400, "bad_request")).message).toContain("image");
    const otherTenant = await sys.token({ tenant: "ten_other" });
    await expectError(await sys.call(`/v1/agents/${agent.id}`, { method: "PATCH", body: "{}", token: otherTenant }), 404, "not_found");
  });
});

describe("Expect: 100-continue", () => {
  it("a client that waits for 100 Continue gets it once the sleeping agent is awake, then its upload goes through", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    await sys.call(`/a/${agent.id}/`);
    await sys.call(`/v1/agents/${agent.id}/hibernate`, { method: "POST" });
    const result = await new Promise<{ continued: boolean; status: number; wake: string | undefined; body: string }>((resolve, reject) => {
      let continued = false;
      const req = request(
        `${sys.url}/a/${agent.id}/upload`,
        { method: "POST", headers: { authorization: `Bearer ${sys.demo.token}`, expect: "100-continue", "content-length": 5 } },
        (res) => {
          let body = "";
          res.on("data", (c: Buffer) => (body += c.toString()));
          res.on("end", () => resolve({ continued, status: res.statusCode ?? 0, wake: res.headers["x-wake"] as string | undefined, body }));
        },
      );
      req.on("continue", () => {
        continued = true;
        req.end("hello");
      });
      req.on("error", reject);
    });
    expect(result.continued).toBe(true);
    expect(result.status).toBe(200);
    expect(result.wake).toBe("restore");
    expect(JSON.parse(result.body)).toMatchObject({ bytes: 5 });
  });
});

/** A POST with a chunked body (no Content-Length), `chunks` pieces of `size` bytes, over a raw node:http client. */
function rawPost(path: string, chunks: number, size: number): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(
      `${sys.url}${path}`,
      { method: "POST", headers: { authorization: `Bearer ${sys.demo.token}`, "transfer-encoding": "chunked" } },
      (res) => {
        let body = "";
        res.on("data", (c: Buffer) => (body += c.toString()));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
      },
    );
    req.on("error", reject);
    let sent = 0;
    const next = () => {
      if (sent++ >= chunks) return void req.end();
      req.write(Buffer.alloc(size, 120), () => setTimeout(next, 5));
    };
    next();
  });
}

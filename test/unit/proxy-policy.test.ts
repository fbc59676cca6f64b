// The proxy's pure rules: routing, non-waking traffic, header rules on both entries, tenant limit, agent cache.
import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { AppError } from "../../lib/errors.ts";
import { agentTarget, authorizeCall, defaultNonWakingRules, matchNonWaking, nonWakingAnswer, NonWakingRulesInput } from "../../gateway/proxy/policy.ts";
import { issuesMessage, z } from "../../lib/api.ts";
import { downstreamHeaderList, upstreamRequestHeadLines, upstreamRequestHeaders, withoutHopByHop } from "../../lib/http-headers.ts";
import { TenantLimiter } from "../../gateway/proxy/tenant-limiter.ts";
import { createAgentCache, noOverrides } from "../../gateway/proxy/agents.ts";
import type { AgentRow } from "../../gateway/agents/repo.ts";
import type { Caller } from "../../contracts/caller.ts";

describe("routing", () => {
  it("/a/{id}/… and {id}.{domain} name the agent and the path inside it; anything else is the control API", () => {
    expect(agentTarget("/a/agt_x/some/path?q=1", "gw", undefined)).toEqual({ agentId: "agt_x", pathInside: "/some/path?q=1" });
    expect(agentTarget("/a/agt_x", "gw", undefined)).toEqual({ agentId: "agt_x", pathInside: "/" });
    expect(agentTarget("/a/agt_x?q=1", "gw", undefined)).toEqual({ agentId: "agt_x", pathInside: "/?q=1" });
    expect(agentTarget("/a/agt_x/", "gw", undefined)).toEqual({ agentId: "agt_x", pathInside: "/" });
    expect(agentTarget("/x/y", "agt_x.agents.test:8080", "agents.test")).toEqual({ agentId: "agt_x", pathInside: "/x/y" });
    expect(agentTarget("/v1/agents", "gw", "agents.test")).toBeUndefined();
    expect(agentTarget("/a/", "gw", undefined)).toBeUndefined();
    expect(agentTarget("/healthz", "a.b.agents.test", "agents.test")).toBeUndefined();
    expect(agentTarget("/abc", "gw", undefined)).toBeUndefined();
  });
});

describe("authorization", () => {
  const caller = (tenantId: string, scopes: string[]): Caller => ({ tenantId, subject: "s", scopes: new Set(scopes) as Caller["scopes"] });
  const code = (f: () => void) => {
    try {
      f();
      return "ok";
    } catch (e) {
      return (e as AppError).code;
    }
  };
  it("public agents need nothing; private ones a token of their tenant with agents:invoke; other tenants see 404", () => {
    const agent = { id: "agt_a", tenantId: "ten_a", public: false };
    expect(code(() => authorizeCall({ ...agent, public: true }, undefined))).toBe("ok");
    expect(code(() => authorizeCall(agent, undefined))).toBe("unauthorized");
    expect(code(() => authorizeCall(agent, caller("ten_b", ["agents:invoke"])))).toBe("not_found");
    expect(code(() => authorizeCall(agent, caller("ten_a", ["agents:admin"])))).toBe("forbidden");
    expect(code(() => authorizeCall(agent, caller("ten_a", ["agents:invoke"])))).toBe("ok");
  });
});

describe("non-waking traffic", () => {
  it("the defaults catch probes, robots.txt and known monitors and crawlers, and nothing an agent's user would send", () => {
    const r = defaultNonWakingRules;
    expect(matchNonWaking(r, "GET", "/healthz", undefined)).toBe("path");
    expect(matchNonWaking(r, "GET", "/robots.txt?x=1", "curl/8")).toBe("path");
    expect(matchNonWaking(r, "HEAD", "/", "Mozilla/5.0+(compatible; UptimeRobot/2.0; http://www.uptimerobot.com/)")).toBe("user-agent");
    expect(matchNonWaking(r, "GET", "/", "kube-probe/1.29")).toBe("user-agent");
    expect(matchNonWaking(r, "GET", "/", "Mozilla/5.0 (compatible; Googlebot/2.1)")).toBe("user-agent");
    expect(matchNonWaking(r, "GET", "/", "Mozilla/5.0 (X11; Linux x86_64) Firefox/130.0")).toBeUndefined();
    expect(matchNonWaking(r, "POST", "/chat", "python-requests/2.32")).toBeUndefined();
    expect(matchNonWaking(r, "GET", "/healthz/deep", undefined)).toBeUndefined();
  });

  it("custom rules: prefix paths with *, methods, user-agent substrings case-insensitively", () => {
    const r = { paths: ["/status/*"], methods: ["OPTIONS"], userAgents: ["mybot"] };
    expect(matchNonWaking(r, "GET", "/status/x/y", undefined)).toBe("path");
    expect(matchNonWaking(r, "options", "/x", undefined)).toBe("method");
    expect(matchNonWaking(r, "GET", "/x", "Hello MyBot/1")).toBe("user-agent");
    expect(matchNonWaking(r, "GET", "/healthz", undefined)).toBeUndefined();
  });

  it("answers: robots.txt disallows all, favicon is 204, the rest 200 with the state; HEAD has no body; x-wake: none", () => {
    const robots = nonWakingAnswer("path", "GET", "/robots.txt", "agt_a", "hibernated", "req_1");
    expect(robots.status).toBe(200);
    expect(robots.body).toBe("User-agent: *\nDisallow: /\n");
    expect(robots.headers["x-wake"]).toBe("none");
    expect(nonWakingAnswer("path", "GET", "/favicon.ico", "agt_a", "hibernated", "req_1").status).toBe(204);
    const health = nonWakingAnswer("user-agent", "GET", "/", "agt_a", "hibernated", "req_1");
    expect(JSON.parse(health.body)).toEqual({ ok: true, agent: "agt_a", state: "hibernated", answeredBy: "gateway" });
    expect(nonWakingAnswer("user-agent", "HEAD", "/", "agt_a", "running", "req_1").body).toBe("");
  });

  it("validates rules from the API and names the bad field", () => {
    // As the routes use it: a body field that may be absent or null (null resets to the defaults).
    const body = z.object({ nonWaking: NonWakingRulesInput.nullable().optional() });
    const parse = (value: unknown) => {
      const r = body.safeParse(value);
      if (!r.success) throw new AppError("bad_request", issuesMessage(r.error.issues));
      return r.data.nonWaking;
    };
    expect(parse({})).toBeUndefined();
    expect(parse({ nonWaking: null })).toBeNull();
    expect(parse({ nonWaking: { paths: ["/x"] } })).toEqual({ paths: ["/x"], methods: [], userAgents: [] });
    expect(parse({ nonWaking: { paths: ["/api/*"], methods: ["OPTIONS"], userAgents: ["kube-probe"] } })).toEqual({
      paths: ["/api/*"],
      methods: ["OPTIONS"],
      userAgents: ["kube-probe"],
    });
    expect(() => parse({ nonWaking: { paths: ["x"] } })).toThrow(/nonWaking.paths/);
    expect(() => parse({ nonWaking: { paths: [`/${"a".repeat(201)}`] } })).toThrow(/nonWaking.paths/);
    expect(() => parse({ nonWaking: { paths: ["/a b"] } })).toThrow(/nonWaking.paths/);
    expect(() => parse({ nonWaking: { paths: Array.from({ length: 101 }, (_, i) => `/${i}`) } })).toThrow(/nonWaking.paths: must be a list of at most 100/);
    expect(() => parse({ nonWaking: { paths: "/x" } })).toThrow(/nonWaking.paths/);
    expect(() => parse({ nonWaking: { methods: ["get"] } })).toThrow(/nonWaking.methods/);
    expect(() => parse({ nonWaking: { userAgents: ["x"] } })).toThrow(/nonWaking.userAgents/);
    expect(() => parse({ nonWaking: { userAgents: ["bot\n"] } })).toThrow(/nonWaking.userAgents/);
    expect(() => parse({ nonWaking: { other: [] } })).toThrow(/nonWaking: unknown field\(s\): other/);
    expect(() => parse({ nonWaking: [] })).toThrow(/nonWaking: must be an object/);
    expect(() => parse({ nonWaking: "all" })).toThrow(/nonWaking: must be an object/);
  });
});

describe("header rules: the fast path's raw lines agree with the Headers version", () => {
  const from = { clientIp: "10.0.0.9", proto: "http", host: "gw.example", requestId: "req_1" };

  function parseLines(lines: string): [string, string][] {
    return lines
      .split("\r\n")
      .filter(Boolean)
      .map((l) => {
        const i = l.indexOf(": ");
        return [l.slice(0, i).toLowerCase(), l.slice(i + 2)];
      });
  }

  it("same headers on both entries (property), apart from host, content-length and expect which the fast path sets itself", () => {
    const name = fc.constantFrom(
      "x-a",
      "X-B",
      "connection",
      "keep-alive",
      "te",
      "upgrade",
      "authorization",
      "x-forwarded-for",
      "x-request-id",
      "cookie",
      "proxy-authorization",
      "accept",
      "host",
      "expect",
      "content-length",
    );
    const value = fc.constantFrom("1", "two", "x-a", "keep-alive, x-b", "close", "10.1.1.1", "a=b");
    fc.assert(
      fc.property(fc.array(fc.tuple(name, value), { maxLength: 12 }), fc.boolean(), (pairs, strip) => {
        const raw = pairs.flat();
        const headers = new Headers();
        for (const [k, v] of pairs) headers.append(k, v);
        const viaHeaders = upstreamRequestHeaders(headers, from, { stripAuthorization: strip });
        for (const k of ["host", "content-length", "expect"]) viaHeaders.delete(k);
        const viaLines = parseLines(upstreamRequestHeadLines(raw, from, { stripAuthorization: strip, host: "127.0.0.1:1" }));
        expect(viaLines[0]).toEqual(["host", "127.0.0.1:1"]);
        const grouped = new Map<string, string[]>();
        for (const [k, v] of viaLines.slice(1)) grouped.set(k, [...(grouped.get(k) ?? []), v]);
        const fromLines = [...grouped].map(([k, vs]) => [k, vs.join(k === "cookie" ? "; " : ", ")]).sort();
        const fromHeaders = [...viaHeaders].map(([k, v]) => [k, v]).sort();
        expect(fromLines).toEqual(fromHeaders);
      }),
      { numRuns: 300 },
    );
  });

  it("response headers: hop-by-hop and Connection-named ones dropped, set-cookie kept apart, on both entries", () => {
    const raw = [
      "Content-Type",
      "text/plain",
      "Connection",
      "close, X-Hop",
      "X-Hop",
      "1",
      "Keep-Alive",
      "timeout=5",
      "Set-Cookie",
      "a=1",
      "Set-Cookie",
      "b=2",
      "Transfer-Encoding",
      "chunked",
    ];
    expect(downstreamHeaderList(raw)).toEqual(["Content-Type", "text/plain", "Set-Cookie", "a=1", "Set-Cookie", "b=2"]);
    const h = new Headers();
    for (let i = 0; i < raw.length; i += 2) h.append(raw[i]!, raw[i + 1]!);
    const viaHeaders = withoutHopByHop(h);
    expect([...new Set(viaHeaders.keys())].sort()).toEqual(["content-type", "set-cookie"]);
    expect(viaHeaders.getSetCookie()).toEqual(["a=1", "b=2"]);
  });
});

describe("tenant limiter", () => {
  it("admits up to the limit per tenant, 429 with Retry-After beyond, and frees a slot exactly once per call", () => {
    const l = new TenantLimiter(2);
    const a1 = l.enter("ten_a");
    const a2 = l.enter("ten_a");
    const b1 = l.enter("ten_b");
    let err: unknown;
    try {
      l.enter("ten_a");
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(AppError);
    expect((err as AppError).status).toBe(429);
    expect((err as AppError).retryAfterS).toBe(1);
    a1();
    a1(); // idempotent: a second call must not free another call's slot
    expect(l.inFlight("ten_a")).toBe(1);
    l.enter("ten_a");
    expect(l.inFlight("ten_a")).toBe(2);
    a2();
    b1();
    expect(l.inFlight("ten_b")).toBe(0);
  });
});

describe("agent cache", () => {
  function fakeRepo() {
    const rows = new Map<string, AgentRow>();
    let reads = 0;
    let gate: Promise<void> | undefined;
    return {
      rows,
      reads: () => reads,
      hold(p: Promise<void>) {
        gate = p;
      },
      async get(id: string) {
        reads++;
        if (gate) await gate;
        return rows.get(id);
      },
    };
  }
  const row = (id: string, name: string) => ({ id, name }) as AgentRow;

  it("serves from memory within the TTL, refreshes in the background after it, and waits once it is too stale", async () => {
    let now = 0;
    const repo = fakeRepo();
    repo.rows.set("agt_a", row("agt_a", "v1"));
    const cache = createAgentCache(repo, undefined, { ttlMs: 1000, maxStaleMs: 10_000, maxEntries: 100, now: () => now });
    expect((await cache.get("agt_a"))?.row.name).toBe("v1");
    expect((await cache.get("agt_a"))?.overrides).toEqual(noOverrides);
    expect(repo.reads()).toBe(1);
    repo.rows.set("agt_a", row("agt_a", "v2"));
    now = 1500;
    expect((await cache.get("agt_a"))?.row.name).toBe("v1"); // stale, served while refreshing
    await new Promise((r) => setTimeout(r, 0));
    expect(repo.reads()).toBe(2);
    expect((await cache.get("agt_a"))?.row.name).toBe("v2");
    repo.rows.set("agt_a", row("agt_a", "v3"));
    now = 50_000;
    expect((await cache.get("agt_a"))?.row.name).toBe("v3"); // too stale: waited for the database
  });

  it("remembers unknown ids for the TTL; invalidation makes the next call read again", async () => {
    let now = 0;
    const repo = fakeRepo();
    const cache = createAgentCache(repo, undefined, { ttlMs: 1000, maxStaleMs: 10_000, maxEntries: 100, now: () => now });
    expect(await cache.get("agt_x")).toBeUndefined();
    expect(await cache.get("agt_x")).toBeUndefined();
    expect(repo.reads()).toBe(1);
    repo.rows.set("agt_x", row("agt_x", "new"));
    cache.invalidate("agt_x");
    expect((await cache.get("agt_x"))?.row.name).toBe("new");
    now = 10;
    repo.rows.delete("agt_x");
    cache.invalidate("agt_x");
    expect(await cache.get("agt_x")).toBeUndefined();
  });

  it("concurrent misses share one read; a read that started before an invalidation does not overwrite it", async () => {
    const repo = fakeRepo();
    repo.rows.set("agt_a", row("agt_a", "old"));
    const cache = createAgentCache(repo, undefined, { ttlMs: 1000, maxStaleMs: 10_000, maxEntries: 100, now: () => 0 });
    let open!: () => void;
    repo.hold(new Promise<void>((r) => (open = r)));
    const a = cache.get("agt_a");
    const b = cache.get("agt_a");
    cache.invalidate("agt_a");
    open();
    expect((await a)?.row.name).toBe("old");
    expect((await b)?.row.name).toBe("old");
    expect(repo.reads()).toBe(1);
    repo.hold(Promise.resolve());
    repo.rows.set("agt_a", row("agt_a", "new"));
    expect((await cache.get("agt_a"))?.row.name).toBe("new");
  });
});

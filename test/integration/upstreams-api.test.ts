// The upstreams API through the assembled gateway app over real Postgres: create, list (paged), get, patch, delete;
// header values never in an answer, never in the audit log, sealed at rest (and opened by the host's directory with
// the same key); tenant isolation; validation; a gateway without a key answers 501.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eq } from "drizzle-orm";
import { exportJWK, generateKeyPair, type JWK } from "jose";
import postgres from "postgres";
import { systemClock } from "../../lib/clock.ts";
import { componentKey } from "../../lib/host-token.ts";
import { silentLogger } from "../../lib/log.ts";
import { importSealKey } from "../../lib/seal.ts";
import { fromPrivateJwk, mintToken } from "../../compose/dev-keys.ts";
import { assembleGatewayApp } from "../../compose/gateway-app.ts";
import { createJwtAuthenticator } from "../../gateway/auth.ts";
import { defaultWebhookConfig } from "../../gateway/webhooks/index.ts";
import { auditLog } from "../../schema/core.ts";
import { upstreams } from "../../schema/operations.ts";
import { createUpstreamDirectory } from "../../fleet-agent/upstreams/directory.ts";
import { freshDatabase } from "../helpers/db.ts";
import { fakeFleet } from "../helpers/fake-fleet.ts";
import { testComponentSecret } from "../helpers/worker-stack.ts";

let database: Awaited<ReturnType<typeof freshDatabase>>;
let privateJwk: JWK;
const upstreamKey = crypto.getRandomValues(new Uint8Array(32));
const secret = "sk-THE-SECRET-VALUE-0123456789";

function gateway(withKey: boolean) {
  return assembleGatewayApp({
    db: database.db,
    fleet: fakeFleet({}),
    auth: createJwtAuthenticator({ keys: { jwks: fromPrivateJwk(privateJwk).jwks }, issuer: "agentvm-dev", audience: "agentvm", algorithms: ["ES256"] }),
    log: silentLogger,
    clock: systemClock,
    config: {
      domain: undefined,
      maxBodyBytes: 10_000,
      maxApiBodyBytes: 10_000,
      images: ["demo"],
      agentDefaults: { vcpus: 1, memMiB: 256, idleTimeoutMs: 1000, streamIdleMs: 1000 },
    },
    webhooks: defaultWebhookConfig,
    componentKey: componentKey(testComponentSecret),
    ...(withKey ? { upstreamKey } : {}),
    onWebhookQueued: () => {},
  }).app;
}

let app: ReturnType<typeof gateway>;

beforeAll(async () => {
  database = await freshDatabase();
  const { privateKey } = await generateKeyPair("ES256", { extractable: true });
  privateJwk = { ...(await exportJWK(privateKey)), kid: "k1" };
  app = gateway(true);
  const client = postgres(database.url, { max: 1, onnotice: () => {} });
  await client`insert into tenants (id, name) values ('ten_a', 'A'), ('ten_b', 'B') on conflict do nothing`;
  await client.end();
});
afterAll(async () => database?.close());

const token = (tenant: string, scopes = ["agents:admin"]) => mintToken(privateJwk, { tenant, subject: `user_${tenant}`, scopes: scopes as never });

async function call(method: string, path: string, tenant: string, body?: unknown, a = app) {
  const init: RequestInit = {
    method,
    headers: { authorization: `Bearer ${await token(tenant)}`, ...(body !== undefined ? { "content-type": "application/json" } : {}) },
  };
  if (body !== undefined) init.body = typeof body === "string" ? body : JSON.stringify(body);
  return a.request(path, init);
}

describe("upstreams API", () => {
  it("creates, lists, gets, patches and deletes; answers show header names, never a value", async () => {
    const created = await call("POST", "/v1/upstreams", "ten_a", {
      name: "openai",
      baseUrl: "https://api.openai.com/v1",
      headers: { Authorization: `Bearer ${secret}`, "OpenAI-Organization": "org-1" },
    });
    const createdText = await created.text();
    expect(created.status, createdText).toBe(201);
    expect(createdText).not.toContain(secret);
    const up = JSON.parse(createdText) as Record<string, unknown>;
    expect(up).toMatchObject({
      name: "openai",
      baseUrl: "https://api.openai.com/v1",
      headerNames: ["Authorization", "OpenAI-Organization"],
      url: "http://10.0.2.100:3128/u/openai",
      env: "AGENTVM_UPSTREAM_OPENAI_URL",
    });
    expect(up.id).toMatch(/^ups_/);
    expect(up).not.toHaveProperty("headers");

    expect((await call("POST", "/v1/upstreams", "ten_a", { name: "openai", baseUrl: "https://x.example" })).status).toBe(409);
    for (const name of ["b", "c"]) expect((await call("POST", "/v1/upstreams", "ten_a", { name, baseUrl: "https://x.example" })).status).toBe(201);

    const page1 = await call("GET", "/v1/upstreams?limit=2", "ten_a");
    const p1 = (await page1.json()) as { upstreams: { name: string }[]; nextCursor: string | null };
    expect(p1.upstreams.map((u) => u.name)).toEqual(["b", "c"]);
    const page2 = (await (await call("GET", `/v1/upstreams?limit=2&cursor=${p1.nextCursor}`, "ten_a")).json()) as typeof p1;
    expect(page2.upstreams.map((u) => u.name)).toEqual(["openai"]);
    expect(page2.nextCursor).toBeNull();

    const got = await call("GET", "/v1/upstreams/openai", "ten_a");
    const gotText = await got.text();
    expect(got.status).toBe(200);
    expect(gotText).not.toContain(secret);

    const patched = await call("PATCH", "/v1/upstreams/openai", "ten_a", { headers: { "X-Api-Key": "k2-secret" } });
    const patchedText = await patched.text();
    expect(patched.status, patchedText).toBe(200);
    expect(patchedText).not.toContain("k2-secret");
    expect(JSON.parse(patchedText)).toMatchObject({ headerNames: ["X-Api-Key"], baseUrl: "https://api.openai.com/v1" });
    const moved = (await (await call("PATCH", "/v1/upstreams/openai", "ten_a", { baseUrl: "https://eu.api.openai.com/v1" })).json()) as {
      baseUrl: string;
      headerNames: string[];
    };
    expect(moved).toMatchObject({ baseUrl: "https://eu.api.openai.com/v1", headerNames: ["X-Api-Key"] });

    // At rest: sealed (no value in clear), and the host's directory opens it with the same key.
    const [row] = await database.db
      .select()
      .from(upstreams)
      .where(eq(upstreams.id, up.id as string));
    expect(row!.headersSealed).toMatch(/^v1\./);
    expect(row!.headersSealed).not.toContain("k2-secret");
    const directory = createUpstreamDirectory({ db: database.db, key: () => importSealKey(upstreamKey), clock: systemClock, cacheMs: 0 });
    expect(await directory.get("ten_a", "openai")).toEqual({
      id: up.id,
      name: "openai",
      baseUrl: "https://eu.api.openai.com/v1",
      headers: { "X-Api-Key": "k2-secret" },
    });
    expect(await directory.names("ten_a")).toEqual(["b", "c", "openai"]);

    expect((await call("DELETE", "/v1/upstreams/openai", "ten_a")).status).toBe(204);
    expect((await call("GET", "/v1/upstreams/openai", "ten_a")).status).toBe(404);
    expect((await call("DELETE", "/v1/upstreams/openai", "ten_a")).status).toBe(404);
    expect(await directory.get("ten_a", "openai")).toBeUndefined();
    // The name is free again once deleted.
    expect((await call("POST", "/v1/upstreams", "ten_a", { name: "openai", baseUrl: "https://x.example" })).status).toBe(201);

    // The audit log names headers, never their values.
    const audit = await database.db
      .select()
      .from(auditLog)
      .where(eq(auditLog.target, up.id as string));
    expect(audit.map((r) => r.action).sort()).toEqual(["upstream.create", "upstream.delete", "upstream.update", "upstream.update"]);
    const text = JSON.stringify(audit);
    expect(text).not.toContain(secret);
    expect(text).not.toContain("k2-secret");
    expect(audit.find((r) => r.action === "upstream.create")!.detail).toMatchObject({ headerNames: ["Authorization", "OpenAI-Organization"] });
    expect(audit.every((r) => r.actor === "user_ten_a" && r.tenantId === "ten_a")).toBe(true);
  });

  it("keeps tenants apart: another tenant neither sees nor changes them, and may use the same name", async () => {
    await call("POST", "/v1/upstreams", "ten_a", { name: "private", baseUrl: "https://a.example" });
    expect((await call("GET", "/v1/upstreams/private", "ten_b")).status).toBe(404);
    expect((await call("PATCH", "/v1/upstreams/private", "ten_b", { baseUrl: "https://evil.example" })).status).toBe(404);
    expect((await call("DELETE", "/v1/upstreams/private", "ten_b")).status).toBe(404);
    const list = (await (await call("GET", "/v1/upstreams", "ten_b")).json()) as { upstreams: unknown[] };
    expect(list.upstreams).toEqual([]);
    expect((await call("POST", "/v1/upstreams", "ten_b", { name: "private", baseUrl: "https://b.example" })).status).toBe(201);
    const a = (await (await call("GET", "/v1/upstreams/private", "ten_a")).json()) as { baseUrl: string };
    expect(a.baseUrl).toBe("https://a.example");
  });

  it.each([
    ["a bad name", { name: "Open_AI", baseUrl: "https://x.example" }, /name/],
    ["plain http to a public host", { name: "x", baseUrl: "http://api.example.com" }, /https/],
    ["credentials in the URL", { name: "x", baseUrl: "https://u:p@x.example" }, /user name/],
    ["a query", { name: "x", baseUrl: "https://x.example/?k=1" }, /query/],
    ["a hop-by-hop header", { name: "x", baseUrl: "https://x.example", headers: { Connection: "close" } }, /connection/i],
    ["Host", { name: "x", baseUrl: "https://x.example", headers: { Host: "y" } }, /Host/],
    ["a header name that is no token", { name: "x", baseUrl: "https://x.example", headers: { "Bad Name": "v" } }, /token/],
    ["too many headers", { name: "x", baseUrl: "https://x.example", headers: Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`h${i}`, "v"])) }, /32/],
    ["a value over 8 KiB", { name: "x", baseUrl: "https://x.example", headers: { A: "v".repeat(8193) } }, /8192/],
    ["an unknown field", { name: "x", baseUrl: "https://x.example", extra: 1 }, /unknown/],
  ])("refuses %s with 400 and the envelope", async (_what, body, why) => {
    const res = await call("POST", "/v1/upstreams", "ten_a", body);
    const err = (await res.json()) as { error: { code: string; message: string; requestId: string } };
    expect(res.status).toBe(400);
    expect(err.error.message).toMatch(why);
    expect(err.error.requestId).toMatch(/^req_/);
  });

  it("needs agents:admin; a gateway without an upstream key answers 501", async () => {
    const res = await app.request("/v1/upstreams", { headers: { authorization: `Bearer ${await token("ten_a", ["agents:invoke"])}` } });
    expect(res.status).toBe(403);
    const noKey = await call("GET", "/v1/upstreams", "ten_a", undefined, gateway(false));
    expect(noKey.status).toBe(501);
    expect(((await noKey.json()) as { error: { code: string } }).error.code).toBe("upstreams_unsupported");
  });
});

// The operator's hosts API through the assembled gateway app over real Postgres: health from the rows, agent counts, drain and undrain with their audit rows, paging, 403 and 404.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generateKeyPair, exportJWK, type JWK } from "jose";
import { and, asc, eq, sql } from "drizzle-orm";
import { silentLogger } from "../../lib/log.ts";
import { ManualClock } from "../../lib/clock.ts";
import { componentKey } from "../../lib/host-token.ts";
import { fromPrivateJwk, mintToken } from "../../compose/dev-keys.ts";
import { assembleGatewayApp } from "../../compose/gateway-app.ts";
import { createJwtAuthenticator } from "../../gateway/auth.ts";
import { defaultWebhookConfig } from "../../gateway/webhooks/index.ts";
import { auditLog, hosts } from "../../schema/core.ts";
import { queryRows } from "../../schema/db.ts";
import { freshDatabase } from "../helpers/db.ts";
import { fakeFleet } from "../helpers/fake-fleet.ts";
import { testComponentSecret } from "../helpers/worker-stack.ts";

let database: Awaited<ReturnType<typeof freshDatabase>>;
let privateJwk: JWK;
let app: ReturnType<typeof assembleGatewayApp>["app"];
const clock = new ManualClock(Date.UTC(2026, 2, 1, 12, 0, 0));

interface HostJson {
  id: string;
  url: string | null;
  driver: string;
  healthy: boolean;
  why: string | null;
  live: boolean;
  lastHeartbeatAt: string;
  heartbeatAgeMs: number;
  startedAt: string;
  clockSkewMs: number;
  capacityMiB: number;
  usedMiB: number;
  awakeAgents: number;
  agents: number;
  draining: boolean;
  drainingAt: string | null;
}
interface ErrorBody {
  error: { code: string; message: string };
}

beforeAll(async () => {
  database = await freshDatabase();
  const { privateKey } = await generateKeyPair("ES256", { extractable: true });
  privateJwk = { ...(await exportJWK(privateKey)), kid: "k1" };
  ({ app } = assembleGatewayApp({
    db: database.db,
    fleet: fakeFleet(),
    auth: createJwtAuthenticator({ keys: { jwks: fromPrivateJwk(privateJwk).jwks }, issuer: "agentvm-dev", audience: "agentvm", algorithms: ["ES256"] }),
    log: silentLogger,
    clock,
    config: {
      domain: undefined,
      maxBodyBytes: 10_000,
      maxApiBodyBytes: 10_000,
      images: ["demo"],
      agentDefaults: { vcpus: 1, memMiB: 256, idleTimeoutMs: 1000, streamIdleMs: 1000 },
    },
    webhooks: defaultWebhookConfig,
    componentKey: componentKey(testComponentSecret),
    onWebhookQueued: () => {},
    hostHealth: { liveWindowMs: 30_000, maxClockSkewMs: 5_000 },
  }));
  const db = database.db;
  // ten_ops is deliberately absent: an operator's tenant claim need not exist on the operator's routes.
  await db.execute(sql`insert into tenants (id, name) values ('ten_a', 'A')`);
  // h-live: fresh heartbeat, small skew; h-stale: 42 s without one; h-skewed: 612 s ahead; h-both: stale and 7.5 s behind.
  await db.execute(sql`insert into hosts (id, url, driver, capacity_mib, last_heartbeat_at, started_at, clock_skew_ms, used_mib, awake_agents) values
    ('h-live', 'http://127.0.0.1:9001', 'process', 4096, now() - interval '2 seconds', now() - interval '1 hour', 40, 512, 2),
    ('h-stale', 'http://127.0.0.1:9002', 'qemu', 8192, now() - interval '42.4 seconds', now() - interval '2 hours', 0, 0, 0),
    ('h-skewed', 'http://127.0.0.1:9003', 'process', 2048, now(), now(), 612000, 0, 0),
    ('h-both', null, 'firecracker', 1024, now() - interval '10 minutes', now() - interval '1 day', -7500, 256, 1)`);
  // h-live holds 3 live agents and a deleted one; h-stale holds one; an agent without a host counts nowhere.
  await db.execute(sql`insert into agents (id, tenant_id, name, image, host_id, state, deleted_at) values
    ('agt_1', 'ten_a', 'a1', 'demo', 'h-live', 'running', null),
    ('agt_2', 'ten_a', 'a2', 'demo', 'h-live', 'hibernated', null),
    ('agt_3', 'ten_a', 'a3', 'demo', 'h-live', 'running', null),
    ('agt_4', 'ten_a', 'a4', 'demo', 'h-live', 'deleted', now()),
    ('agt_5', 'ten_a', 'a5', 'demo', 'h-stale', 'hibernated', null),
    ('agt_6', 'ten_a', 'a6', 'demo', null, 'creating', null)`);
});
afterAll(async () => database?.close());

const token = (tenant: string, scopes: string[], subject = `user_${tenant}`) => mintToken(privateJwk, { tenant, subject, scopes: scopes as never });
const operator = () => token("ten_ops", ["operator"], "op_1");

async function call<T>(method: string, path: string, bearer?: string): Promise<{ status: number; body: T; requestId: string | null }> {
  const res = await app.request(path, { method, headers: bearer ? { authorization: `Bearer ${bearer}` } : {} });
  return { status: res.status, body: (await res.json()) as T, requestId: res.headers.get("x-request-id") };
}

const drainingAtOf = async (id: string) => (await database.db.select({ at: hosts.drainingAt }).from(hosts).where(eq(hosts.id, id)))[0]!.at;

describe("GET /v1/hosts", () => {
  it("lists every host by id with its health, load and count of non-deleted agents", async () => {
    const res = await call<{ hosts: HostJson[]; nextCursor: string | null }>("GET", "/v1/hosts", await operator());
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.nextCursor).toBeNull();
    const byId = new Map(res.body.hosts.map((h) => [h.id, h]));
    expect(res.body.hosts.map((h) => h.id)).toEqual(["h-both", "h-live", "h-skewed", "h-stale"]);

    const live = byId.get("h-live")!;
    expect(live).toMatchObject({
      url: "http://127.0.0.1:9001",
      driver: "process",
      healthy: true,
      why: null,
      live: true,
      clockSkewMs: 40,
      capacityMiB: 4096,
      usedMiB: 512,
      awakeAgents: 2,
      agents: 3,
      draining: false,
      drainingAt: null,
    });
    expect(live.heartbeatAgeMs).toBeGreaterThanOrEqual(2000);
    expect(live.heartbeatAgeMs).toBeLessThan(20_000);
    expect(Date.parse(live.startedAt)).toBeLessThan(Date.parse(live.lastHeartbeatAt));

    expect(byId.get("h-stale")).toMatchObject({ healthy: false, live: false, agents: 1, driver: "qemu" });
    // 42.4 s at the insert, and whatever a loaded machine took since (CI once saw more than 0.6 s).
    expect(byId.get("h-stale")!.why).toMatch(/^no heartbeat for 4[2-5] s$/);
    expect(byId.get("h-skewed")).toMatchObject({ healthy: false, live: true, why: "clock 612 s ahead", agents: 0, clockSkewMs: 612_000 });
    expect(byId.get("h-both")).toMatchObject({ healthy: false, live: false, url: null, clockSkewMs: -7500, agents: 0 });
    expect(byId.get("h-both")!.why).toMatch(/^no heartbeat for 6\d\d s; clock 7\.5 s behind$/);
  });

  it("pages by id with no host twice or missed, and refuses a cursor it did not give", async () => {
    const op = await operator();
    const seen: string[] = [];
    let cursor: string | null = null;
    let pages = 0;
    do {
      const res: { status: number; body: { hosts: HostJson[]; nextCursor: string | null } } = await call(
        "GET",
        `/v1/hosts?limit=3${cursor ? `&cursor=${cursor}` : ""}`,
        op,
      );
      expect(res.status).toBe(200);
      seen.push(...res.body.hosts.map((h) => h.id));
      cursor = res.body.nextCursor;
      pages++;
    } while (cursor && pages < 10);
    expect(pages).toBe(2);
    expect(seen).toEqual(["h-both", "h-live", "h-skewed", "h-stale"]);
    const bad = await call<ErrorBody>("GET", "/v1/hosts?cursor=bm90LWEtY3Vyc29y", op);
    expect([bad.status, bad.body.error.code]).toEqual([400, "bad_request"]);
  });

  it("shows one host, 404 for an unknown id, 400 for an id no host can have", async () => {
    const op = await operator();
    const one = await call<HostJson>("GET", "/v1/hosts/h-live", op);
    expect(one.status).toBe(200);
    expect(one.body).toMatchObject({ id: "h-live", agents: 3, healthy: true });
    const missing = await call<ErrorBody>("GET", "/v1/hosts/h-nowhere", op);
    expect([missing.status, missing.body.error.code, missing.body.error.message]).toEqual([404, "not_found", "host h-nowhere not found"]);
    const long = await call<ErrorBody>("GET", `/v1/hosts/${"h".repeat(129)}`, op);
    expect([long.status, long.body.error.code]).toEqual([400, "bad_request"]);
    const odd = await call<ErrorBody>("GET", "/v1/hosts/h%20live%3B", op);
    expect([odd.status, odd.body.error.code]).toEqual([400, "bad_request"]);
    expect((await call<HostJson>("GET", `/v1/hosts/${"h".repeat(128)}`, op)).status).toBe(404);
  });

  it("is the operator's: 401 without a token, 403 for a tenant's admin token, on every route", async () => {
    const tenant = await token("ten_a", ["agents:admin", "agents:invoke", "usage:read"]);
    for (const [method, path] of [
      ["GET", "/v1/hosts"],
      ["GET", "/v1/hosts/h-live"],
      ["POST", "/v1/hosts/h-live/drain"],
      ["POST", "/v1/hosts/h-live/undrain"],
    ] as const) {
      const refused = await call<ErrorBody>(method, path, tenant);
      expect([path, refused.status, refused.body.error.code]).toEqual([path, 403, "forbidden"]);
      const anonymous = await call<ErrorBody>(method, path);
      expect([path, anonymous.status]).toEqual([path, 401]);
    }
    expect(await drainingAtOf("h-live")).toBeNull();
  });
});

describe("drain and undrain", () => {
  it("drain sets draining_at once (202, idempotent), undrain clears it; each call is audited with actor, target and request id", async () => {
    const op = await operator();
    const drained = await call<HostJson>("POST", "/v1/hosts/h-live/drain", op);
    expect(drained.status, JSON.stringify(drained.body)).toBe(202);
    expect(drained.body).toMatchObject({
      id: "h-live",
      draining: true,
      drainingAt: new Date(clock.now()).toISOString(),
      healthy: false,
      why: "draining",
      agents: 3,
    });
    expect((await drainingAtOf("h-live"))?.toISOString()).toBe(new Date(clock.now()).toISOString());

    // Again, later: the first drain's time stands.
    const first = new Date(clock.now()).toISOString();
    clock.advance(60_000);
    const again = await call<HostJson>("POST", "/v1/hosts/h-live/drain", op);
    expect([again.status, again.body.drainingAt]).toEqual([202, first]);
    expect((await call<{ hosts: HostJson[] }>("GET", "/v1/hosts", op)).body.hosts.find((h) => h.id === "h-live")).toMatchObject({
      draining: true,
      why: "draining",
    });

    const undrained = await call<HostJson>("POST", "/v1/hosts/h-live/undrain", op);
    expect(undrained.status).toBe(200);
    expect(undrained.body).toMatchObject({ draining: false, drainingAt: null, healthy: true, why: null });
    expect(await drainingAtOf("h-live")).toBeNull();
    const twice = await call<HostJson>("POST", "/v1/hosts/h-live/undrain", op);
    expect([twice.status, twice.body.draining]).toEqual([200, false]);

    const rows = await database.db
      .select()
      .from(auditLog)
      .where(and(eq(auditLog.target, "h-live")))
      .orderBy(asc(auditLog.id));
    expect(rows.map((r) => [r.action, r.actor, r.tenantId, (r.detail as { changed: boolean }).changed])).toEqual([
      ["host.drain", "op_1", null, true],
      ["host.drain", "op_1", null, false],
      ["host.undrain", "op_1", null, true],
      ["host.undrain", "op_1", null, false],
    ]);
    expect(rows.map((r) => r.requestId)).toEqual([drained.requestId, again.requestId, undrained.requestId, twice.requestId]);
    expect(rows.every((r) => (r.seq ?? 0) > 0 && r.hash !== null)).toBe(true);
  });

  it("a drain reason adds to the others; an unknown host is 404 and writes no audit row", async () => {
    const op = await operator();
    const drained = await call<HostJson>("POST", "/v1/hosts/h-skewed/drain", op);
    expect(drained.body.why).toBe("clock 612 s ahead; draining");
    const missing = await call<ErrorBody>("POST", "/v1/hosts/h-nowhere/drain", op);
    expect([missing.status, missing.body.error.code]).toEqual([404, "not_found"]);
    expect((await call<ErrorBody>("POST", "/v1/hosts/h-nowhere/undrain", op)).status).toBe(404);
    const n = await queryRows<{ n: number }>(database.db, sql`select count(*)::int as n from audit_log where target = 'h-nowhere'`);
    expect(n[0]!.n).toBe(0);
  });
});

// Tenants that exist: the operator's lifecycle (create, page, suspend, resume, delete) and the tenant gate on every entry, over the whole system (real Postgres, process driver, real sockets).
//
// Before: a valid token of any tenant but the demo one got `500 internal` on POST /v1/agents (the agents → tenants
// foreign key), there was no way to create a tenant, and nothing checked a tenant's status anywhere.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { and, asc, eq } from "drizzle-orm";
import { agents, auditLog, tenants } from "../../schema/core.ts";
import { meterSegments } from "../../schema/billing.ts";
import { webhookDeliveries } from "../../schema/webhooks.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";
import { standardHeaders } from "../helpers/webhook-fixtures.ts";
import { waitFor } from "../helpers/wait.ts";

let sys: TestSystem;
let operator: string;

beforeAll(async () => {
  sys = await startSystem({ env: { METER_HEARTBEAT_MS: "500" } });
  operator = await sys.token({ tenant: "ten_operator", scopes: ["operator"] });
}, 60_000);
afterAll(async () => {
  await sys?.stop();
});

interface ErrorBody {
  error: { code: string; message: string };
}
interface TenantJson {
  id: string;
  name: string;
  timeZone: string;
  status: string;
  statusReason: string | null;
  suspendedAt: string | null;
  deletedAt: string | null;
}

const jsonInit = (method: string, body: unknown, token: string): RequestInit & { token: string } => ({
  method,
  body: JSON.stringify(body),
  headers: { "content-type": "application/json" },
  token,
});

async function answer<T>(res: Response): Promise<{ status: number; body: T }> {
  return { status: res.status, body: (await res.json()) as T };
}

const op = (path: string, init: RequestInit = {}) => sys.call(path, { ...init, token: operator });
const tenantToken = (tenant: string) => sys.token({ tenant, scopes: ["agents:invoke", "agents:admin", "images:read", "usage:read"] });

async function createTenant(body: Record<string, unknown>): Promise<TenantJson> {
  const res = await answer<TenantJson>(await sys.call("/v1/tenants", jsonInit("POST", body, operator)));
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body;
}

async function auditActions(tenantId: string): Promise<string[]> {
  const rows = await sys.database.db
    .select()
    .from(auditLog)
    .where(and(eq(auditLog.tenantId, tenantId), eq(auditLog.target, tenantId)))
    .orderBy(asc(auditLog.id));
  return rows.map((r) => `${r.action}:${r.actor}:${r.requestId ? "req" : "-"}`);
}

describe("tenants", () => {
  it("a token of a tenant that does not exist gets 403 tenant_not_found on every entry (it was a 500 on POST /v1/agents)", async () => {
    const ghost = await tenantToken("ten_ghost");
    const created = await answer<ErrorBody>(await sys.call("/v1/agents", jsonInit("POST", {}, ghost)));
    expect(created.status).toBe(403);
    expect(created.body.error).toEqual({ code: "tenant_not_found", message: "tenant ten_ghost does not exist", requestId: expect.any(String) });
    for (const path of ["/v1/agents", "/v1/usage?from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z", "/v1/images", "/v1/invoices"]) {
      const res = await answer<ErrorBody>(await sys.call(path, { token: ghost }));
      expect([path, res.status, res.body.error.code]).toEqual([path, 403, "tenant_not_found"]);
    }
    // Agent traffic: the demo agent with a ghost tenant's token, on the Node fast path (real socket) and the Hono path.
    const viaSocket = await answer<ErrorBody>(await sys.call(`/a/${sys.demo.agentId}/`, { token: ghost }));
    expect([viaSocket.status, viaSocket.body.error.code]).toEqual([403, "tenant_not_found"]);
    const viaApp = await answer<ErrorBody>(await sys.app.request(`/a/${sys.demo.agentId}/`, { headers: { authorization: `Bearer ${ghost}` } }));
    expect([viaApp.status, viaApp.body.error.code]).toEqual([403, "tenant_not_found"]);
    expect((await sys.database.db.select().from(tenants).where(eq(tenants.id, "ten_ghost"))).length).toBe(0);
  });

  it("only an operator token may drive tenants: others get 403 forbidden; an operator's own tenant claim need not exist", async () => {
    for (const [method, path] of [
      ["GET", "/v1/tenants"],
      ["POST", "/v1/tenants"],
      ["GET", "/v1/tenants/ten_demo"],
      ["POST", "/v1/tenants/ten_demo/suspend"],
      ["POST", "/v1/tenants/ten_demo/resume"],
      ["DELETE", "/v1/tenants/ten_demo"],
    ] as const) {
      const res = await answer<ErrorBody>(await sys.call(path, { method, ...(method === "POST" ? { body: "{}" } : {}) }));
      expect([method, path, res.status, res.body.error.code]).toEqual([method, path, 403, "forbidden"]);
    }
    expect((await sys.call("/v1/tenants", { token: "" })).status).toBe(401);
    expect((await op("/v1/tenants")).status).toBe(200);
    // `operator` is no tenant scope: the operator token on a tenant route is checked like any other (its tenant does not exist).
    const onAgents = await answer<ErrorBody>(await op("/v1/agents"));
    expect([onAgents.status, onAgents.body.error.code]).toEqual([403, "tenant_not_found"]);
    // And the demo token never carries `operator`.
    expect((await sys.call("/v1/tenants")).status).toBe(403);
  });

  it("create: a generated ten_ id or an explicit one, 409 when it exists, bad input 400; then the tenant's token works", async () => {
    const generated = await createTenant({ name: "Generated" });
    expect(generated).toMatchObject({
      id: expect.stringMatching(/^ten_[0-9a-z]{16}$/),
      name: "Generated",
      timeZone: "UTC",
      status: "active",
      statusReason: null,
    });
    const explicit = await createTenant({ id: "acme-corp.eu", name: "Acme", timeZone: "Europe/Berlin" });
    expect(explicit).toMatchObject({ id: "acme-corp.eu", timeZone: "Europe/Berlin", status: "active" });
    const again = await answer<ErrorBody>(await sys.call("/v1/tenants", jsonInit("POST", { id: "acme-corp.eu", name: "Other" }, operator)));
    expect([again.status, again.body.error.code]).toEqual([409, "conflict"]);
    for (const bad of [
      {},
      { name: "" },
      { name: "x", id: "../etc" },
      { name: "x", id: "a".repeat(65) },
      { name: "x", timeZone: "Mars/Olympus" },
      { name: "x", extra: 1 },
    ]) {
      const res = await answer<ErrorBody>(await sys.call("/v1/tenants", jsonInit("POST", bad, operator)));
      expect([JSON.stringify(bad), res.status, res.body.error.code]).toEqual([JSON.stringify(bad), 400, "bad_request"]);
    }
    expect((await answer<TenantJson>(await op("/v1/tenants/acme-corp.eu"))).body).toMatchObject({ id: "acme-corp.eu", name: "Acme" });
    expect((await op("/v1/tenants/ten_nosuch")).status).toBe(404);
    // The tenant's own token now creates agents (201, not 500).
    const agent = await sys.createAgent({}, await tenantToken("acme-corp.eu"));
    expect(agent).toMatchObject({ tenantId: "acme-corp.eu" });
    expect(await auditActions("acme-corp.eu")).toEqual(["tenant.create:dev:req"]);
  });

  it("lists tenants a page at a time with no duplicate or gap, filtered by status", async () => {
    for (let i = 0; i < 5; i++) await createTenant({ id: `ten_page${i}`, name: `page ${i}` });
    const seen: string[] = [];
    let cursor: string | null = null;
    let pages = 0;
    do {
      const q: string = `/v1/tenants?limit=2${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
      const page = await answer<{ tenants: TenantJson[]; nextCursor: string | null }>(await op(q));
      expect(page.status).toBe(200);
      expect(page.body.tenants.length).toBeLessThanOrEqual(2);
      seen.push(...page.body.tenants.map((t) => t.id));
      cursor = page.body.nextCursor;
      pages++;
    } while (cursor && pages < 50);
    const all = (await sys.database.db.select({ id: tenants.id }).from(tenants)).map((r) => r.id);
    expect(new Set(seen).size).toBe(seen.length);
    expect([...seen].sort()).toEqual([...all].sort());
    expect(seen.filter((id) => id.startsWith("ten_page"))).toEqual(["ten_page0", "ten_page1", "ten_page2", "ten_page3", "ten_page4"]);
    expect((await op("/v1/tenants?cursor=garbage")).status).toBe(400);
    expect((await op("/v1/tenants?status=bogus")).status).toBe(400);
    await answer(await sys.call("/v1/tenants/ten_page3/suspend", jsonInit("POST", {}, operator)));
    const suspended = await answer<{ tenants: TenantJson[] }>(await op("/v1/tenants?status=suspended"));
    expect(suspended.body.tenants.map((t) => t.id)).toEqual(["ten_page3"]);
  });

  it("suspend → its awake agents hibernate, every call (token, public agent, admin API, webhook) is 403 tenant_suspended; resume → all answer again", async () => {
    await createTenant({ id: "ten_susp", name: "Suspended soon" });
    const token = await tenantToken("ten_susp");
    const privateAgent = await sys.createAgent({ idleTimeoutMs: 600_000 }, token);
    const publicAgent = await sys.createAgent({ idleTimeoutMs: 600_000, public: true }, token);
    const hook = await answer<{ secret: string }>(
      await sys.call(`/v1/agents/${privateAgent.id}/webhooks`, jsonInit("POST", { name: "events", scheme: "standard", path: "/counter" }, token)),
    );
    expect(hook.status).toBe(201);
    expect((await sys.call(`/a/${privateAgent.id}/counter`, { method: "POST", token })).status).toBe(200);
    expect((await sys.call(`/a/${publicAgent.id}/`, { token: "" })).status).toBe(200);
    expect(await sys.state(privateAgent.id)).not.toBe("hibernated");

    const suspended = await answer<{ tenant: TenantJson; hibernated: string[]; failed: unknown[] }>(
      await sys.call("/v1/tenants/ten_susp/suspend", jsonInit("POST", { reason: "invoice 2026-10 unpaid" }, operator)),
    );
    expect(suspended.status).toBe(200);
    expect(suspended.body.tenant).toMatchObject({ status: "suspended", statusReason: "invoice 2026-10 unpaid", suspendedAt: expect.any(String) });
    expect([...suspended.body.hibernated].sort()).toEqual([privateAgent.id, publicAgent.id].sort());
    expect(suspended.body.failed).toEqual([]);
    // Hibernated, not deleted.
    for (const id of [privateAgent.id, publicAgent.id]) expect((await sys.host.status(id))?.state).toBe("hibernated");
    const rows = await sys.database.db.select().from(agents).where(eq(agents.tenantId, "ten_susp"));
    expect(rows.map((r) => r.deletedAt)).toEqual([null, null]);

    const refused = { code: "tenant_suspended", message: "tenant ten_susp is suspended: invoice 2026-10 unpaid" };
    const expectRefused = async (res: Response, what: string) => {
      const a = await answer<ErrorBody>(res);
      expect([what, a.status, a.body.error.code, a.body.error.message]).toEqual([what, 403, refused.code, refused.message]);
    };
    await expectRefused(await sys.call(`/a/${privateAgent.id}/counter`, { method: "POST", token }), "private agent, fast path");
    await expectRefused(
      await sys.app.request(`/a/${privateAgent.id}/counter`, { method: "POST", headers: { authorization: `Bearer ${token}` } }),
      "private agent, Hono path",
    );
    await expectRefused(await sys.call(`/a/${publicAgent.id}/`, { token: "" }), "public agent, no token, fast path");
    await expectRefused(await sys.app.request(`/a/${publicAgent.id}/`), "public agent, no token, Hono path");
    await expectRefused(await sys.call(`/a/${publicAgent.id}/`), "public agent, another tenant's token");
    await expectRefused(await sys.call("/v1/agents", { token }), "admin API");
    await expectRefused(await sys.call("/v1/agents", jsonInit("POST", {}, token)), "create");
    await expectRefused(await sys.call(`/v1/agents/${privateAgent.id}/webhooks`, { token }), "webhook admin");
    const body = JSON.stringify({ type: "ping" });
    await expectRefused(
      await sys.call(`/hooks/${privateAgent.id}/events`, {
        method: "POST",
        headers: await standardHeaders(hook.body.secret, body, { timestampS: Math.floor(Date.now() / 1000) }),
        body,
        token: "",
      }),
      "webhook intake",
    );
    expect(await sys.database.db.select().from(webhookDeliveries).where(eq(webhookDeliveries.agentId, privateAgent.id))).toEqual([]);
    // Nothing woke them.
    for (const id of [privateAgent.id, publicAgent.id]) expect((await sys.host.status(id))?.state).toBe("hibernated");
    // Idempotent: suspending again keeps the first instant and reason.
    const twice = await answer<{ tenant: TenantJson; hibernated: string[] }>(
      await sys.call("/v1/tenants/ten_susp/suspend", jsonInit("POST", { reason: "other" }, operator)),
    );
    expect(twice.body.tenant).toEqual(suspended.body.tenant);
    expect(twice.body.hibernated).toEqual([]);

    const resumed = await answer<TenantJson>(await op("/v1/tenants/ten_susp/resume", { method: "POST" }));
    expect(resumed.body).toMatchObject({ status: "active", statusReason: null, suspendedAt: null });
    expect((await answer<TenantJson>(await op("/v1/tenants/ten_susp/resume", { method: "POST" }))).body.status).toBe("active");
    expect((await sys.call(`/a/${privateAgent.id}/counter`, { method: "POST", token })).status).toBe(200);
    expect((await sys.call(`/a/${publicAgent.id}/`, { token: "" })).status).toBe(200);
    expect((await sys.call("/v1/agents", { token })).status).toBe(200);
    expect(await auditActions("ten_susp")).toEqual([
      "tenant.create:dev:req",
      "tenant.suspend:dev:req",
      "tenant.suspend:dev:req",
      "tenant.resume:dev:req",
      "tenant.resume:dev:req",
    ]);
  }, 60_000);

  it("delete → its agents are destroyed, the tenant row is kept as deleted with its usage; its calls get 403 tenant_deleted", async () => {
    await createTenant({ id: "ten_gone", name: "Deleted soon" });
    const token = await tenantToken("ten_gone");
    const a1 = await sys.createAgent({ idleTimeoutMs: 600_000, public: true }, token);
    const a2 = await sys.createAgent({}, token);
    expect((await sys.call(`/a/${a1.id}/counter`, { method: "POST", token })).status).toBe(200);
    // The awake agent's metered time reaches billing (heartbeat 500 ms).
    await waitFor(
      async () => (await sys.database.db.select().from(meterSegments).where(eq(meterSegments.agentId, a1.id))).length > 0,
      15_000,
      "meter segments of the awake agent",
    );

    const deleted = await answer<{ tenant: TenantJson; destroyed: string[] }>(await op("/v1/tenants/ten_gone", { method: "DELETE" }));
    expect(deleted.status).toBe(200);
    expect(deleted.body.tenant).toMatchObject({ id: "ten_gone", status: "deleted", deletedAt: expect.any(String) });
    expect([...deleted.body.destroyed].sort()).toEqual([a1.id, a2.id].sort());
    const rows = await sys.database.db.select().from(agents).where(eq(agents.tenantId, "ten_gone"));
    expect(rows.every((r) => r.deletedAt !== null && r.state === "destroyed")).toBe(true);
    expect(await sys.host.status(a1.id)).toBeUndefined();
    expect((await sys.database.db.select().from(tenants).where(eq(tenants.id, "ten_gone")))[0]).toMatchObject({ status: "deleted" });
    expect((await sys.database.db.select().from(meterSegments).where(eq(meterSegments.agentId, a1.id))).length).toBeGreaterThan(0);

    const onApi = await answer<ErrorBody>(await sys.call("/v1/agents", { token }));
    expect([onApi.status, onApi.body.error]).toEqual([403, { code: "tenant_deleted", message: "tenant ten_gone was deleted", requestId: expect.any(String) }]);
    expect((await sys.call(`/a/${a1.id}/`, { token: "" })).status).toBe(404); // the agent is gone
    // Idempotent; a deleted tenant cannot be suspended or resumed.
    expect((await answer<{ destroyed: string[] }>(await op("/v1/tenants/ten_gone", { method: "DELETE" }))).body.destroyed).toEqual([]);
    expect((await op("/v1/tenants/ten_gone/resume", { method: "POST" })).status).toBe(409);
    expect((await sys.call("/v1/tenants/ten_gone/suspend", jsonInit("POST", {}, operator))).status).toBe(409);
    expect(await auditActions("ten_gone")).toEqual(["tenant.create:dev:req", "tenant.delete:dev:req", "tenant.delete:dev:req"]);
  }, 60_000);
});

describe("first-use provisioning (TENANTS_AUTO_PROVISION=true)", () => {
  let auto: TestSystem;
  beforeAll(async () => {
    auto = await startSystem({ env: { TENANTS_AUTO_PROVISION: "true" } });
  }, 60_000);
  afterAll(async () => {
    await auto?.stop();
  });

  it("a verified token of an unknown tenant creates it (name = id, UTC, audited) and is served; a suspended one is not re-created", async () => {
    const token = await auto.token({ tenant: "ten_newcomer", scopes: ["agents:invoke", "agents:admin"] });
    const agent = await auto.createAgent({}, token);
    expect(agent).toMatchObject({ tenantId: "ten_newcomer" });
    const row = (await auto.database.db.select().from(tenants).where(eq(tenants.id, "ten_newcomer")))[0];
    expect(row).toMatchObject({ name: "ten_newcomer", timeZone: "UTC", status: "active" });
    const audit = await auto.database.db
      .select()
      .from(auditLog)
      .where(and(eq(auditLog.tenantId, "ten_newcomer"), eq(auditLog.action, "tenant.provision")));
    expect(audit.map((a) => [a.actor, a.target])).toEqual([["dev", "ten_newcomer"]]);
    // On the fast path too (first call of another new tenant straight to a public agent).
    const other = await auto.token({ tenant: "ten_walkin", scopes: ["agents:invoke"] });
    expect((await auto.call(`/a/${agent.id}/`, { token: other })).status).toBe(404); // provisioned, but another tenant's private agent
    expect((await auto.database.db.select().from(tenants).where(eq(tenants.id, "ten_walkin"))).length).toBe(1);
    // A tenant claim that is no tenant id is not provisioned.
    const odd = await auto.token({ tenant: "no spaces allowed", scopes: ["agents:admin"] });
    const refused = await answer<ErrorBody>(await auto.call("/v1/agents", { token: odd }));
    expect([refused.status, refused.body.error.code]).toEqual([403, "tenant_not_found"]);
    // Suspension holds: provisioning never revives a tenant the operator suspended.
    const opToken = await auto.token({ tenant: "ten_operator", scopes: ["operator"] });
    expect((await auto.call("/v1/tenants/ten_newcomer/suspend", { method: "POST", body: "{}", token: opToken })).status).toBe(200);
    expect((await answer<ErrorBody>(await auto.call("/v1/agents", { token }))).body.error.code).toBe("tenant_suspended");
  }, 30_000);
});

// GET /v1/audit and /v1/audit/verify through the assembled gateway app over real Postgres, `npm run audit:verify`, and the coverage check: every mutating API operation leaves an audit row (or is exempt, with a reason).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generateKeyPair, exportJWK, type JWK } from "jose";
import postgres from "postgres";
import { eq, sql } from "drizzle-orm";
import { silentLogger } from "../../lib/log.ts";
import { systemClock } from "../../lib/clock.ts";
import { componentKey } from "../../lib/host-token.ts";
import { newId } from "../../lib/ids.ts";
import type { ImageArtifact } from "../../contracts/image.ts";
import { fromPrivateJwk, mintToken } from "../../compose/dev-keys.ts";
import { assembleGatewayApp } from "../../compose/gateway-app.ts";
import { createJwtAuthenticator } from "../../gateway/auth.ts";
import { defaultWebhookConfig } from "../../gateway/webhooks/index.ts";
import { signGithub } from "../../gateway/webhooks/signature.ts";
import { BuildRecord, type BuildUpload, type ImageBuilder } from "../../images/builds.ts";
import { createDbAuditLog } from "../../schema/audit-log.ts";
import { auditLog } from "../../schema/core.ts";
import { queryRows } from "../../schema/db.ts";
import { main as auditVerifyMain } from "../../scripts/audit-verify.ts";
import { freshDatabase } from "../helpers/db.ts";
import { fakeFleet } from "../helpers/fake-fleet.ts";
import { checkpointView, createDbCheckpointStore, type CheckpointRecord } from "../../fleet-agent/checkpoints.ts";
import { testComponentSecret } from "../helpers/worker-stack.ts";

let database: Awaited<ReturnType<typeof freshDatabase>>;
let privateJwk: JWK;
let app: ReturnType<typeof assembleGatewayApp>["app"];

/** Builds succeed at once with a fixed artifact (the image routes need a builder to create images). */
class InstantBuilder implements ImageBuilder {
  readonly builds = new Map<string, BuildRecord>();
  start(upload: BuildUpload): BuildRecord {
    const record = new BuildRecord(newId("build"), upload.tenantId, upload.kind, new Date());
    this.builds.set(record.id, record);
    void (async () => {
      const text = await new Response(upload.body).text();
      const digest = `sha256:${Buffer.from(text.padEnd(32, "x").slice(0, 32)).toString("hex")}`;
      const artifact: ImageArtifact = {
        digest,
        rootfs: `/nowhere/${digest}`,
        sizeBytes: 1,
        config: { entrypoint: [], cmd: ["true"], env: [], workdir: "/", user: "", uid: 0, gid: 0, port: 8080 },
      };
      record.succeed(artifact, new Date());
    })();
    return record;
  }
  get(id: string) {
    return this.builds.get(id);
  }
  async removeFiles() {}
}

beforeAll(async () => {
  database = await freshDatabase();
  const { privateKey } = await generateKeyPair("ES256", { extractable: true });
  privateJwk = { ...(await exportJWK(privateKey)), kid: "k1" };
  ({ app } = assembleGatewayApp({
    db: database.db,
    fleet: fakeFleet({
      addLease: async () => ({ leaseId: "lse_cov", expiresAt: Date.now() + 60_000 }),
      dropLease: async () => true,
      async checkpoint(agent, opts) {
        const r: CheckpointRecord = {
          id: newId("checkpoint"),
          tenantId: agent.tenantId,
          agentId: agent.id,
          hostId: "host_cov",
          name: opts.name ?? null,
          origin: "api",
          bytes: 1,
          pausedMs: 0,
          createdAt: new Date(),
          requestId: opts.requestId ?? null,
        };
        await createDbCheckpointStore(database.db).insert(r);
        return checkpointView(r);
      },
      restoreCheckpoint: async () => "hibernated",
      fork: async () => "hibernated",
      deleteCheckpoint: async (_a, id) => void (await createDbCheckpointStore(database.db).markDeleted(id, new Date())),
    }),
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
    upstreamKey: new Uint8Array(32).fill(7),
    imageBuilder: new InstantBuilder(),
    maxImageUploadBytes: 10_000,
    onWebhookQueued: () => {},
  }));
  // The tenants this file's tokens name (the gateway refuses tokens of tenants that do not exist).
  const client = postgres(database.url, { max: 1, onnotice: () => {} });
  await client`insert into tenants (id, name) values ('ten_a', 'A'), ('ten_b', 'B'), ('ten_ops', 'operators') on conflict do nothing`;
  await client.end();
});
afterAll(async () => database?.close());

const token = (tenant: string, scopes: string[], subject = `user_${tenant}`) => mintToken(privateJwk, { tenant, subject, scopes: scopes as never });
const admin = (tenant = "ten_a") => token(tenant, ["agents:admin", "agents:invoke", "usage:read"]);
const operator = () => token("ten_ops", ["operator"], "op_1");

async function call(method: string, path: string, bearer: string, body?: unknown, headers: Record<string, string> = {}) {
  const init: RequestInit = {
    method,
    headers: { authorization: `Bearer ${bearer}`, ...(body !== undefined ? { "content-type": "application/json" } : {}), ...headers },
  };
  if (body !== undefined) init.body = typeof body === "string" ? body : JSON.stringify(body);
  return app.request(path, init);
}

interface Entry {
  id: number;
  seq: number;
  at: string;
  actor: string;
  action: string;
  target: string;
  requestId: string | null;
  detail: Record<string, unknown> | null;
  hash: string;
  prevHash: string;
}
interface Page {
  entries: Entry[];
  nextCursor: string | null;
}

describe("GET /v1/audit", () => {
  beforeAll(async () => {
    const audit = createDbAuditLog(database.db);
    for (let i = 0; i < 25; i++)
      await audit.record({
        at: new Date(Date.UTC(2026, 0, 1, 0, i)),
        tenantId: "ten_b",
        actor: "user_b",
        action: i % 2 ? "agent.update" : "agent.create",
        target: `agt_b${i % 3}`,
        requestId: `req_b${i}`,
      });
    for (let i = 0; i < 5; i++) await audit.record({ tenantId: "ten_a", actor: "user_a", action: "agent.create", target: `agt_a${i}`, requestId: `req_a${i}` });
  });

  async function pages(query: string, tenant = "ten_b"): Promise<Page[]> {
    const out: Page[] = [];
    let cursor: string | null = null;
    do {
      const res = await call("GET", `/v1/audit?${query}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`, await admin(tenant));
      expect(res.status).toBe(200);
      out.push((await res.json()) as Page);
      cursor = out.at(-1)!.nextCursor;
    } while (cursor && out.length < 50);
    return out;
  }

  it("pages newest first by seq with no duplicate or gap, each entry linked to the one before it", async () => {
    const ps = await pages("limit=10");
    expect(ps.map((p) => p.entries.length)).toEqual([10, 10, 5]);
    const all = ps.flatMap((p) => p.entries);
    expect(all.map((e) => e.seq)).toEqual(Array.from({ length: 25 }, (_, i) => 25 - i));
    for (let i = 0; i + 1 < all.length; i++) expect(all[i]!.prevHash).toBe(all[i + 1]!.hash);
    expect(all.at(-1)!.prevHash).toBe("");
    expect(all[0]).toMatchObject({
      actor: "user_b",
      action: "agent.create",
      target: "agt_b0",
      requestId: "req_b24",
      at: "2026-01-01T00:24:00.000Z",
      detail: null,
    });
    expect(all[0]!.hash).toMatch(/^[0-9a-f]{64}$/);
  });

  it("never shows another tenant's rows", async () => {
    const a = (await pages("limit=100", "ten_a")).flatMap((p) => p.entries);
    expect(a.map((e) => e.target)).toEqual(["agt_a4", "agt_a3", "agt_a2", "agt_a1", "agt_a0"]);
    expect(a.every((e) => e.actor === "user_a")).toBe(true);
    // A cursor of ten_b's list taken to ten_a reads only ten_a's rows below that seq.
    const first = (await pages("limit=24")).at(0)!;
    const res = await call("GET", `/v1/audit?cursor=${first.nextCursor}`, await admin("ten_a"));
    expect(((await res.json()) as Page).entries.every((e) => e.actor === "user_a")).toBe(true);
  });

  it("filters by action, target and a half-open time range", async () => {
    const updates = (await pages("action=agent.update&limit=5")).flatMap((p) => p.entries);
    expect(updates).toHaveLength(12);
    expect(updates.every((e) => e.action === "agent.update")).toBe(true);
    const t = (await pages("target=agt_b1")).flatMap((p) => p.entries);
    expect(t.map((e) => e.seq)).toEqual([23, 20, 17, 14, 11, 8, 5, 2]);
    const range = (await pages("since=2026-01-01T00:05:00Z&until=2026-01-01T01:08:00%2B01:00")).flatMap((p) => p.entries);
    expect(range.map((e) => e.seq)).toEqual([8, 7, 6]);
  });

  it("refuses bad input with 400 and the envelope, and needs agents:admin", async () => {
    for (const q of [
      "since=0000-01-01T00:00:00Z",
      "until=2026-01-01",
      "cursor=nope",
      "limit=0",
      "limit=1001",
      "unknown=1",
      `action=${"x".repeat(201)}`,
      `cursor=${Buffer.from("[0]").toString("base64url")}`,
    ]) {
      const res = await call("GET", `/v1/audit?${q}`, await admin("ten_b"));
      expect(res.status, q).toBe(400);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe("bad_request");
    }
    expect((await app.request("/v1/audit")).status).toBe(401);
    expect((await call("GET", "/v1/audit", await token("ten_b", ["agents:invoke"]))).status).toBe(403);
  });
});

describe("verification: GET /v1/audit/verify (operator) and npm run audit:verify", () => {
  it("reports every chain verified, then names the row a superuser altered; the command exits 1 naming it", async () => {
    const ok = await call("GET", "/v1/audit/verify", await operator());
    expect(ok.status).toBe(200);
    const okBody = (await ok.json()) as { ok: boolean; chains: { chain: string; ok: boolean; rows: number }[] };
    expect(okBody.ok).toBe(true);
    expect(okBody.chains).toEqual(expect.arrayContaining([{ chain: "ten_b", ok: true, rows: 25 }]));
    expect((await call("GET", "/v1/audit/verify", await admin("ten_b"))).status).toBe(403);

    const logs: string[] = [];
    const log = console.log;
    console.log = (...args: unknown[]) => void logs.push(args.join(" "));
    try {
      expect(await auditVerifyMain(["--tenant", "ten_b"], { DATABASE_URL: database.url })).toBe(0);
      expect(logs).toContain("ok ten_b: 25 rows, head seq 25");

      const owner = postgres(database.url, { max: 1, onnotice: () => {} });
      const [row] = await owner`select id from audit_log where tenant_id = 'ten_b' and seq = 7`;
      await owner.begin(async (tx) => {
        await tx`set local session_replication_role = replica`;
        await tx`update audit_log set actor = 'someone_else' where id = ${row!.id}`;
      });
      await owner.end();

      const res = await call("GET", "/v1/audit/verify?tenant=ten_b", await operator());
      const body = (await res.json()) as { ok: boolean; chains: { broken?: { problem: string; seq: number; id: number } }[] };
      expect(body.ok).toBe(false);
      expect(body.chains[0]!.broken).toMatchObject({ problem: "hash_mismatch", seq: 7, id: Number(row!.id) });

      logs.length = 0;
      expect(await auditVerifyMain(["--all"], { DATABASE_URL: database.url })).toBe(1);
      expect(logs.find((l) => l.startsWith("BROKEN ten_b"))).toMatch(new RegExp(`^BROKEN ten_b: seq 7 \\(id ${row!.id}\\) hash_mismatch: `));
      const error = console.error;
      console.error = () => {};
      try {
        expect(await auditVerifyMain(["--tenant", "x", "--all"], {})).toBe(2);
      } finally {
        console.error = error;
      }
    } finally {
      console.log = log;
    }
  });
});

/** Mutating operations that write no audit row, and why. */
const exempt: Record<string, string> = {
  deliverWebhook:
    "webhook intake: unauthenticated senders, stored as deliveries; each attempt's outcome (webhook.delivery.delivered / dead_lettered) is audited by the delivery worker (test/integration/webhook-delivery.test.ts)",
  ingestMeterSegments: "meter ingest: hosts ship usage data (idempotent, signed with the component key), not an admin action",
  // Exec and files reach a VM's exec server, which this test's fleet has none of: their rows (agent.exec,
  // agent.files.write, agent.files.untar, agent.files.delete, agent.process.stdin, agent.process.signal) are driven in
  // test/unit/exec-routes.test.ts (a fake exec server) and test/e2e/exec-api-qemu.test.ts (a real VM).
  execInAgent: "audited as agent.exec: driven where there is an exec server (test/unit/exec-routes.test.ts, test/e2e/exec-api-qemu.test.ts)",
  writeAgentFile: "audited as agent.files.write or agent.files.untar: driven in test/unit/exec-routes.test.ts and test/e2e/exec-api-qemu.test.ts",
  deleteAgentFile: "audited as agent.files.delete: driven in test/unit/exec-routes.test.ts and test/e2e/exec-api-qemu.test.ts",
  writeAgentProcessStdin: "audited as agent.process.stdin: driven in test/unit/exec-routes.test.ts",
  signalAgentProcess: "audited as agent.process.signal: driven in test/unit/exec-routes.test.ts",
  waitAgentProcess: "a POST that changes nothing: it waits for a background process to end and reads it",
  desktopActions: "audited as agent.desktop.actions: driven where there is a desktop agent (test/e2e/desktop-qemu.test.ts)",
};

/** What each audited operation records as its action. */
const auditedAs: Record<string, string> = {
  createAgent: "agent.create",
  updateAgent: "agent.update",
  wakeAgent: "agent.wake",
  hibernateAgent: "agent.hibernate",
  addAgentLease: "agent.lease",
  dropAgentLease: "agent.lease.drop",
  deleteAgent: "agent.delete",
  createWebhookEndpoint: "webhook.endpoint.create",
  rotateWebhookSecret: "webhook.endpoint.rotate",
  deleteWebhookEndpoint: "webhook.endpoint.delete",
  redeliverWebhook: "webhook.delivery.redeliver",
  finalizeInvoice: "invoice.finalize",
  addTenantRateCardVersion: "rate_card.create",
  addDefaultRateCardVersion: "rate_card.create",
  createImage: "image.create",
  createCheckpoint: "checkpoint.create",
  restoreAgent: "agent.restore",
  resetAgent: "agent.reset",
  createPool: "pool.create",
  resizePool: "pool.resize",
  acquirePoolAgent: "pool.acquire",
  releasePoolAgent: "pool.release",
  deletePool: "pool.delete",
  deleteCheckpoint: "checkpoint.delete",
  deleteImage: "image.delete",
  createTenant: "tenant.create",
  suspendTenant: "tenant.suspend",
  resumeTenant: "tenant.resume",
  deleteTenant: "tenant.delete",
  drainHost: "host.drain",
  undrainHost: "host.undrain",
  createUpstream: "upstream.create",
  updateUpstream: "upstream.update",
  deleteUpstream: "upstream.delete",
};

function mutatingOperations(): string[] {
  const doc = JSON.parse(readFileSync(join(import.meta.dirname, "../../contracts/api/openapi.json"), "utf8")) as {
    paths: Record<string, Record<string, { operationId?: string }>>;
  };
  const ops: string[] = [];
  for (const methods of Object.values(doc.paths))
    for (const [method, op] of Object.entries(methods)) if (method !== "get" && op.operationId) ops.push(op.operationId);
  return ops.sort();
}

describe("audit coverage of the API", () => {
  it("every non-GET operation of the OpenAPI document is audited or exempt with a reason", () => {
    const unlisted = mutatingOperations().filter((op) => !(op in exempt) && !(op in auditedAs));
    expect(unlisted, "add each to auditedAs (and drive it below) or to exempt with a reason").toEqual([]);
  });

  it("each audited operation, called through the API, leaves a row with its actor, action, target and the call's request id", async () => {
    const seen = new Map<string, { requestId: string; actor: string; target?: string }>();
    const expectAudited = async (op: string, res: Response, actor: string, target?: string) => {
      expect(res.status, `${op}: ${await res.clone().text()}`).toBeLessThan(300);
      const requestId = res.headers.get("x-request-id");
      expect(requestId, op).toMatch(/^req_/);
      seen.set(op, { requestId: requestId!, actor, ...(target ? { target } : {}) });
    };
    await admin("ten_a");
    const op = await operator();

    await expectAudited("createTenant", await call("POST", "/v1/tenants", op, { id: "ten_cov", name: "coverage" }), "op_1", "ten_cov");
    const c = await token("ten_cov", ["agents:admin", "agents:invoke", "images:write"], "user_cov");
    const created = await call("POST", "/v1/agents", c, { name: "cov", image: "demo" });
    const agentId = ((await created.clone().json()) as { id: string }).id;
    await expectAudited("createAgent", created, "user_cov", agentId);
    await expectAudited("updateAgent", await call("PATCH", `/v1/agents/${agentId}`, c, { idleTimeoutMs: 5000 }), "user_cov", agentId);
    await expectAudited("wakeAgent", await call("POST", `/v1/agents/${agentId}/wake`, c), "user_cov", agentId);
    await expectAudited("hibernateAgent", await call("POST", `/v1/agents/${agentId}/hibernate`, c), "user_cov", agentId);
    await expectAudited("addAgentLease", await call("POST", `/v1/agents/${agentId}/leases`, c, { ttlMs: 60_000 }), "user_cov", agentId);
    await expectAudited("dropAgentLease", await call("DELETE", `/v1/agents/${agentId}/leases/lse_cov`, c), "user_cov", agentId);

    const endpoint = await call("POST", `/v1/agents/${agentId}/webhooks`, c, { name: "gh", scheme: "github" });
    const ep = (await endpoint.clone().json()) as { id: string; secret: string };
    await expectAudited("createWebhookEndpoint", endpoint, "user_cov", ep.id);
    const hookBody = new TextEncoder().encode(JSON.stringify({ zen: "audit" }));
    const hook = await app.request(`/hooks/${agentId}/gh`, {
      method: "POST",
      body: hookBody,
      headers: {
        "content-type": "application/json",
        "x-github-delivery": "d-1",
        "x-github-event": "ping",
        "x-hub-signature-256": await signGithub(ep.secret, hookBody),
      },
    });
    expect(hook.status, await hook.clone().text()).toBe(202);
    const deliveryId = ((await hook.json()) as { deliveryId?: string; id?: string }).deliveryId;
    expect(deliveryId).toMatch(/^dlv_/);
    await expectAudited("redeliverWebhook", await call("POST", `/v1/webhook-deliveries/${deliveryId}/redeliver`, c), "user_cov", deliveryId);
    await expectAudited("rotateWebhookSecret", await call("POST", `/v1/agents/${agentId}/webhooks/gh/rotate`, c, {}), "user_cov", ep.id);
    await expectAudited("deleteWebhookEndpoint", await call("DELETE", `/v1/agents/${agentId}/webhooks/gh`, c), "user_cov", ep.id);

    const checkpoint = await call("POST", `/v1/agents/${agentId}/checkpoints`, c, { name: "cov" });
    const checkpointId = ((await checkpoint.clone().json()) as { id: string }).id;
    await expectAudited("createCheckpoint", checkpoint, "user_cov", agentId);
    await expectAudited("restoreAgent", await call("POST", `/v1/agents/${agentId}/restore`, c, { checkpoint: "cov" }), "user_cov", agentId);
    const pool = await call("POST", "/v1/pools", c, { fromCheckpoint: checkpointId, size: 0, maxSize: 1 });
    const poolId = ((await pool.clone().json()) as { id: string }).id;
    await expectAudited("createPool", pool, "user_cov", poolId);
    await expectAudited("resizePool", await call("PATCH", `/v1/pools/${poolId}`, c, { maxSize: 2 }), "user_cov", poolId);
    const acquired = await call("POST", `/v1/pools/${poolId}/acquire`, c);
    const pooled = ((await acquired.clone().json()) as { agent: { id: string } }).agent.id;
    await expectAudited("acquirePoolAgent", acquired, "user_cov", poolId);
    await expectAudited("resetAgent", await call("POST", `/v1/agents/${pooled}/reset`, c), "user_cov", pooled);
    await expectAudited("releasePoolAgent", await call("POST", `/v1/pools/${poolId}/release`, c, { agentId: pooled }), "user_cov", poolId);
    await expectAudited("deletePool", await call("DELETE", `/v1/pools/${poolId}`, c), "user_cov", poolId);
    await expectAudited("deleteCheckpoint", await call("DELETE", `/v1/agents/${agentId}/checkpoints/${checkpointId}`, c), "user_cov", agentId);

    const image = await app.request("/v1/images?name=cov&tag=v1", {
      method: "POST",
      body: "context",
      headers: { authorization: `Bearer ${c}`, "content-type": "application/x-tar" },
    });
    const imageId = ((await image.clone().json()) as { image: { id: string } }).image.id;
    await expectAudited("createImage", image, "user_cov", imageId);
    await expectAudited("deleteImage", await call("DELETE", `/v1/images/${imageId}`, c), "user_cov", imageId);
    await expectAudited("finalizeInvoice", await call("POST", "/v1/invoices/2026-01/finalize", c), "user_cov");
    await expectAudited("deleteAgent", await call("DELETE", `/v1/agents/${agentId}`, c), "user_cov", agentId);
    const upstream = await call("POST", "/v1/upstreams", c, { name: "cov", baseUrl: "https://example.com/v1", headers: { Authorization: "Bearer x" } });
    const upstreamId = ((await upstream.clone().json()) as { id: string }).id;
    await expectAudited("createUpstream", upstream, "user_cov", upstreamId);
    await expectAudited("updateUpstream", await call("PATCH", "/v1/upstreams/cov", c, { headers: { Authorization: "Bearer y" } }), "user_cov", upstreamId);
    await expectAudited("deleteUpstream", await call("DELETE", "/v1/upstreams/cov", c), "user_cov", upstreamId);

    const rates = { vcpuSecondNanocents: 1000, gibSecondNanocents: 100, snapshotGibMonthNanocents: 10 };
    await expectAudited("addTenantRateCardVersion", await call("POST", "/v1/tenants/ten_cov/rate-cards", op, rates), "op_1");
    await expectAudited("addDefaultRateCardVersion", await call("POST", "/v1/rate-cards/default", op, rates), "op_1");
    await expectAudited("suspendTenant", await call("POST", "/v1/tenants/ten_cov/suspend", op, { reason: "coverage" }), "op_1", "ten_cov");
    await expectAudited("resumeTenant", await call("POST", "/v1/tenants/ten_cov/resume", op, {}), "op_1", "ten_cov");
    await expectAudited("deleteTenant", await call("DELETE", "/v1/tenants/ten_cov", op), "op_1", "ten_cov");
    await database.db.execute(sql`insert into hosts (id, driver, capacity_mib) values ('host_cov', 'process', 1024)`);
    await expectAudited("drainHost", await call("POST", "/v1/hosts/host_cov/drain", op), "op_1", "host_cov");
    await expectAudited("undrainHost", await call("POST", "/v1/hosts/host_cov/undrain", op), "op_1", "host_cov");

    expect([...seen.keys()].sort()).toEqual(Object.keys(auditedAs).sort());
    for (const [operation, want] of seen) {
      const rows = await database.db.select().from(auditLog).where(eq(auditLog.requestId, want.requestId));
      const row = rows.find((r) => r.action === auditedAs[operation]);
      expect(
        row,
        `${operation}: no ${auditedAs[operation]} row with request id ${want.requestId} (found ${rows.map((r) => r.action).join(", ") || "none"})`,
      ).toBeDefined();
      expect(row!.actor, operation).toBe(want.actor);
      if (want.target) expect(row!.target, operation).toBe(want.target);
      expect(row!.seq, operation).toBeGreaterThan(0);
    }
    const broken = (await queryRows<{ n: string }>(database.db, sql`select count(*)::text as n from audit_log where hash is null`))[0]!.n;
    expect(broken).toBe("0");
  });
});

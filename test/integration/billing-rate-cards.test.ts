// Rate-card versions on real Postgres through the gateway app with real tokens: set by operators only, applied from their instant, frozen in final invoices.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { serve, type ServerType } from "@hono/node-server";
import { exportJWK, generateKeyPair, type JWK } from "jose";
import { and, eq } from "drizzle-orm";
import { ingestSegments } from "../../billing/ingest.ts";
import { createBillingRoutes } from "../../billing/routes.ts";
import { finalizeInvoice } from "../../billing/invoices.ts";
import { addRateCardVersion, rateCardTimeline } from "../../billing/rates.ts";
import type { Scope } from "../../contracts/caller.ts";
import { fromPrivateJwk, mintToken } from "../../compose/dev-keys.ts";
import { createAgentRepo } from "../../gateway/agents/repo.ts";
import { createGateway } from "../../gateway/app.ts";
import { createJwtAuthenticator } from "../../gateway/auth.ts";
import { ManualClock } from "../../lib/clock.ts";
import { componentKey } from "../../lib/host-token.ts";
import { silentLogger } from "../../lib/log.ts";
import { createDbAuditLog } from "../../schema/audit-log.ts";
import { invoiceLines } from "../../schema/billing.ts";
import { auditLog } from "../../schema/core.ts";
import { openDatabase, type Database } from "../../schema/db.ts";
import { freePort } from "../../scripts/postgres-server.ts";
import { freshDatabase } from "../helpers/db.ts";
import { fakeFleet } from "../helpers/fake-fleet.ts";
import { runSegments, seedTenant } from "./billing-fixtures.ts";
import { runAgentvm } from "../helpers/cli.ts";

const hour = 3_600_000;
const nov15 = Date.UTC(2026, 10, 15);
const newCard = { vcpuSecondNanocents: 2_000_000, gibSecondNanocents: 300_000, snapshotGibMonthNanocents: 0 };

interface Version {
  id: string;
  tenantId: string | null;
  currency: string;
  vcpuSecondNanocents: number;
  gibSecondNanocents: number;
  effectiveFrom: string;
  createdBy: string | null;
  until?: string | null;
}
interface InvoiceJson {
  id: string;
  status: string;
  totalCents: number;
  rates: { vcpuSecondNanocents: number };
  rateCards: { id: string; from: string; to: string; effectiveFrom: string; vcpuSecondNanocents: number }[];
  lines: { agentId: string; resource: string; quantity: string; unitPriceNanocents: number; amountCents: number; rateCardId: string | null }[];
}

describe("rate-card versions", () => {
  let database: Database;
  let privateJwk: JWK;
  let app: ReturnType<typeof createGateway>;
  const clock = new ManualClock(Date.UTC(2026, 10, 10, 9, 7, 30));

  beforeAll(async () => {
    database = await freshDatabase();
    const db = database.db;
    const { privateKey } = await generateKeyPair("ES256", { extractable: true });
    privateJwk = { ...(await exportJWK(privateKey)), kid: "k1" };
    await seedTenant(db, "ten_r", "UTC", ["agt_r1"]);
    await seedTenant(db, "ten_s", "Europe/Berlin", []);
    await seedTenant(db, "ten_t", "UTC", []);
    app = createGateway({
      agents: createAgentRepo(db),
      fleet: fakeFleet({}),
      audit: createDbAuditLog(db),
      auth: createJwtAuthenticator({ keys: { jwks: fromPrivateJwk(privateJwk).jwks }, issuer: "agentvm-dev", audience: "agentvm", algorithms: ["ES256"] }),
      log: silentLogger,
      config: {
        domain: undefined,
        maxBodyBytes: 1000,
        maxApiBodyBytes: 10_000,
        images: ["demo"],
        agentDefaults: { vcpus: 1, memMiB: 256, idleTimeoutMs: 1000, streamIdleMs: 1000 },
      },
      routes: [createBillingRoutes({ db, clock, log: silentLogger, componentKey: componentKey("a-component-secret-of-at-least-32-chars!") })],
    });
  });
  afterAll(async () => {
    await database?.close();
  });

  const operator = { tenant: "ten_ops", scopes: ["operator"] as Scope[], subject: "usr_operator" };
  const tenantR = { tenant: "ten_r", scopes: ["usage:read", "agents:admin", "agents:invoke"] as Scope[], subject: "usr_r" };
  type Who = typeof operator | undefined;
  // biome-ignore lint/suspicious/noExplicitAny: the test reads any field of any answer
  async function call(who: Who, method: string, path: string, body?: unknown): Promise<{ status: number; body: any }> {
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (who) headers.authorization = `Bearer ${await mintToken(privateJwk, who)}`;
    const res = await app.request(path, { method, headers, ...(body === undefined ? {} : { body: JSON.stringify(body) }) });
    return { status: res.status, body: await res.json() };
  }

  it("lets only operators write versions, checks each field, and audits each version", async () => {
    const body = { ...newCard, effectiveFrom: "2026-11-15T00:00:00Z" };
    expect((await call(undefined, "POST", "/v1/tenants/ten_r/rate-cards", body)).status).toBe(401);
    const asTenant = await call(tenantR, "POST", "/v1/tenants/ten_r/rate-cards", body);
    expect(asTenant.status).toBe(403);
    expect(asTenant.body.error.message).toMatch(/operator/);
    expect((await call(tenantR, "POST", "/v1/rate-cards/default", body)).status).toBe(403);
    expect((await call(tenantR, "GET", "/v1/tenants/ten_r/rate-cards")).status).toBe(403);

    const created = await call(operator, "POST", "/v1/tenants/ten_r/rate-cards", body);
    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({
      tenantId: "ten_r",
      currency: "USD",
      ...newCard,
      effectiveFrom: "2026-11-15T00:00:00.000Z",
      createdBy: "usr_operator",
    });
    expect(created.body.id).toMatch(/^rc_/);

    const again = await call(operator, "POST", "/v1/tenants/ten_r/rate-cards", { ...body, vcpuSecondNanocents: 5 });
    expect(again.status).toBe(409);
    expect(again.body.error.code).toBe("conflict");
    const unaligned = await call(operator, "POST", "/v1/tenants/ten_r/rate-cards", { ...body, effectiveFrom: "2026-11-15T00:07:00Z" });
    expect(unaligned.status).toBe(400);
    expect(unaligned.body.error.message).toMatch(/quarter-hour boundary.*2026-11-15T00:15:00.000Z/);
    expect((await call(operator, "POST", "/v1/tenants/ten_r/rate-cards", { ...body, effectiveFrom: "2026-11-15T00:15:00.001Z" })).status).toBe(400);
    expect((await call(operator, "POST", "/v1/tenants/ten_r/rate-cards", { ...body, effectiveFrom: "2026-11-15" })).status).toBe(400);
    expect((await call(operator, "POST", "/v1/tenants/ten_r/rate-cards", { ...body, vcpuSecondNanocents: -1 })).status).toBe(400);
    expect((await call(operator, "POST", "/v1/tenants/ten_r/rate-cards", { ...body, gibSecondNanocents: 1.5 })).status).toBe(400);
    expect((await call(operator, "POST", "/v1/tenants/ten_r/rate-cards", { ...body, currency: "usd" })).status).toBe(400);
    expect((await call(operator, "POST", "/v1/tenants/ten_r/rate-cards", { ...body, extra: 1 })).status).toBe(400);
    const missing = await call(operator, "POST", "/v1/tenants/ten_nobody/rate-cards", body);
    expect(missing.status).toBe(404);
    expect(missing.body.error.code).toBe("not_found");
    expect((await call(operator, "GET", "/v1/tenants/ten_nobody/rate-cards")).status).toBe(404);

    // without effectiveFrom: the next quarter hour at or after billing's now (09:07:30 → 09:15)
    const soon = await call(operator, "POST", "/v1/tenants/ten_t/rate-cards", newCard);
    expect(soon.status).toBe(201);
    expect(soon.body.effectiveFrom).toBe("2026-11-10T09:15:00.000Z");

    const audited = await database.db
      .select()
      .from(auditLog)
      .where(and(eq(auditLog.action, "rate_card.create"), eq(auditLog.target, created.body.id)));
    expect(audited).toHaveLength(1);
    expect(audited[0]).toMatchObject({ tenantId: "ten_r", actor: "usr_operator", target: created.body.id });
    expect(audited[0]!.requestId).toMatch(/^req_/);
    expect(audited[0]!.detail).toMatchObject({ effectiveFrom: "2026-11-15T00:00:00.000Z", vcpuSecondNanocents: 2_000_000 });
    // the refused ones left no version and no audit row
    expect(await database.db.select().from(auditLog).where(eq(auditLog.action, "rate_card.create"))).toHaveLength(2);
  });

  it("reads versions: operators a card's own (paged, newest first), a tenant every version that prices it", async () => {
    await call(operator, "POST", "/v1/tenants/ten_r/rate-cards", { ...newCard, vcpuSecondNanocents: 3_000_000, effectiveFrom: "2027-01-01T00:00:00Z" });
    const first = await call(operator, "GET", "/v1/tenants/ten_r/rate-cards?limit=1");
    expect(first.status).toBe(200);
    expect(first.body.versions.map((v: Version) => v.effectiveFrom)).toEqual(["2027-01-01T00:00:00.000Z"]);
    expect(first.body.current.id).toBe("rc_default"); // billing's now is Nov 10: the tenant's first version is still ahead
    const second = await call(operator, "GET", `/v1/tenants/ten_r/rate-cards?limit=1&cursor=${first.body.nextCursor}`);
    expect(second.body.versions.map((v: Version) => v.effectiveFrom)).toEqual(["2026-11-15T00:00:00.000Z"]);
    expect(second.body.nextCursor).toBeNull();
    expect((await call(operator, "GET", "/v1/tenants/ten_r/rate-cards?cursor=bogus")).status).toBe(400);

    const mine = await call(tenantR, "GET", "/v1/rate-cards");
    expect(mine.status).toBe(200);
    expect(mine.body.current).toMatchObject({ id: "rc_default", tenantId: null });
    expect(mine.body.versions.map((v: Version) => [v.tenantId, v.effectiveFrom, v.until])).toEqual([
      ["ten_r", "2027-01-01T00:00:00.000Z", null],
      ["ten_r", "2026-11-15T00:00:00.000Z", "2027-01-01T00:00:00.000Z"],
      [null, "1970-01-01T00:00:00.000Z", "2026-11-15T00:00:00.000Z"],
    ]);
    const paged = await call(tenantR, "GET", "/v1/rate-cards?limit=2");
    expect(paged.body.versions).toHaveLength(2);
    const rest = await call(tenantR, "GET", `/v1/rate-cards?limit=2&cursor=${paged.body.nextCursor}`);
    expect(rest.body.versions.map((v: Version) => v.id)).toEqual(["rc_default"]);
    // the old single-card route answers the card in effect now
    expect((await call(tenantR, "GET", "/v1/rate-card")).body.id).toBe("rc_default");

    const defaults = await call(operator, "GET", "/v1/rate-cards/default");
    expect(defaults.status).toBe(200);
    expect(defaults.body).toMatchObject({ tenantId: null, current: { id: "rc_default" } });
    expect(defaults.body.versions.map((v: Version) => v.id)).toEqual(["rc_default"]);
  });

  it("prices usage before a version's instant with the old card and after it with the new one, in the draft and once final", async () => {
    const ingest = async (segs: ReturnType<typeof runSegments>) => expect((await ingestSegments(database.db, segs, clock)).rejected).toEqual([]);
    const run = (runId: string, start: number, firstSeq: number) =>
      runSegments({ hostId: "host_r", vmId: "vm_r", tenantId: "ten_r", agentId: "agt_r1", runId, start, durationMs: hour, vcpus: 2, memMiB: 1024, firstSeq });
    clock.advance(Date.UTC(2026, 10, 20) - clock.now());
    await ingest(run("run_a", Date.UTC(2026, 10, 14, 10), 0)); // before
    await ingest(run("run_b", nov15 - hour / 2, 1000)); // half before, half after
    await ingest(run("run_c", Date.UTC(2026, 10, 16, 10), 2000)); // after
    const timeline = await rateCardTimeline(database.db, "ten_r", Date.UTC(2026, 10, 1), Date.UTC(2026, 11, 1));
    expect(timeline.map((p) => [p.card.id, p.from, p.to])).toEqual([
      ["rc_default", Date.UTC(2026, 10, 1), nov15],
      [timeline[1]!.card.id, nov15, Date.UTC(2026, 11, 1)],
    ]);
    const newId = timeline[1]!.card.id;

    // 5400 s × 2 vCPU on each side; default card: 10 800 vCPU-s × 0.001 ¢ = 10.8 → 11 ¢, 5400 GiB-s × 0.0001 ¢ = 0.54 → 1 ¢;
    // new card: 10 800 × 0.002 ¢ = 21.6 → 22 ¢, 5400 × 0.0003 ¢ = 1.62 → 2 ¢ (one card for the whole month would give 33 + 2)
    const expected = [
      ["agt_r1", "vcpu", String(2 * 5400_000), 1_000_000, 11, "rc_default"],
      ["agt_r1", "memory", String(1024 * 5400_000), 100_000, 1, "rc_default"],
      ["agt_r1", "vcpu", String(2 * 5400_000), 2_000_000, 22, newId],
      ["agt_r1", "memory", String(1024 * 5400_000), 300_000, 2, newId],
    ];
    const asLines = (inv: InvoiceJson) => inv.lines.map((l) => [l.agentId, l.resource, l.quantity, l.unitPriceNanocents, l.amountCents, l.rateCardId]);
    const draft = (await call(tenantR, "GET", "/v1/invoices?month=2026-11")).body as InvoiceJson;
    expect(draft.status).toBe("draft");
    expect(asLines(draft)).toEqual(expected);
    expect(draft.totalCents).toBe(36);
    expect(draft.rates.vcpuSecondNanocents).toBe(1_000_000); // the card at the period's start
    expect(draft.rateCards.map((c) => [c.id, c.from, c.to])).toEqual([
      ["rc_default", "2026-11-01T00:00:00+00:00", "2026-11-15T00:00:00+00:00"],
      [newId, "2026-11-15T00:00:00+00:00", "2026-12-01T00:00:00+00:00"],
    ]);

    clock.advance(Date.UTC(2026, 11, 3) + 1 - clock.now()); // past the 48 h grace
    const final = await call(tenantR, "POST", "/v1/invoices/2026-11/finalize");
    expect(final.status).toBe(200);
    expect(final.body.status).toBe("final");
    expect(asLines(final.body)).toEqual(expected);
    expect(final.body.totalCents).toBe(36);
    expect(final.body.rateCards).toEqual(draft.rateCards);
    const stored = await database.db.select().from(invoiceLines).where(eq(invoiceLines.invoiceId, final.body.id)).orderBy(invoiceLines.lineNo);
    expect(stored.map((l) => [l.rateCardId, l.amountCents])).toEqual(expected.map((e) => [e[5], e[4]]));

    // final invoices never change: versions inside or before the month are refused, the default card's too
    const inside = await call(operator, "POST", "/v1/tenants/ten_r/rate-cards", { ...newCard, effectiveFrom: "2026-11-20T00:00:00Z" });
    expect(inside.status).toBe(409);
    expect(inside.body.error.message).toMatch(/2026-11 is final/);
    expect((await call(operator, "POST", "/v1/tenants/ten_r/rate-cards", { ...newCard, effectiveFrom: "2026-10-01T00:00:00Z" })).status).toBe(409);
    expect((await call(operator, "POST", "/v1/rate-cards/default", { ...newCard, effectiveFrom: "2026-11-03T00:00:00Z" })).status).toBe(409);
    expect(
      (await call(operator, "POST", "/v1/tenants/ten_r/rate-cards", { ...newCard, vcpuSecondNanocents: 7_000_000, effectiveFrom: "2026-12-01T00:00:00Z" }))
        .status,
    ).toBe(201);
    // a default version after the tenant's own first version does not touch its final invoice
    expect((await call(operator, "POST", "/v1/rate-cards/default", { ...newCard, effectiveFrom: "2026-11-20T00:00:00Z" })).status).toBe(201);
    const reread = await call(tenantR, "GET", `/v1/invoices/${final.body.id}`);
    expect(reread.body).toEqual(final.body);
    const csv = await (
      await app.request(`/v1/invoices/${final.body.id}?format=csv`, { headers: { authorization: `Bearer ${await mintToken(privateJwk, tenantR)}` } })
    ).text();
    expect(csv).toContain(`${final.body.id},2026-11,final,agt_r1,vcpu,10800000,vCPU-ms,2000000,vCPU-second,22,${newId}`);

    // December's draft: the 7_000_000 version from its first instant
    const dec = (await call(tenantR, "GET", "/v1/invoices?month=2026-12")).body as InvoiceJson;
    expect(dec.rateCards.map((c) => c.vcpuSecondNanocents)).toEqual([7_000_000]);
  });

  it("keeps one currency per invoice: a change of currency only at a month's start in the tenant's zone", async () => {
    const eur = { ...newCard, currency: "EUR" };
    // Berlin's December starts at 2026-11-30T23:00Z, not at midnight UTC
    const utcMidnight = await call(operator, "POST", "/v1/tenants/ten_s/rate-cards", { ...eur, effectiveFrom: "2026-12-01T00:00:00Z" });
    expect(utcMidnight.status).toBe(409);
    expect(utcMidnight.body.error.message).toMatch(/USD → EUR.*Europe\/Berlin/);
    expect((await call(operator, "POST", "/v1/tenants/ten_s/rate-cards", { ...eur, effectiveFrom: "2026-12-31T23:00:00Z" })).status).toBe(201);
    // a USD version before the EUR one: the change to EUR it is followed by is still at a month's start
    expect((await call(operator, "POST", "/v1/tenants/ten_s/rate-cards", { ...newCard, effectiveFrom: "2026-12-10T00:00:00Z" })).status).toBe(201);
    expect((await call(operator, "POST", "/v1/tenants/ten_s/rate-cards", { ...newCard, effectiveFrom: "2027-01-10T00:00:00Z" })).status).toBe(409);
    expect((await call(operator, "POST", "/v1/tenants/ten_s/rate-cards", { ...eur, effectiveFrom: "2027-01-10T00:00:00Z" })).status).toBe(201);
    expect((await call(operator, "POST", "/v1/rate-cards/default", { ...eur, effectiveFrom: "2027-02-01T00:00:00Z" })).status).toBe(409);
    const jan = monthPieces(await rateCardTimeline(database.db, "ten_s", Date.UTC(2026, 11, 31, 23), Date.UTC(2027, 0, 31, 23)));
    expect(jan).toEqual(["EUR", "EUR"]);
  });

  it("never freezes an invoice with cards a concurrent version changed: the version is refused or the invoice uses it", async () => {
    for (let i = 0; i < 6; i++) {
      const tenantId = `ten_race${i}`;
      await seedTenant(database.db, tenantId, "UTC", [`agt_race${i}`]);
      await ingestSegments(
        database.db,
        runSegments({
          hostId: "host_x",
          vmId: `vm_race${i}`,
          tenantId,
          agentId: `agt_race${i}`,
          runId: `run_race${i}`,
          start: Date.UTC(2026, 9, 20),
          durationMs: hour,
        }),
        clock,
      );
      const [version, final] = await Promise.allSettled([
        addRateCardVersion(database.db, tenantId, { currency: "USD", ...newCard }, Date.UTC(2026, 9, 10), "usr_race"),
        finalizeInvoice(database.db, clock, tenantId, "2026-10"),
      ]);
      if (final.status !== "fulfilled") throw final.reason;
      const timeline = await rateCardTimeline(database.db, tenantId, Date.UTC(2026, 9, 1), Date.UTC(2026, 10, 1));
      expect(final.value.rateCards.map((c) => [c.id, c.from, c.to])).toEqual(timeline.map((p) => [p.card.id, p.from, p.to]));
      if (version.status === "rejected") expect(version.reason).toMatchObject({ code: "conflict" });
    }
  });

  it("works the same on embedded PGlite (the all-in-one npm start): versions, the lock, finalize", async () => {
    const lite = await openDatabase({ pgliteMemory: true });
    try {
      await seedTenant(lite.db, "ten_l", "UTC", ["agt_l"]);
      const liteClock = new ManualClock(Date.UTC(2026, 9, 20));
      await ingestSegments(
        lite.db,
        runSegments({
          tenantId: "ten_l",
          agentId: "agt_l",
          vmId: "vm_l",
          runId: "run_l",
          start: Date.UTC(2026, 9, 9, 23, 30),
          durationMs: hour,
          vcpus: 1,
          memMiB: 1024,
        }),
        liteClock,
      );
      const v = await addRateCardVersion(lite.db, "ten_l", { currency: "USD", ...newCard }, Date.UTC(2026, 9, 10), "usr_lite");
      liteClock.advance(Date.UTC(2026, 10, 4) - liteClock.now());
      const inv = await finalizeInvoice(lite.db, liteClock, "ten_l", "2026-10");
      // 1800 s before (0.001 ¢ → 1.8 → 2 ¢; 0.0001 ¢ × 1800 GiB-s → 0.18 → 0 ¢), 1800 s after (0.002 ¢ → 3.6 → 4 ¢; 0.0003 ¢ → 0.54 → 1 ¢)
      expect(inv.lines.map((l) => [l.resource, l.amountCents, l.rateCardId])).toEqual([
        ["vcpu", 2, "rc_default"],
        ["memory", 0, "rc_default"],
        ["vcpu", 4, v.id],
        ["memory", 1, v.id],
      ]);
      await expect(addRateCardVersion(lite.db, "ten_l", { currency: "USD", ...newCard }, Date.UTC(2026, 9, 20), "usr_lite")).rejects.toMatchObject({
        code: "conflict",
      });
    } finally {
      await lite.close();
    }
  }, 120_000); // PGlite's migrations alone take seconds (tens under load)

  describe("agentvm rates and invoices show", () => {
    let server: ServerType;
    let home: string;
    let url: string;
    beforeAll(async () => {
      const port = await freePort();
      server = serve({ fetch: app.fetch, port, hostname: "127.0.0.1" });
      url = `http://127.0.0.1:${port}`;
      home = mkdtempSync(join(tmpdir(), "rates-cli-"));
    });
    afterAll(() => {
      server?.close();
      rmSync(home, { recursive: true, force: true });
    });
    const agentvm = async (who: typeof operator, args: string[]) => runAgentvm(args, { url, token: await mintToken(privateJwk, who), home });

    it("sets a version as an operator, refuses a tenant token, and shows versions and the card of each invoice line", async () => {
      const set = await agentvm(operator, [
        "rates",
        "set",
        "--tenant",
        "ten_t",
        "--vcpu-second",
        "4000000",
        "--gib-second",
        "0",
        "--snapshot-gib-month",
        "0",
        "--doze-gib-second",
        "7",
        "--from",
        "2027-03-01T00:00:00Z",
      ]);
      expect(set.err).toBe("");
      expect(set.code).toBe(0);
      expect(set.out).toMatch(
        /^rc_\w+: tenant ten_t from 2027-03-01T00:00:00.000Z: 4000000 n¢\/vCPU-s, 0 n¢\/GiB-s, 0 n¢\/GiB-month USD; dozing 0 n¢\/vCPU-s, 7 n¢\/GiB-s$/m,
      );
      const refused = await agentvm(tenantR, ["rates", "set", "--tenant", "ten_r", "--vcpu-second", "1", "--gib-second", "1", "--snapshot-gib-month", "1"]);
      expect(refused.code).not.toBe(0);
      expect(refused.err).toMatch(/operator/);
      const unaligned = await agentvm(operator, [
        "rates",
        "set",
        "--default",
        "--vcpu-second",
        "1",
        "--gib-second",
        "1",
        "--snapshot-gib-month",
        "1",
        "--from",
        "2027-03-01T00:10:00Z",
      ]);
      expect(unaligned.code).not.toBe(0);
      expect(unaligned.err).toMatch(/quarter-hour/);

      const shown = await agentvm(tenantR, ["rates", "show"]);
      expect(shown.code).toBe(0);
      expect(shown.out).toMatch(/^now: rc_\w+ from 2026-12-01T00:00:00.000Z: 7000000 n¢\/vCPU-s.*; dozing 0 n¢\/vCPU-s, memory at the snapshot rate$/m);
      expect(shown.out).toMatch(/doze vCPU-s n¢ +doze GiB-s n¢/);
      expect(shown.out).toContain("rc_default (default)");
      const ops = await agentvm(operator, ["--json", "rates", "show", "--tenant", "ten_t"]);
      expect((JSON.parse(ops.out) as { versions: Version[] }).versions.map((v) => v.effectiveFrom)).toEqual([
        "2027-03-01T00:00:00.000Z",
        "2026-11-10T09:15:00.000Z",
      ]);

      const inv = await agentvm(tenantR, ["invoices", "show", "2026-11"]);
      expect(inv.code).toBe(0);
      const cards = await database.db.select({ id: invoiceLines.rateCardId }).from(invoiceLines);
      const newId = cards.map((c) => c.id).find((id) => id !== "rc_default")!;
      expect(inv.out).toMatch(/agt_r1 +vcpu +10800000 vCPU-ms +1000000 n¢\/vCPU-second +11 ¢ +rc_default/);
      expect(inv.out).toMatch(new RegExp(`agt_r1 +vcpu +10800000 vCPU-ms +2000000 n¢/vCPU-second +22 ¢ +${newId}`));
      expect(inv.out).toContain(`card ${newId} priced 2026-11-15T00:00:00+00:00 to 2026-12-01T00:00:00+00:00`);
      expect(inv.out).toContain("total 0.36 USD");
    });
  });
});

const monthPieces = (pieces: { card: { currency: string } }[]) => pieces.map((p) => p.card.currency);

// Invoices on real Postgres: reproducible cutoffs, late segments, grace period, finalize once, storage lines, rate cards, isolation.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ingestSegments } from "../../billing/ingest.ts";
import { agentUsageBefore, finalizeInvoice, invoiceForMonth } from "../../billing/invoices.ts";
import { addRateCardVersion } from "../../billing/rates.ts";
import { createBillingRoutes } from "../../billing/routes.ts";
import { rawUsage } from "../../billing/usage.ts";
import { monthRange } from "../../billing/zones.ts";
import { ManualClock } from "../../lib/clock.ts";
import { componentKey } from "../../lib/host-token.ts";
import { silentLogger } from "../../lib/log.ts";
import { vmEvents } from "../../schema/core.ts";
import type { Database } from "../../schema/db.ts";
import { freshDatabase } from "../helpers/db.ts";
import { appWithCaller, runSegments, seedTenant } from "./billing-fixtures.ts";

const hour = 3_600_000;
const zone = "Europe/Berlin";
const oct = monthRange(zone, "2026-10"); // 2026-09-30T22:00Z … 2026-10-31T23:00Z (DST ends Oct 25)

describe("invoices", () => {
  let database: Database;
  const clock = new ManualClock(Date.UTC(2026, 9, 1));
  beforeAll(async () => {
    database = await freshDatabase();
    await seedTenant(database.db, "ten_i", zone, ["agt_i1", "agt_i2"]);
    await seedTenant(database.db, "ten_j", "UTC", ["agt_j1"]);
  });
  afterAll(async () => {
    await database.close();
  });

  const ingestAt = async (at: number, segs: Parameters<typeof ingestSegments>[1]) => {
    clock.advance(Math.max(0, at - clock.now()));
    const r = await ingestSegments(database.db, segs, clock);
    expect(r.rejected).toEqual([]);
  };

  it("counts what was received before the cutoff, and rollups minus late arrivals equal the raw scan", async () => {
    // a run across the start of the month (only its October part counts), one across the DST change
    await ingestAt(
      oct.start + hour,
      runSegments({
        hostId: "host_1",
        vmId: "vm_1",
        tenantId: "ten_i",
        agentId: "agt_i1",
        runId: "run_1",
        start: oct.start - 1800_000,
        durationMs: hour,
        vcpus: 2,
        memMiB: 1024,
      }),
    );
    await ingestAt(
      Date.UTC(2026, 9, 25, 3),
      runSegments({
        hostId: "host_1",
        vmId: "vm_1",
        tenantId: "ten_i",
        agentId: "agt_i1",
        runId: "run_2",
        start: Date.UTC(2026, 9, 24, 23, 30),
        durationMs: 2 * hour,
        vcpus: 2,
        memMiB: 1024,
        firstSeq: 1000,
      }),
    );
    const beforeLate = clock.now();
    // a host that was cut off delivers late: 36 h after the month ended (inside the grace), then 3 days after (outside)
    const late1 = runSegments({
      hostId: "host_2",
      vmId: "vm_2",
      tenantId: "ten_i",
      agentId: "agt_i2",
      runId: "run_3",
      start: oct.end - 2 * hour,
      durationMs: hour,
      vcpus: 1,
      memMiB: 512,
    });
    const late2 = runSegments({
      hostId: "host_2",
      vmId: "vm_2",
      tenantId: "ten_i",
      agentId: "agt_i2",
      runId: "run_4",
      start: oct.end - 4 * hour,
      durationMs: 1800_000,
      vcpus: 1,
      memMiB: 512,
      firstSeq: 500,
    });
    await ingestAt(oct.end + 36 * hour, late1);
    await ingestAt(oct.end + 72 * hour, late2);

    for (const cutoff of [beforeLate, oct.end + 40 * hour, oct.end + 48 * hour, clock.now() + 1]) {
      const viaRollups = await agentUsageBefore(database.db, "ten_i", oct.start, oct.end, cutoff);
      const viaRaw = await rawUsage(database.db, { tenantId: "ten_i", byAgent: true }, [oct.start, oct.end], { before: cutoff });
      const rawMap = new Map(viaRaw.map(({ window: _, agentId, ...sums }) => [agentId, sums]));
      for (const [agent, sums] of viaRollups) if (sums.activeMs > 0 || rawMap.has(agent)) expect(sums).toEqual(rawMap.get(agent));
    }
    const atGraceEnd = await agentUsageBefore(database.db, "ten_i", oct.start, oct.end, oct.end + 48 * hour);
    expect(atGraceEnd.get("agt_i1")?.activeMs).toBe(1800_000 + 2 * hour);
    expect(atGraceEnd.get("agt_i2")?.activeMs).toBe(hour); // late2 arrived after the grace period
  });

  it("keeps the invoice a draft during the grace period, then freezes it once with the prices of that moment", async () => {
    clock.advance(Math.max(0, oct.end + 24 * hour - clock.now()));
    // (the clock is already past; drafts use min(now, grace end) as their cutoff)
    const draft = await invoiceForMonth(database.db, clock, "ten_i", "2026-10");
    expect(draft.status).toBe("draft");
    expect(draft.cutoffAt).toBe(Math.min(clock.now() + 1, oct.end + 48 * hour));
    await addRateCardVersion(
      database.db,
      "ten_i",
      { currency: "USD", vcpuSecondNanocents: 2_000_000, gibSecondNanocents: 200_000, snapshotGibMonthNanocents: 0 },
      oct.start,
      "usr_test",
    );
    const final = await finalizeInvoice(database.db, clock, "ten_i", "2026-10");
    expect(final.status).toBe("final");
    expect(final.cutoffAt).toBe(oct.end + 48 * hour);
    // agt_i1: 2 vCPU × 9000 s = 18000 vCPU-s × 0.002 ¢ = 36 ¢; 1 GiB × 9000 s × 0.0002 ¢ = 1.8 ¢ → 2 ¢
    // agt_i2: 1 vCPU × 3600 s × 0.002 ¢ = 7.2 ¢ → 7 ¢; 0.5 GiB × 3600 s × 0.0002 ¢ = 0.36 ¢ → 0 ¢
    expect(final.lines.map((l) => [l.agentId, l.resource, l.quantity, l.amountCents])).toEqual([
      ["agt_i1", "vcpu", String(2 * 9000_000), 36],
      ["agt_i1", "memory", String(1024 * 9000_000), 2],
      ["agt_i2", "vcpu", String(3600_000), 7],
      ["agt_i2", "memory", String(512 * 3600_000), 0],
    ]);
    expect(final.totalCents).toBe(45);
    // new prices (refused inside the final month, accepted from its end) and new late segments no longer change it
    const dearer = { currency: "USD", vcpuSecondNanocents: 9_000_000, gibSecondNanocents: 0, snapshotGibMonthNanocents: 0 };
    await expect(addRateCardVersion(database.db, "ten_i", dearer, oct.start + 3 * hour, "usr_test")).rejects.toMatchObject({ code: "conflict" });
    await addRateCardVersion(database.db, "ten_i", dearer, oct.end, "usr_test");
    await ingestSegments(
      database.db,
      runSegments({ hostId: "host_3", vmId: "vm_3", tenantId: "ten_i", agentId: "agt_i2", runId: "run_5", start: oct.start + 5 * hour, durationMs: hour }),
      clock,
    );
    const again = await finalizeInvoice(database.db, clock, "ten_i", "2026-10");
    expect(again).toEqual(final);
    expect(await invoiceForMonth(database.db, clock, "ten_i", "2026-10")).toEqual(final);
  });

  it("charges snapshot storage while hibernated, from the event log's snapshot_bytes", async () => {
    const gib = 1024 ** 3;
    const nov = monthRange("UTC", "2026-11");
    await database.db.insert(vmEvents).values([
      {
        at: new Date(nov.start - 10 * hour),
        hostId: "host_j",
        agentId: "agt_j1",
        vmId: "vm_j",
        fromState: "snapshotting",
        toState: "hibernated",
        reason: "idle",
        timings: { snapshotBytes: 2 * gib },
      },
      {
        at: new Date(nov.start + 73 * hour),
        hostId: "host_j",
        agentId: "agt_j1",
        vmId: "vm_j",
        fromState: "hibernated",
        toState: "restoring",
        reason: "request",
      },
      // the host's own key spelling (fleet-agent/host.ts) counts as well
      {
        at: new Date(nov.start + 74 * hour),
        hostId: "host_j",
        agentId: "agt_j1",
        vmId: "vm_j",
        fromState: "snapshotting",
        toState: "hibernated",
        reason: "idle",
        timings: { snapshotMs: 800, snapshotBytes: gib },
      },
    ]);
    clock.advance(Math.max(0, nov.end + 49 * hour - clock.now()));
    const inv = await finalizeInvoice(database.db, clock, "ten_j", "2026-11");
    // 2 GiB × 73 h + 1 GiB × (720 − 74) h = 792 GiB-hours = 792/730 GiB-months × 10 ¢ = 10.849… ¢ → 11 ¢
    expect(inv.lines).toEqual([
      {
        agentId: "agt_j1",
        resource: "snapshot_storage",
        quantity: (BigInt(2 * gib) * BigInt(73 * hour) + BigInt(gib) * BigInt(646 * hour)).toString(),
        unit: "byte-ms",
        unitPriceNanocents: 10_000_000_000,
        priceUnit: "GiB-month",
        amountCents: 11,
        rateCardId: "rc_default",
      },
    ]);
  });

  it("serves invoices over HTTP to their tenant only, as JSON or CSV, and finalizes with the admin scope", async () => {
    const app = appWithCaller(
      createBillingRoutes({ db: database.db, clock, log: silentLogger, componentKey: componentKey("a-component-secret-of-at-least-32-chars!") }),
    );
    const as = (tenant: string, scopes?: string) => ({ headers: { "x-test-tenant": tenant, ...(scopes ? { "x-test-scopes": scopes } : {}) } });
    const res = await app.request("/v1/invoices?month=2026-10", as("ten_i"));
    expect(res.status).toBe(200);
    const body = (await res.json()) as { id: string; status: string; totalCents: number; total: string; periodStart: string; lines: unknown[] };
    expect(body).toMatchObject({ status: "final", totalCents: 45, total: "0.45", periodStart: "2026-10-01T00:00:00+02:00" });
    // Every invoice says what a host lost before it shipped its meter segments costs (issue 17: meters across hosts).
    expect((body as unknown as { metering: string }).metering).toMatch(/lost before it ships loses at most its open segment per agent/);
    expect((await app.request(`/v1/invoices/${body.id}`, as("ten_j"))).status).toBe(404);
    const csv = await (await app.request(`/v1/invoices/${body.id}?format=csv`, as("ten_i"))).text();
    expect(csv.split("\r\n")[0]).toBe("invoice_id,month,status,agent_id,resource,quantity,unit,unit_price_nanocents,price_unit,amount_cents,rate_card_id");
    expect(csv).toContain(`${body.id},2026-10,final,agt_i1,vcpu,18000000,vCPU-ms,2000000,vCPU-second,36`);
    expect(csv).toContain(`${body.id},2026-10,final,,total,,,,,45`);
    const list = (await (await app.request("/v1/invoices", as("ten_i"))).json()) as { invoices: { month: string; status: string }[] };
    expect(list.invoices.map((i) => [i.month, i.status])).toEqual([["2026-10", "final"]]);
    // finalizing needs agents:admin; the current month is still in progress: 409
    expect((await app.request("/v1/invoices/2026-12/finalize", { method: "POST", ...as("ten_j", "usage:read") })).status).toBe(403);
    clock.advance(Math.max(0, Date.UTC(2026, 11, 15) - clock.now()));
    const early = await app.request("/v1/invoices/2026-12/finalize", { method: "POST", ...as("ten_j", "agents:admin") });
    expect(early.status).toBe(409);
    expect(((await early.json()) as { error: { message: string } }).error.message).toMatch(/can be finalized from 2027-01-03T00:00:00.000Z/);
    expect((await app.request("/v1/invoices?month=2027-02", as("ten_j"))).status).toBe(400);
    expect((await app.request("/v1/invoices?month=2026-1", as("ten_j"))).status).toBe(400);
  });
});

// Dozing in billing on real Postgres: the meter's active → dozing → active segments ingested, usage and runs that say dozed (and hibernated) time apart, invoices that price doze at the card's doze rates.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { sql } from "drizzle-orm";
import { ingestSegments } from "../../billing/ingest.ts";
import { finalizeInvoice, invoiceForMonth } from "../../billing/invoices.ts";
import { createBillingRoutes } from "../../billing/routes.ts";
import { usageReport } from "../../billing/usage.ts";
import type { MeterSegment } from "../../contracts/meter.ts";
import { Meter } from "../../fleet-agent/meter/meter.ts";
import type { SegmentLog } from "../../fleet-agent/meter/spool.ts";
import { ManualClock } from "../../lib/clock.ts";
import { componentKey } from "../../lib/host-token.ts";
import { silentLogger } from "../../lib/log.ts";
import { runs, vmEvents } from "../../schema/core.ts";
import { operations } from "../../schema/operations.ts";
import { openDatabase, queryRows, type Database } from "../../schema/db.ts";
import { freshDatabase } from "../helpers/db.ts";
import { appWithCaller, segment, seedTenant } from "./billing-fixtures.ts";
import { renderInvoice, type InvoiceBody as CliInvoice } from "../../cli/invoices.ts";
import { renderUsage, type UsageBody } from "../../cli/usage.ts";

const second = 1000;
const hour = 3_600_000;
/** A run that wakes at 10:14:50 and dozes across the 10:15 quarter hour. */
const runA = Date.UTC(2026, 10, 2, 10, 14, 50);
const runC = Date.UTC(2026, 10, 4, 8, 0, 0);
const nov3 = Date.UTC(2026, 10, 3);

/** The meter's spool in memory: what the host would ship. */
class MemorySpool implements SegmentLog {
  segments: MeterSegment[] = [];
  private seq = 0;
  nextSeq(): number {
    return this.seq++;
  }
  append(s: MeterSegment): void {
    this.segments.push(s);
  }
}

/**
 * One run of 2 vCPUs and 1 GiB metered by the real meter (7 s heartbeat, restarted at each doze and resume): active
 * 4 s, dozing 30 s, active 6 s, dozing 20 s, active 1 s, then idle. 11 s active, 50 s dozing.
 */
function dozingRun(wall: number, runId: string, vmId: string): MeterSegment[] {
  const clock = new ManualClock(wall);
  const spool = new MemorySpool();
  const meter = new Meter({ hostId: "host_d", clock, spool, heartbeatMs: 7_000 });
  const at = () => ({ at: clock.now(), mono: clock.monotonic(), vmId });
  meter.active({ ...at(), hostId: "host_d", agentId: "agt_d1", tenantId: "ten_d", runId, vcpus: 2, memMiB: 1024, reason: "request" });
  const steps: [number, boolean][] = [
    [4, true],
    [30, false],
    [6, true],
    [20, false],
  ];
  for (const [seconds, dozing] of steps) {
    clock.advance(seconds * second);
    meter.doze({ ...at(), dozing });
  }
  clock.advance(1 * second);
  meter.inactive({ ...at(), reason: "idle" });
  return spool.segments;
}

describe("billing of dozed time", () => {
  let database: Database;
  const clock = new ManualClock(Date.UTC(2026, 10, 20));
  let app: ReturnType<typeof appWithCaller>;
  const segsA = dozingRun(runA, "run_dA", "vm_dA");
  const segsC = dozingRun(runC, "run_dC", "vm_dC");
  const get = async <T>(path: string) => {
    const res = await app.request(path, { headers: { "x-test-tenant": "ten_d" } });
    expect(res.status).toBe(200);
    return (await res.json()) as T;
  };

  beforeAll(async () => {
    database = await freshDatabase();
    await seedTenant(database.db, "ten_d", "UTC", ["agt_d1", "agt_d2"]);
    app = appWithCaller(
      createBillingRoutes({ db: database.db, clock, log: silentLogger, componentKey: componentKey("a-component-secret-of-at-least-32-chars!") }),
    );
  });
  afterAll(async () => {
    await database.close();
  });

  it("ingests a run's active, dozing and active segments (COPY and INSERT paths); a re-ship is all duplicates", async () => {
    expect(segsA.map((s) => [s.state ?? "active", s.startReason, s.endReason])).toEqual([
      ["active", "request", "doze"],
      ["dozing", "doze", "heartbeat"],
      ["dozing", "heartbeat", "heartbeat"],
      ["dozing", "heartbeat", "heartbeat"],
      ["dozing", "heartbeat", "heartbeat"],
      ["dozing", "heartbeat", "resume"],
      ["active", "resume", "doze"],
      ["dozing", "doze", "heartbeat"],
      ["dozing", "heartbeat", "heartbeat"],
      ["dozing", "heartbeat", "resume"],
      ["active", "resume", "idle"],
    ]);
    const a = await ingestSegments(database.db, segsA, clock);
    expect(a).toEqual({ accepted: segsA.map((s) => s.id), duplicates: [], rejected: [] });
    const c = await ingestSegments(database.db, segsC, clock, { copy: false });
    expect(c.accepted).toHaveLength(segsC.length);
    const again = await ingestSegments(database.db, [...segsA, ...segsC], clock);
    expect(again).toEqual({ accepted: [], duplicates: [...segsA, ...segsC].map((s) => s.id), rejected: [] });
    const stored = await queryRows<{ state: string; n: number }>(
      database.db,
      sql`select state, count(*)::int as n from meter_segments where run_id = 'run_dA' group by state order by state`,
    );
    expect(stored).toEqual([
      { state: "active", n: 3 },
      { state: "dozing", n: 8 },
    ]);
  });

  it("takes a segment without state (as every segment before dozing) as active; its re-ship is a duplicate, a changed state a conflict", async () => {
    const old = segment({
      hostId: "host_o",
      vmId: "vm_o",
      tenantId: "ten_d",
      agentId: "agt_d2",
      runId: "run_o",
      start: nov3,
      end: nov3 + 10_000,
      vcpus: 1,
      memMiB: 512,
    });
    expect("state" in old).toBe(false);
    expect(await ingestSegments(database.db, [old], clock)).toEqual({ accepted: [old.id], duplicates: [], rejected: [] });
    expect(await ingestSegments(database.db, [old, { ...old, state: "active" }], clock)).toEqual({ accepted: [], duplicates: [old.id], rejected: [] });
    const changed = await ingestSegments(database.db, [{ ...old, state: "dozing" }], clock);
    expect(changed.rejected).toEqual([{ id: old.id, code: "conflict", message: expect.stringMatching(/different body/) }]);
    const [conflict] = await queryRows<{ incoming: { state: string }; existing: { state: string } }>(
      database.db,
      sql`select incoming, existing from meter_conflicts where segment_id = ${old.id}`,
    );
    expect([conflict?.incoming.state, conflict?.existing.state]).toEqual(["dozing", "active"]);
    const bad = await ingestSegments(database.db, [{ ...old, id: "host_o:vm_o:1", seq: 1, state: "asleep" as never }], clock);
    expect(bad.rejected).toEqual([{ id: "host_o:vm_o:1", code: "invalid_segment", message: expect.stringMatching(/state must be active or dozing/) }]);
    const [row] = await queryRows<{ state: string }>(database.db, sql`select state from meter_segments where id = ${old.id}`);
    expect(row?.state).toBe("active");
  });

  it("reports dozed time apart from active time, split at the quarter hour, and the sums equal the raw segments by state", async () => {
    // 10:00–10:15: active 10:14:50–54, dozing 10:14:54–15:00; 10:15–10:30: dozing 24 s + 20 s, active 6 s + 1 s
    const quarters = await get<{ rows: Record<string, unknown>[] }>("/v1/usage?from=2026-11-02T10:00:00Z&to=2026-11-02T10:30:00Z&groupBy=agent&agentId=agt_d1");
    const q1 = await get<{ rows: Record<string, unknown>[]; source: string }>("/v1/usage?from=2026-11-02T10:00:00Z&to=2026-11-02T10:15:00Z&agentId=agt_d1");
    expect(q1.source).toBe("rollup");
    expect(q1.rows).toEqual([
      expect.objectContaining({
        activeMs: 4_000,
        vcpuMs: 8_000,
        mibMs: 4_000 * 1024,
        dozedMs: 6_000,
        dozedVcpuMs: 12_000,
        dozedMibMs: 6_000 * 1024,
        hibernatedMs: 0,
      }),
    ]);
    const q2 = await get<{ rows: Record<string, unknown>[] }>("/v1/usage?from=2026-11-02T10:15:00Z&to=2026-11-02T10:30:00Z&agentId=agt_d1");
    expect(q2.rows).toEqual([expect.objectContaining({ activeMs: 7_000, vcpuMs: 14_000, dozedMs: 44_000, dozedVcpuMs: 88_000, dozedMibMs: 44_000 * 1024 })]);
    expect(quarters.rows).toEqual([expect.objectContaining({ agentId: "agt_d1", activeMs: 11_000, dozedMs: 50_000 })]);

    // the month by agent and hour: rollups = raw; totals = the raw table summed by state
    const q = { tenantId: "ten_d", from: Date.UTC(2026, 10, 1), to: Date.UTC(2026, 11, 1), zone: "Europe/Paris", byAgent: true, time: "hour" as const };
    const rollup = await usageReport(database.db, q);
    const raw = await usageReport(database.db, q, { source: "raw" });
    expect(rollup.source).toBe("rollup");
    expect(rollup.rows).toEqual(raw.rows);
    const [sums] = await queryRows<Record<string, string>>(
      database.db,
      sql`select
        sum(extract(epoch from ended_at - started_at) * 1000) filter (where state = 'active')::int8 as active,
        sum(extract(epoch from ended_at - started_at) * 1000 * vcpus) filter (where state = 'active')::int8 as vcpu,
        sum(extract(epoch from ended_at - started_at) * 1000 * mem_mib) filter (where state = 'active')::int8 as mib,
        sum(extract(epoch from ended_at - started_at) * 1000) filter (where state = 'dozing')::int8 as dozed,
        sum(extract(epoch from ended_at - started_at) * 1000 * vcpus) filter (where state = 'dozing')::int8 as dozed_vcpu,
        sum(extract(epoch from ended_at - started_at) * 1000 * mem_mib) filter (where state = 'dozing')::int8 as dozed_mib
      from meter_segments where tenant_id = 'ten_d'`,
    );
    expect(rollup.totals).toEqual({
      activeMs: Number(sums?.active),
      vcpuMs: Number(sums?.vcpu),
      mibMs: Number(sums?.mib),
      dozedMs: Number(sums?.dozed),
      dozedVcpuMs: Number(sums?.dozed_vcpu),
      dozedMibMs: Number(sums?.dozed_mib),
      hibernatedMs: 0,
    });
    expect(rollup.totals.dozedMs).toBe(100_000);
    // dozed vCPU-ms: the rollups (both runs, 2 vCPUs × 50 s each) = the raw path, per row and in total, not all zero
    expect(rollup.totals.dozedVcpuMs).toBe(2 * 100_000);
    expect(raw.totals.dozedVcpuMs).toBe(rollup.totals.dozedVcpuMs);
    expect(raw.rows.map((r) => r.dozedVcpuMs)).toEqual(rollup.rows.map((r) => r.dozedVcpuMs));
    expect(rollup.rows.filter((r) => r.dozedVcpuMs > 0).length).toBeGreaterThan(1);
    // a window that is not on a quarter hour is answered from raw segments, with the same dozed vCPU-ms
    const unaligned = await usageReport(database.db, { ...q, from: runA - 7, to: runA + 3_600_000 - 7, time: undefined });
    expect(unaligned.source).toBe("raw");
    expect(unaligned.totals.dozedVcpuMs).toBe(100_000);
    expect(rollup.totals.activeMs).toBe(22_000 + 10_000);

    // the CLI's table shows dozed seconds beside active ones
    const table = renderUsage(await get<UsageBody>("/v1/usage?from=2026-11-02&to=2026-11-03&groupBy=agent")).split("\n");
    expect(table[0]).toMatch(/^window start\s+agent\s+active s\s+dozed s\s+hibernated s\s+vCPU-s\s+GiB-s$/);
    expect(table[2]).toMatch(/^2026-11-02T00:00:00\+00:00\s+agt_d1\s+11\.000\s+50\.000\s+0\.000\s+22\.000\s+11\.000$/);

    const csv = await (await app.request("/v1/usage?from=2026-11-02&to=2026-11-03&groupBy=agent&format=csv", { headers: { "x-test-tenant": "ten_d" } })).text();
    expect(csv.split("\r\n").slice(0, 2)).toEqual([
      "window_start,window_end,agent_id,active_ms,vcpu_ms,mib_ms,dozed_ms,dozed_vcpu_ms,dozed_mib_ms,hibernated_ms,pool_id",
      `2026-11-02T00:00:00+00:00,2026-11-03T00:00:00+00:00,agt_d1,11000,22000,${11_000 * 1024},50000,100000,${50_000 * 1024},0,`,
    ]);
  });

  it("says each run's dozed ms beside its active ms, and its operations: how many, their upstream wait and tokens", async () => {
    const run = (id: string, wokeAt: number, sleptAt: number) => ({
      id,
      agentId: "agt_d1",
      tenantId: "ten_d",
      hostId: "host_d",
      vmId: `vm_${id}`,
      wokeAt: new Date(wokeAt),
      wakeReason: "request",
      wakeMode: "restore",
      sleptAt: new Date(sleptAt),
      sleepReason: "idle",
    });
    await database.db.insert(runs).values([run("run_dA", runA, runA + 61_000), run("run_dC", runC, runC + 61_000)]);
    // run A's two model calls, answered after 30 s and 20 s (the time it dozed); run C's one call that got no answer;
    // a call made while the agent slept (no run) and another agent's call that names run A: in no run's sums
    let n = 0;
    const op = (p: { agentId?: string; runId: string | null; sent: number; waitMs?: number; input?: number; output?: number }) => ({
      id: `op_d${n++}`,
      tenantId: "ten_d",
      agentId: p.agentId ?? "agt_d1",
      runId: p.runId,
      hostId: "host_d",
      upstream: "model",
      method: "POST",
      path: "/v1/chat/completions",
      requestHash: "0".repeat(64),
      mode: "sync" as const,
      state: p.waitMs === undefined ? ("failed" as const) : ("succeeded" as const),
      status: p.waitMs === undefined ? null : 200,
      sentAt: new Date(p.sent),
      firstByteAt: p.waitMs === undefined ? null : new Date(p.sent + p.waitMs),
      endedAt: new Date(p.sent + (p.waitMs ?? 0) + 1_000),
      inputTokens: p.input ?? null,
      outputTokens: p.output ?? null,
    });
    await database.db
      .insert(operations)
      .values([
        op({ runId: "run_dA", sent: runA + 4_000, waitMs: 30_000, input: 1_200, output: 300 }),
        op({ runId: "run_dA", sent: runA + 40_000, waitMs: 20_000, input: 800 }),
        op({ runId: "run_dC", sent: runC + 4_000 }),
        op({ runId: null, sent: runA + 100_000, waitMs: 5_000, input: 7, output: 7 }),
        op({ agentId: "agt_d2", runId: "run_dA", sent: runA + 5_000, waitMs: 9_000, input: 9, output: 9 }),
      ]);
    const day = await get<{ runs: Record<string, unknown>[] }>("/v1/agents/agt_d1/runs?from=2026-11-02&to=2026-11-03");
    const runAReport = {
      runId: "run_dA",
      awakeMs: 61_000,
      activeMs: 11_000,
      vcpuMs: 22_000,
      dozedMs: 50_000,
      dozedVcpuMs: 100_000,
      dozedMibMs: 50_000 * 1024,
      segments: 11,
      operations: 2,
      upstreamWaitMs: 50_000,
      inputTokens: 2_000,
      outputTokens: 300,
    };
    expect(day.runs).toEqual([expect.objectContaining(runAReport)]);
    // a page of two runs: each its own operations (grouped once for the page), newest first
    const month = await get<{ runs: Record<string, unknown>[] }>("/v1/agents/agt_d1/runs?from=2026-11-01&to=2026-12-01");
    expect(month.runs).toEqual([
      expect.objectContaining({ runId: "run_dC", dozedMs: 50_000, operations: 1, upstreamWaitMs: 0, inputTokens: 0, outputTokens: 0 }),
      expect.objectContaining(runAReport),
    ]);
    const paged = await get<{ runs: Record<string, unknown>[]; nextCursor: string }>("/v1/agents/agt_d1/runs?from=2026-11-01&to=2026-12-01&limit=1");
    expect(paged.runs).toEqual([expect.objectContaining({ runId: "run_dC", operations: 1 })]);
    const next = await get<{ runs: Record<string, unknown>[] }>(`/v1/agents/agt_d1/runs?limit=1&cursor=${encodeURIComponent(paged.nextCursor)}`);
    expect(next.runs).toEqual([expect.objectContaining(runAReport)]);
    const csv = await (await app.request("/v1/agents/agt_d1/runs?from=2026-11-02&to=2026-11-03&format=csv", { headers: { "x-test-tenant": "ten_d" } })).text();
    expect(csv.split("\r\n")[0]).toMatch(
      /,active_ms,vcpu_ms,mib_ms,dozed_ms,dozed_vcpu_ms,dozed_mib_ms,segments,operations,upstream_wait_ms,input_tokens,output_tokens,viewer_ms,control_ms,overlap_ms$/,
    );
    expect(csv).toContain(`,idle,11000,22000,${11_000 * 1024},50000,100000,${50_000 * 1024},11,2,50000,2000,300,0,0,0\r\n`);
  });

  it("reports hibernated time from the event log, for agents that only slept in a window too", async () => {
    const event = (agentId: string, at: number, toState: string) => ({
      at: new Date(at),
      hostId: "host_d",
      agentId,
      vmId: `vm_${agentId}`,
      fromState: toState === "hibernated" ? "snapshotting" : "hibernated",
      toState,
      reason: toState === "hibernated" ? "idle" : "request",
    });
    await database.db
      .insert(vmEvents)
      .values([
        event("agt_d1", runA + 70_000, "hibernated"),
        event("agt_d1", runC - 5_000, "restoring"),
        event("agt_d1", runC + 70_000, "hibernated"),
        event("agt_d2", nov3 + hour, "hibernated"),
        event("agt_d2", nov3 + 5 * hour, "restoring"),
      ]);
    const body = await get<{ rows: { start: string; agentId: string; activeMs: number; hibernatedMs: number }[]; totals: { hibernatedMs: number } }>(
      "/v1/usage?from=2026-11-03T00:00:00Z&to=2026-11-03T06:00:00Z&groupBy=agent,hour",
    );
    const cells = body.rows.map((r) => [r.start.slice(11, 13), r.agentId, r.activeMs, r.hibernatedMs]);
    expect(cells).toEqual([
      ["00", "agt_d1", 0, hour], // asleep since Nov 2: the event before the range says so
      ["00", "agt_d2", 10_000, 0],
      ["01", "agt_d1", 0, hour],
      ["01", "agt_d2", 0, hour],
      ["02", "agt_d1", 0, hour],
      ["02", "agt_d2", 0, hour],
      ["03", "agt_d1", 0, hour],
      ["03", "agt_d2", 0, hour],
      ["04", "agt_d1", 0, hour],
      ["04", "agt_d2", 0, hour],
      ["05", "agt_d1", 0, hour],
    ]);
    expect(body.totals.hibernatedMs).toBe(10 * hour);
  });

  it("prices doze at the card's doze rates: vCPU at its price, memory at the snapshot rate when null, at its own when set", async () => {
    const post = (body: Record<string, unknown>) =>
      app.request("/v1/tenants/ten_d/rate-cards", {
        method: "POST",
        headers: { "x-test-tenant": "ten_ops", "x-test-scopes": "operator", "content-type": "application/json" },
        body: JSON.stringify(body),
      });
    const base = { vcpuSecondNanocents: 1_000_000, gibSecondNanocents: 100_000, snapshotGibMonthNanocents: 262_800_000_000_000 };
    // v1: 1 ¢ per dozing vCPU-second; doze memory not given: the snapshot rate (0.1 ¢ per GiB-second of a 730 h month)
    const v1 = await post({ ...base, dozeVcpuSecondNanocents: 1_000_000_000, effectiveFrom: "2026-11-01T00:00:00Z" });
    expect(v1.status).toBe(201);
    const card1 = (await v1.json()) as { id: string; dozeVcpuSecondNanocents: number; dozeGibSecondNanocents: number | null };
    expect([card1.dozeVcpuSecondNanocents, card1.dozeGibSecondNanocents]).toEqual([1_000_000_000, null]);
    // v2 from Nov 3: dozing vCPUs free again (the default), doze memory 0.06 ¢ per GiB-second
    const v2 = await post({ ...base, dozeGibSecondNanocents: 60_000_000, effectiveFrom: "2026-11-03T00:00:00Z" });
    expect(v2.status).toBe(201);
    const card2 = (await v2.json()) as { id: string; dozeVcpuSecondNanocents: number; dozeGibSecondNanocents: number | null };
    expect([card2.dozeVcpuSecondNanocents, card2.dozeGibSecondNanocents]).toEqual([0, 60_000_000]);
    // bad doze prices: the one error envelope, 400
    for (const bad of [
      { dozeGibSecondNanocents: -1 },
      { dozeGibSecondNanocents: 2 ** 52 },
      { dozeVcpuSecondNanocents: 0.5 },
      { dozeVcpuSecondNanocents: "1" },
    ]) {
      const res = await post({ ...base, ...bad, effectiveFrom: "2026-11-10T00:00:00Z" });
      expect(res.status).toBe(400);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe("bad_request");
    }
    clock.advance(Math.max(0, Date.UTC(2026, 10, 3, 12) - clock.now()));
    const current = await get<Record<string, unknown>>("/v1/rate-card");
    expect(current).toMatchObject({ id: card2.id, dozeVcpuSecondNanocents: 0, dozeGibSecondNanocents: 60_000_000 });
    expect((current.units as Record<string, string>).dozeGibSecondNanocents).toMatch(/null: the snapshot rate/);

    type Line = { agentId: string; resource: string; quantity: string; unitPriceNanocents: number; priceUnit: string; amountCents: number; rateCardId: string };
    type InvoiceBody = { status: string; lines: Line[]; time: unknown[]; totalCents: number; rates: Record<string, unknown> };
    const dozeLines = (inv: { lines: Line[] }) =>
      inv.lines
        .filter((l) => l.resource.startsWith("doze_"))
        .map((l) => [l.resource, l.quantity, l.unitPriceNanocents, l.priceUnit, l.amountCents, l.rateCardId]);
    const expected = [
      // run A under v1: 100 vCPU-s × 1 ¢ = 100 ¢; 50 GiB-s at the snapshot rate, 262.8e12 nc per GiB-month = 0.1 ¢ per GiB-s → 5 ¢
      ["doze_vcpu", "100000", 1_000_000_000, "vCPU-second", 100, card1.id],
      ["doze_memory", String(50_000 * 1024), 262_800_000_000_000, "GiB-month", 5, card1.id],
      // run C under v2: free vCPUs; 50 GiB-s × 0.06 ¢ = 3 ¢ (its GiB-second price × 2,628,000 s per GiB-month)
      ["doze_vcpu", "100000", 0, "vCPU-second", 0, card2.id],
      ["doze_memory", String(50_000 * 1024), 60_000_000 * 2_628_000, "GiB-month", 3, card2.id],
    ];
    const draft = await get<InvoiceBody>("/v1/invoices?month=2026-11");
    expect(draft.status).toBe("draft");
    expect(dozeLines(draft)).toEqual(expected);
    // each doze vCPU line's quantity is the rollups' dozed vCPU-ms over its card's part of the month
    const rolled = await queryRows<{ v1: string; v2: string }>(
      database.db,
      sql`select sum(dozed_vcpu_ms) filter (where bucket_start < '2026-11-03T00:00:00Z')::text as v1,
        sum(dozed_vcpu_ms) filter (where bucket_start >= '2026-11-03T00:00:00Z')::text as v2
      from usage_quarter_hours where tenant_id = 'ten_d' and agent_id = 'agt_d1'`,
    );
    expect(draft.lines.filter((l) => l.resource === "doze_vcpu").map((l) => l.quantity)).toEqual([rolled[0]?.v1, rolled[0]?.v2]);
    // active lines are priced as before, from active time only: 22 s × 2 vCPU × 0.001 ¢ → 0 ¢
    expect(draft.lines.filter((l) => l.agentId === "agt_d1" && l.resource === "vcpu").map((l) => l.quantity)).toEqual(["22000", "22000"]);
    expect(draft.totalCents).toBe(draft.lines.reduce((t, l) => t + l.amountCents, 0));
    expect(draft.totalCents).toBe(108);

    clock.advance(Math.max(0, Date.UTC(2026, 11, 3, 1) - clock.now()));
    const final = await finalizeInvoice(database.db, clock, "ten_d", "2026-11");
    expect(final.status).toBe("final");
    expect(dozeLines(final as unknown as { lines: Line[] })).toEqual(expected);
    expect(final.totalCents).toBe(108);
    expect(final.rates).toMatchObject({ dozeVcpuSecondNanocents: 1_000_000_000, dozeGibSecondNanocents: null });
    // each agent's time by state, frozen with the invoice: hibernated from the event log up to the month's end
    const monthEnd = Date.UTC(2026, 11, 1);
    expect(final.time).toEqual([
      { agentId: "agt_d1", activeMs: 22_000, dozedMs: 100_000, hibernatedMs: runC - 5_000 - (runA + 70_000) + (monthEnd - (runC + 70_000)) },
      { agentId: "agt_d2", activeMs: 10_000, dozedMs: 0, hibernatedMs: 4 * hour },
    ]);
    const served = await get<InvoiceBody>("/v1/invoices?month=2026-11");
    expect(served.time).toEqual(final.time);
    expect(dozeLines(served)).toEqual(expected);
    const printed = renderInvoice(served as unknown as CliInvoice, 200);
    expect(printed).toMatch(/agt_d1\s+doze_memory\s+51200000 MiB-ms\s+262800000000000 n¢\/GiB-month\s+5 ¢/);
    expect(printed).toContain("agent agt_d1: active 22.000 s, dozed 100.000 s, hibernated ");
  });
});

describe("billing of dozed time on embedded PGlite (the all-in-one npm start)", () => {
  it("ingests, reports and invoices dozing segments with the same SQL", async () => {
    const lite = await openDatabase({ pgliteMemory: true });
    try {
      await seedTenant(lite.db, "ten_d", "UTC", ["agt_d1"]);
      const clock = new ManualClock(Date.UTC(2026, 10, 20));
      const segs = dozingRun(runA, "run_dA", "vm_dA");
      expect((await ingestSegments(lite.db, segs, clock)).accepted).toHaveLength(segs.length);
      expect((await ingestSegments(lite.db, segs, clock)).duplicates).toHaveLength(segs.length);
      const q = { tenantId: "ten_d", from: Date.UTC(2026, 10, 2, 10), to: Date.UTC(2026, 10, 2, 11), zone: "UTC", byAgent: true, time: "hour" as const };
      const rollup = await usageReport(lite.db, q);
      expect(rollup.rows).toEqual((await usageReport(lite.db, q, { source: "raw" })).rows);
      expect(rollup.totals).toMatchObject({ activeMs: 11_000, dozedMs: 50_000, dozedMibMs: 50_000 * 1024 });
      const inv = await invoiceForMonth(lite.db, clock, "ten_d", "2026-11");
      // the default card: dozing vCPUs free, dozing memory at the snapshot rate ($0.10 per GiB-month)
      expect(inv.lines.filter((l) => l.resource.startsWith("doze_")).map((l) => [l.resource, l.quantity, l.unitPriceNanocents, l.amountCents])).toEqual([
        ["doze_vcpu", "100000", 0, 0],
        ["doze_memory", String(50_000 * 1024), 10_000_000_000, 0],
      ]);
      // the doze vCPU line is priced from the rollups (not from raw segments): a changed rollup changes the line
      await lite.db.execute(sql`update usage_quarter_hours set dozed_vcpu_ms = dozed_vcpu_ms + 1 where tenant_id = 'ten_d' and dozed_vcpu_ms > 0`);
      const buckets = (await queryRows<{ n: number }>(lite.db, sql`select count(*)::int as n from usage_quarter_hours where dozed_vcpu_ms > 0`))[0]?.n ?? 0;
      expect(buckets).toBe(2); // run A dozes across 10:15
      const after = await invoiceForMonth(lite.db, clock, "ten_d", "2026-11");
      expect(after.lines.find((l) => l.resource === "doze_vcpu")?.quantity).toBe(String(100_000 + buckets));
    } finally {
      await lite.close();
    }
  });
});

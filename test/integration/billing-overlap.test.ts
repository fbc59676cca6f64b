// One agent's time billed once whichever hosts report it: overlapping segments are clipped at ingest (Postgres COPY and INSERT paths, PGlite; concurrent shipments on Postgres).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { sql } from "drizzle-orm";
import { ingestSegments } from "../../billing/ingest.ts";
import { invoiceForMonth } from "../../billing/invoices.ts";
import { runJson, runsCsv } from "../../billing/report-views.ts";
import { agentRuns } from "../../billing/runs.ts";
import { usageReport } from "../../billing/usage.ts";
import type { MeterSegment } from "../../contracts/meter.ts";
import { ManualClock } from "../../lib/clock.ts";
import { silentLogger, type Logger } from "../../lib/log.ts";
import { noopMetrics, type Metrics } from "../../lib/metrics.ts";
import { runs } from "../../schema/core.ts";
import { openDatabase, queryRows, type Database } from "../../schema/db.ts";
import { freshDatabase } from "../helpers/db.ts";
import { runSegments, seedTenant, segment } from "./billing-fixtures.ts";

// 5 s before a quarter hour: segments cross a rollup bucket's edge
const tb = Date.UTC(2026, 2, 1, 10, 14, 55);
const clock = new ManualClock(Date.UTC(2026, 3, 1));
const day = { from: Date.UTC(2026, 2, 1), to: Date.UTC(2026, 2, 2) };

const variants: { name: string; open: () => Promise<Database>; copy: boolean; postgres: boolean }[] = [
  { name: "Postgres via COPY", open: () => freshDatabase(), copy: true, postgres: true },
  { name: "Postgres via INSERT … ON CONFLICT", open: () => freshDatabase(), copy: false, postgres: true },
  { name: "PGlite", open: () => openDatabase({ pgliteMemory: true }), copy: true, postgres: false },
];

/** A logger that keeps its warnings. */
function capture(): Logger & { warnings: { msg: string; fields: Record<string, unknown> }[] } {
  const warnings: { msg: string; fields: Record<string, unknown> }[] = [];
  return { ...silentLogger, warn: (msg, fields = {}) => warnings.push({ msg, fields }), child: () => silentLogger, warnings };
}

for (const v of variants) {
  describe(`overlapping segments of one agent (${v.name})`, () => {
    let database: Database;
    beforeAll(async () => {
      database = await v.open();
    });
    afterAll(async () => {
      await database.close();
    });
    const ingest = async (batch: MeterSegment[], log?: Logger, metrics?: Metrics) => {
      const r = await ingestSegments(database.db, batch, clock, { copy: v.copy, ...(log ? { log } : {}), ...(metrics ? { metrics } : {}) });
      expect(r.rejected).toEqual([]);
      return r;
    };

    /** What every path bills the agent on the day: rollups, raw segments, runs, the month's draft invoice. */
    async function billed(tenantId: string, agentId: string, vcpus: number) {
      const q = { tenantId, agentId, ...day, zone: "UTC", byAgent: true, time: "hour" as const };
      const rollup = await usageReport(database.db, q, { source: "rollup" });
      const raw = await usageReport(database.db, q, { source: "raw" });
      expect(raw.rows).toEqual(rollup.rows);
      // a range off the quarter hours takes the raw path on its own
      const odd = await usageReport(database.db, { tenantId, agentId, from: tb - 7_000, to: tb + 3_600_000, zone: "UTC", byAgent: false });
      expect(odd.source).toBe("raw");
      const [run] = await queryRows<{ active: string; vcpu: string }>(
        database.db,
        sql`select coalesce(sum(active_ms), 0)::int8::text as active, coalesce(sum(vcpu_ms), 0)::int8::text as vcpu from run_usage where agent_id = ${agentId}`,
      );
      const invoice = await invoiceForMonth(database.db, clock, tenantId, "2026-03");
      const vcpuLine = invoice.lines.filter((l) => l.agentId === agentId && l.resource === "vcpu").reduce((n, l) => n + Number(l.quantity), 0);
      const out = {
        rollup: rollup.totals.activeMs,
        raw: raw.totals.activeMs,
        oddRange: odd.totals.activeMs,
        runs: Number(run?.active),
        invoice: invoice.time.find((t) => t.agentId === agentId)?.activeMs ?? 0,
      };
      expect(rollup.totals.vcpuMs).toBe(out.rollup * vcpus);
      expect(Number(run?.vcpu)).toBe(out.rollup * vcpus);
      expect(vcpuLine).toBe(out.invoice * vcpus);
      return out;
    }
    const all = (ms: number) => ({ rollup: ms, raw: ms, oddRange: ms, runs: ms, invoice: ms });

    async function marks(tenantId: string): Promise<Record<string, { overlapMs: number; billed: string | null }>> {
      const rows = await queryRows<{ id: string; overlap_ms: unknown; billed: string | null }>(
        database.db,
        sql`select id, overlap_ms, billed_spans::text as billed from meter_segments where tenant_id = ${tenantId} order by id`,
      );
      return Object.fromEntries(rows.map((r) => [r.id, { overlapMs: Number(r.overlap_ms), billed: r.billed }]));
    }

    it("bills two hosts' segments overlapping by 667 ms once, in either arrival order, and warns", async () => {
      for (const order of ["ab", "ba"]) {
        const tenantId = `ten_1${order}`;
        const agentId = `agt_1${order}`;
        await seedTenant(database.db, tenantId, "UTC", [agentId]);
        const p = { tenantId, agentId, vmId: `vm_1${order}`, vcpus: 2, memMiB: 512 };
        const a = segment({ ...p, hostId: "host_a", runId: `run_a${order}`, start: tb, end: tb + 10_000 });
        const b = segment({ ...p, hostId: "host_b", runId: `run_b${order}`, start: tb + 10_000 - 667, end: tb + 20_000 - 667 });
        const [first, later] = order === "ab" ? [a, b] : [b, a];
        const log = capture();
        const counted: Record<string, number> = {};
        const metrics: Metrics = { ...noopMetrics, inc: (name, _labels, by = 1) => void (counted[name] = (counted[name] ?? 0) + by) };
        expect((await ingest([first], log, metrics)).accepted).toEqual([first.id]);
        expect((await ingest([later], log, metrics)).accepted).toEqual([later.id]);
        expect(counted).toEqual({ agentvm_billing_overlap_segments_total: 1, agentvm_billing_overlap_seconds_total: 0.667 });
        expect(await billed(tenantId, agentId, 2)).toEqual(all(20_000 - 667));
        // both rows kept; the later one says what it did not bill
        const m = await marks(tenantId);
        expect(m[first.id]).toEqual({ overlapMs: 0, billed: null });
        expect(m[later.id]?.overlapMs).toBe(667);
        expect(m[later.id]?.billed).toBe(order === "ab" ? `{[${tb + 10_000},${tb + 20_000 - 667})}` : `{[${tb},${tb + 10_000 - 667})}`);
        expect(log.warnings).toEqual([
          { msg: expect.stringContaining("overlap"), fields: expect.objectContaining({ agentId, hostIds: ["host_a", "host_b"], overlapMs: 667 }) },
        ]);
      }
    });

    it("bills a wholly duplicated segment from another host zero and keeps its row, marked", async () => {
      const tenantId = "ten_2";
      const agentId = "agt_2";
      await seedTenant(database.db, tenantId, "UTC", [agentId]);
      const p = { tenantId, agentId, vmId: "vm_2", vcpus: 1, memMiB: 256 };
      const a0 = segment({ ...p, hostId: "host_a", runId: "run_2a", seq: 0, start: tb, end: tb + 10_000 });
      const a1 = segment({ ...p, hostId: "host_a", runId: "run_2a", seq: 1, start: tb + 20_000, end: tb + 30_000 });
      await ingest([a0, a1]);
      const dup = segment({ ...p, hostId: "host_b", runId: "run_2b", start: tb + 2_000, end: tb + 5_000 });
      expect((await ingest([dup])).accepted).toEqual([dup.id]);
      // one that covers the gap between host_a's two segments: only the gap is billed
      const across = segment({ ...p, hostId: "host_c", runId: "run_2c", start: tb + 5_000, end: tb + 25_000 });
      expect((await ingest([across])).accepted).toEqual([across.id]);
      expect(await billed(tenantId, agentId, 1)).toEqual(all(30_000));
      const m = await marks(tenantId);
      expect(m[dup.id]).toEqual({ overlapMs: 3_000, billed: "{}" });
      expect(m[across.id]).toEqual({ overlapMs: 10_000, billed: `{[${tb + 10_000},${tb + 20_000})}` });
      const runRows = await queryRows<{ run_id: string; active_ms: unknown; overlap_ms: unknown; segments: number }>(
        database.db,
        sql`select run_id, active_ms, overlap_ms, segments from run_usage where agent_id = ${agentId} order by run_id`,
      );
      expect(runRows.map((r) => [r.run_id, Number(r.active_ms), Number(r.overlap_ms), Number(r.segments)])).toEqual([
        ["run_2a", 20_000, 0, 2],
        ["run_2b", 0, 3_000, 1],
        ["run_2c", 10_000, 10_000, 1],
      ]);
    });

    it("clips segments that overlap each other within one shipment", async () => {
      const tenantId = "ten_3";
      const agentId = "agt_3";
      await seedTenant(database.db, tenantId, "UTC", [agentId]);
      const p = { tenantId, agentId, vmId: "vm_3", vcpus: 3, memMiB: 256 };
      const batch = [
        segment({ ...p, hostId: "host_a", runId: "run_3a", seq: 0, start: tb, end: tb + 10_000 }),
        segment({ ...p, hostId: "host_b", runId: "run_3b", seq: 0, start: tb + 5_000, end: tb + 15_000 }),
        segment({ ...p, hostId: "host_a", runId: "run_3a", seq: 1, start: tb + 10_000, end: tb + 20_000 }),
        // another agent at the same time is not an overlap
        segment({ ...p, agentId: "agt_3x", hostId: "host_b", runId: "run_3x", seq: 1, start: tb, end: tb + 20_000 }),
      ];
      expect((await ingest(batch)).accepted).toHaveLength(4);
      expect(await billed(tenantId, agentId, 3)).toEqual(all(20_000));
      expect(await billed(tenantId, "agt_3x", 3)).toEqual(all(20_000));
      const m = await marks(tenantId);
      expect(Object.values(m).reduce((n, x) => n + x.overlapMs, 0)).toBe(10_000);
    });

    it("keeps a redelivered segment idempotent: a duplicate, billed and marked as before", async () => {
      const tenantId = "ten_5";
      const agentId = "agt_5";
      await seedTenant(database.db, tenantId, "UTC", [agentId]);
      const p = { tenantId, agentId, vmId: "vm_5", vcpus: 1, memMiB: 256 };
      const a = segment({ ...p, hostId: "host_a", runId: "run_5a", start: tb, end: tb + 10_000 });
      const b = segment({ ...p, hostId: "host_b", runId: "run_5b", start: tb + 4_000, end: tb + 12_000 });
      await ingest([a, b]);
      expect(await billed(tenantId, agentId, 1)).toEqual(all(12_000));
      const before = await marks(tenantId);
      expect(before[b.id]?.overlapMs).toBe(6_000);
      for (const again of [[b, a], [a], [b]]) {
        const r = await ingest(again);
        expect(r.accepted).toEqual([]);
        expect(r.duplicates.sort()).toEqual(again.map((s) => s.id).sort());
        expect(await billed(tenantId, agentId, 1)).toEqual(all(12_000));
      }
      // a redelivery beside a new segment: the new one is clipped by what the redelivered rows billed
      const c = segment({ ...p, hostId: "host_c", runId: "run_5c", start: tb + 11_000, end: tb + 13_000 });
      const r = await ingest([b, c]);
      expect(r).toEqual({ accepted: [c.id], duplicates: [b.id], rejected: [] });
      expect(await billed(tenantId, agentId, 1)).toEqual(all(13_000));
      expect(await marks(tenantId)).toEqual({ ...before, [c.id]: { overlapMs: 1_000, billed: `{[${tb + 12_000},${tb + 13_000})}` } });
      const [n] = await queryRows<{ n: number }>(database.db, sql`select sum(segments)::int as n from run_usage where agent_id = ${agentId}`);
      expect(n?.n).toBe(3);
    });

    it("says in the run report and its CSV how much of a run was not billed", async () => {
      const tenantId = "ten_6";
      const agentId = "agt_6";
      await seedTenant(database.db, tenantId, "UTC", [agentId]);
      const p = { tenantId, agentId, vmId: "vm_6", vcpus: 1, memMiB: 256 };
      const run = (id: string, hostId: string, wokeAt: number) => ({
        id,
        agentId,
        tenantId,
        hostId,
        vmId: "vm_6",
        wokeAt: new Date(wokeAt),
        wakeReason: "request",
        wakeMode: "restore",
        sleptAt: new Date(wokeAt + 10_000),
        sleepReason: "idle",
      });
      await database.db.insert(runs).values([run("run_6a", "host_a", tb), run("run_6b", "host_b", tb + 9_333)]);
      await ingest([segment({ ...p, hostId: "host_a", runId: "run_6a", start: tb, end: tb + 10_000 })]);
      await ingest([segment({ ...p, hostId: "host_b", runId: "run_6b", start: tb + 9_333, end: tb + 19_333 })]);
      const report = await agentRuns(database.db, tenantId, agentId);
      expect(report.map((r) => [r.runId, r.activeMs, r.overlapMs, r.segments])).toEqual([
        ["run_6b", 10_000 - 667, 667, 1],
        ["run_6a", 10_000, 0, 1],
      ]);
      expect(runJson(report[0]!).overlapMs).toBe(667);
      const [header, firstRow] = runsCsv(report).trim().split(/\r?\n/);
      const col = header?.split(",").indexOf("overlap_ms") ?? -1;
      expect(col).toBeGreaterThan(0);
      expect(firstRow?.split(",")[col]).toBe("667");
    });

    // PGlite is one connection: shipments cannot run at the same moment there
    if (v.postgres)
      it("bills the union when two hosts ship overlapping segments of one agent at the same moment", async () => {
        const tenantId = "ten_4";
        const agentId = "agt_4";
        await seedTenant(database.db, tenantId, "UTC", [agentId]);
        let expected = 0;
        for (let round = 0; round < 6; round++) {
          const start = tb + round * 600_000;
          const p = { tenantId, agentId, vcpus: 2, memMiB: 256, heartbeatMs: 1_000 };
          // host_b picked the agent up 12.5 s into host_a's run and both ran on for a while: 30 s each
          const a = runSegments({ ...p, hostId: "host_a", vmId: "vm_4", runId: `run_4a${round}`, start, durationMs: 30_000, firstSeq: round * 100 });
          const b = runSegments({
            ...p,
            hostId: "host_b",
            vmId: "vm_4",
            runId: `run_4b${round}`,
            start: start + 12_500,
            durationMs: 30_000,
            firstSeq: round * 100,
          });
          const [ra, rb] = await Promise.all([ingest(a), ingest(b)]);
          expect(ra?.accepted).toHaveLength(a.length);
          expect(rb?.accepted).toHaveLength(b.length);
          expected += 42_500;
          expect(await billed(tenantId, agentId, 2)).toEqual(all(expected));
        }
        const [o] = await queryRows<{ o: unknown }>(database.db, sql`select sum(overlap_ms)::int8 as o from meter_segments where agent_id = ${agentId}`);
        expect(Number(o?.o)).toBe(6 * 17_500);
      });
  });
}

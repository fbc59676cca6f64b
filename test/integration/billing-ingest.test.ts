// Ingest against real Postgres (COPY and INSERT paths) and PGlite: idempotent by id, conflicts refused, bad segments rejected, rollups = raw.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { sql } from "drizzle-orm";
import { ingestSegments } from "../../billing/ingest.ts";
import { usageReport } from "../../billing/usage.ts";
import { ManualClock } from "../../lib/clock.ts";
import { openDatabase, queryRows, type Database } from "../../schema/db.ts";
import { freshDatabase } from "../helpers/db.ts";
import { rawTotals, runSegments, segment } from "./billing-fixtures.ts";

const t0 = Date.UTC(2026, 2, 1, 10, 0, 0);
const clock = new ManualClock(Date.UTC(2026, 3, 1));

function shuffle<T>(xs: T[], seed: number): T[] {
  const out = [...xs];
  let s = seed;
  for (let i = out.length - 1; i > 0; i--) {
    s = (s * 1103515245 + 12345) & 0x7fffffff;
    const j = s % (i + 1);
    [out[i], out[j]] = [out[j] as T, out[i] as T];
  }
  return out;
}

async function rollupEqualsRaw(db: Database["db"], tenantId: string, zone: string): Promise<void> {
  const q = { tenantId, from: Date.UTC(2026, 1, 27), to: Date.UTC(2026, 2, 5), zone, byAgent: true, time: "hour" as const };
  const fromRollup = await usageReport(db, q, { source: "rollup" });
  const fromRaw = await usageReport(db, q, { source: "raw" });
  expect(fromRollup.rows).toEqual(fromRaw.rows);
  expect(fromRollup.rows.length).toBeGreaterThan(0);
}

const variants: { name: string; open: () => Promise<Database>; copy: boolean }[] = [
  { name: "Postgres via COPY", open: () => freshDatabase(), copy: true },
  { name: "Postgres via INSERT … ON CONFLICT", open: () => freshDatabase(), copy: false },
  { name: "PGlite", open: () => openDatabase({ pgliteMemory: true }), copy: true },
];

for (const v of variants) {
  describe(`ingest (${v.name})`, () => {
    let database: Database;
    beforeAll(async () => {
      database = await v.open();
    });
    afterAll(async () => {
      await database.close();
    });
    const ingest = (batch: unknown[], hostId?: string) => ingestSegments(database.db, batch, clock, { copy: v.copy, ...(hostId ? { hostId } : {}) });

    it("counts a batch once when it is shipped again, shuffled, and concurrently from two shippers", async () => {
      const runA = runSegments({
        tenantId: "ten_1",
        agentId: "agt_1",
        vmId: "vm_1",
        runId: "run_1",
        start: t0 + 123,
        durationMs: 3 * 3_600_000 + 4_321,
        vcpus: 2,
        memMiB: 512,
      });
      const runB = runSegments({
        tenantId: "ten_1",
        agentId: "agt_2",
        vmId: "vm_2",
        runId: "run_2",
        start: t0 + 7 * 60_000 + 5,
        durationMs: 1_800_000,
        vcpus: 1,
        memMiB: 256,
        heartbeatMs: 7_000,
      });
      const all = [...runA, ...runB];
      const first = await ingest(all.slice(0, 500));
      expect(first.accepted).toHaveLength(500);
      expect(first.duplicates).toEqual([]);
      const again = await ingest(shuffle(all.slice(0, 500), 1));
      expect(again.accepted).toEqual([]);
      expect(again.duplicates).toHaveLength(500);
      // two shippers, overlapping and out of order, at the same time
      const rest = all.slice(400);
      const results = await Promise.all([ingest(shuffle(rest, 2).slice(0, 900)), ingest(shuffle(rest, 3)), ingest(shuffle(all, 4).slice(0, 700))]);
      const accepted = new Set(results.flatMap((r) => r.accepted));
      for (const r of results) expect(r.rejected).toEqual([]);
      expect(accepted.size + 500).toBe(all.length);
      expect(results.reduce((n, r) => n + r.accepted.length, 0)).toBe(all.length - 500);

      const expectedMs = 3 * 3_600_000 + 4_321 + 1_800_000;
      const totals = await rawTotals(database.db, "ten_1");
      expect(totals).toEqual({
        n: all.length,
        activeMs: expectedMs,
        vcpuMs: 2 * (3 * 3_600_000 + 4_321) + 1_800_000,
        mibMs: 512 * (3 * 3_600_000 + 4_321) + 256 * 1_800_000,
      });
      const report = await usageReport(database.db, { tenantId: "ten_1", from: Date.UTC(2026, 2, 1), to: Date.UTC(2026, 2, 2), zone: "UTC", byAgent: false });
      expect(report.source).toBe("rollup");
      expect(report.totals.activeMs).toBe(expectedMs);
      const runRows = await queryRows<{ run_id: string; active_ms: string | number; segments: number }>(
        database.db,
        sql`select run_id, active_ms, segments from run_usage order by run_id`,
      );
      expect(runRows.map((r) => [r.run_id, Number(r.active_ms), Number(r.segments)])).toEqual([
        ["run_1", 3 * 3_600_000 + 4_321, runA.length],
        ["run_2", 1_800_000, runB.length],
      ]);
      await rollupEqualsRaw(database.db, "ten_1", "Asia/Kolkata");
    });

    it("refuses an id reused with a different body, counts the original, and records the conflict", async () => {
      const original = segment({ tenantId: "ten_2", agentId: "agt_9", vmId: "vm_9", seq: 1, start: t0, end: t0 + 10_000 });
      expect((await ingest([original])).accepted).toEqual([original.id]);
      const forged = { ...original, endedAt: new Date(t0 + 20_000).toISOString() };
      const fresh = segment({ tenantId: "ten_2", agentId: "agt_9", vmId: "vm_9", seq: 2, start: t0 + 10_000, end: t0 + 20_000 });
      const r = await ingest([forged, fresh]);
      expect(r.accepted).toEqual([fresh.id]);
      expect(r.rejected).toEqual([{ id: original.id, code: "conflict", message: expect.stringContaining("different body") }]);
      const inBatch = segment({ tenantId: "ten_2", vmId: "vm_9", seq: 3, start: t0 + 20_000, end: t0 + 30_000 });
      const r2 = await ingest([inBatch, { ...inBatch, vcpus: 4 }, inBatch]);
      expect(r2).toEqual({ accepted: [], duplicates: [], rejected: [{ id: inBatch.id, code: "conflict", message: expect.any(String) }] });
      expect((await rawTotals(database.db, "ten_2")).activeMs).toBe(20_000);
      const conflicts = await queryRows<{ segment_id: string }>(database.db, sql`select segment_id from meter_conflicts`);
      expect(conflicts.map((c) => c.segment_id)).toEqual([original.id]);
    });

    it("rejects invalid segments one by one with a clear code and keeps the valid ones", async () => {
      const now = clock.now();
      const ok = segment({ tenantId: "ten_3", vmId: "vm_3", seq: 0, start: t0, end: t0 + 1_000 });
      const bad = [
        { ...segment({ tenantId: "ten_3", vmId: "vm_3", seq: 1, start: t0 + 5_000, end: t0 + 4_000 }) },
        segment({ tenantId: "ten_3", vmId: "vm_3", seq: 2, start: now + 5 * 60_000, end: now + 5 * 60_000 + 1 }),
        segment({ tenantId: "ten_3", vmId: "vm_3", seq: 3, start: t0, end: t0 + 3_600_001 }),
        segment({ tenantId: "ten_3", vmId: "vm_3", seq: 4, start: t0, end: t0 + 1, vcpus: 65 }),
        segment({ tenantId: "ten_3", vmId: "vm_3", seq: 5, start: t0, end: t0 + 1, memMiB: 1_048_577 }),
        { ...segment({ tenantId: "ten_3", vmId: "vm_3", seq: 6, start: t0, end: t0 + 1 }), id: "host_a:vm_3:60" },
        segment({ tenantId: "ten_3", vmId: "vm_3", seq: 7, start: t0, end: t0 }),
        { ...segment({ tenantId: "ten_3", vmId: "vm_3", seq: 8, start: t0, end: t0 + 1 }), startedAt: "yesterday" },
        { ...segment({ tenantId: "ten_3", vmId: "vm_3", seq: 9, start: t0, end: t0 + 1 }), endReason: "tired" },
        "not an object",
      ];
      const r = await ingest([ok, ...bad]);
      expect(r.accepted).toEqual([ok.id]);
      expect(r.rejected.map((x) => x.code)).toEqual([
        "ends_before_start",
        "in_future",
        "too_long",
        "too_many_vcpus",
        "too_much_memory",
        "id_mismatch",
        "empty_segment",
        "invalid_segment",
        "invalid_segment",
        "invalid_segment",
      ]);
      expect(r.rejected[9]?.id).toBe("#10");
      const other = segment({ hostId: "host_b", tenantId: "ten_3", vmId: "vm_3", seq: 10, start: t0, end: t0 + 1 });
      expect((await ingest([other], "host_a")).rejected).toEqual([{ id: other.id, code: "host_mismatch", message: expect.any(String) }]);
      expect((await rawTotals(database.db, "ten_3")).n).toBe(1);
    });

    it("refuses a batch over the size limit as a whole", async () => {
      await expect(ingest(Array.from({ length: 10_001 }, () => ({})))).rejects.toMatchObject({ code: "payload_too_large" });
    });
  });
}

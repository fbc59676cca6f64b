// bench:billing's comparisons: the API's reports and invoices against raw segment scans, and a naive GROUP BY's cost.
import { sql } from "drizzle-orm";
import { invoiceForMonth } from "../../../billing/invoices.ts";
import { rawUsage, usageReport, type UsageRow } from "../../../billing/usage.ts";
import { monthRange } from "../../../billing/zones.ts";
import type { Clock } from "../../../lib/clock.ts";
import { queryRows, type Db } from "../../../schema/db.ts";
import { log, month, zones } from "./fixture.ts";
import type { ReportRows } from "./hosts-protocol.ts";

/** The same month report (by agent and local day) from raw segments, timed `repeats` times, each compared with the API's rows `api`. */
export async function rawReportsMatch(db: Db, api: ReportRows, repeats: number): Promise<{ rawTimings: number[]; identical: boolean }> {
  const rawTimings: number[] = [];
  let identical = true;
  for (let k = 0; k < repeats; k++) {
    const t = performance.now();
    const raws: UsageRow[][] = [];
    for (let i = 0; i < zones.length; i++) {
      const range = monthRange(zones[i]!, month);
      raws.push(
        (await usageReport(db, { tenantId: `ten_${i}`, from: range.start, to: range.end, zone: zones[i]!, byAgent: true, time: "day" }, { source: "raw" }))
          .rows,
      );
    }
    rawTimings.push(performance.now() - t);
    for (let i = 0; i < zones.length; i++) {
      const rows = api[i]!.rows;
      const raw = raws[i]!;
      if (
        rows.length !== raw.length ||
        rows.some((r, j) => r.agentId !== raw[j]!.agentId || r.activeMs !== raw[j]!.activeMs || r.vcpuMs !== raw[j]!.vcpuMs || r.mibMs !== raw[j]!.mibMs)
      ) {
        identical = false;
        log(`report of ten_${i} differs from the raw scan (${rows.length} vs ${raw.length} rows)`);
      }
    }
  }
  return { rawTimings, identical };
}

/** A plain GROUP BY of raw segments by agent and UTC start day (not split at day edges): the naive query's cost, 3 times. */
export async function naiveGroupBy(db: Db, fromUtc: { start: number; end: number }): Promise<number[]> {
  const naive: number[] = [];
  for (let k = 0; k < 3; k++) {
    const t = performance.now();
    await queryRows(
      db,
      sql`select tenant_id, agent_id, date_trunc('day', started_at) as d, sum(extract(epoch from ended_at - started_at) * 1000)::int8, count(*)
      from meter_segments where started_at >= ${new Date(fromUtc.start).toISOString()}::timestamptz and started_at < ${new Date(fromUtc.end).toISOString()}::timestamptz group by 1, 2, 3`,
    );
    naive.push(performance.now() - t);
  }
  return naive;
}

/** Invoices (drafts, cutoff = now) for every tenant over HTTP, `repeats` times: each round's time and the last round's total. */
export async function invoicesOverHttp(base: string, repeats: number): Promise<{ invoiceTimings: number[]; invoiceCents: number }> {
  const invoiceTimings: number[] = [];
  let invoiceCents = 0;
  for (let k = 0; k < repeats; k++) {
    const t = performance.now();
    invoiceCents = 0;
    for (let i = 0; i < zones.length; i++) {
      const res = await fetch(`${base}/v1/invoices?month=${month}`, { headers: { "x-bench-tenant": `ten_${i}` } });
      if (!res.ok) throw new Error(`invoice ${res.status}: ${await res.text()}`);
      invoiceCents += ((await res.json()) as { totalCents: number }).totalCents;
    }
    invoiceTimings.push(performance.now() - t);
  }
  return { invoiceTimings, invoiceCents };
}

/** Each tenant's invoice checked against raw segments received before its cutoff: its vCPU lines, agent by agent. */
export async function invoicesMatchRaw(db: Db, clock: Clock): Promise<boolean> {
  let identical = true;
  for (let i = 0; i < zones.length; i++) {
    const inv = await invoiceForMonth(db, clock, `ten_${i}`, month);
    const range = monthRange(zones[i]!, month);
    const raw = await rawUsage(db, { tenantId: `ten_${i}`, byAgent: true }, [range.start, range.end], { before: inv.cutoffAt });
    const vcpu = new Map(raw.map((w) => [w.agentId, String(w.vcpuMs)]));
    const lines = inv.lines.filter((l) => l.resource === "vcpu");
    if (lines.length !== raw.length || lines.some((l) => vcpu.get(l.agentId) !== l.quantity)) {
      identical = false;
      log(`invoice of ten_${i} differs from the raw scan (${lines.length} vs ${raw.length} vCPU lines)`);
    }
  }
  return identical;
}

// Benchmark: ≥1M meter segments through HTTP ingest into a durable Postgres (fsync, synchronous_commit, full_page_writes on)
// beside a plain COPY of the same rows, then the month's usage report and invoices vs a raw scan.
// Its parts are in bench/billing/: the fixture, the segments, the hosts' thread, the server, the COPY reference, the checks.
import { writeFileSync } from "node:fs";
import { loadavg } from "node:os";
import { sql } from "drizzle-orm";
import { sqlRunner } from "../billing/sql-runner.ts";
import { rollupParts, rollupQuery } from "../billing/usage.ts";
import { monthRange, windowBoundaries } from "../billing/zones.ts";
import { int } from "../lib/env.ts";
import { componentKey } from "../lib/host-token.ts";
import { openDatabase, queryRows } from "../schema/db.ts";
import { invoicesMatchRaw, invoicesOverHttp, naiveGroupBy, rawReportsMatch } from "./bench/billing/checks.ts";
import { copyReference } from "./bench/billing/copy-reference.ts";
import { log, month, secret, seedTenantsAndAgents, targets, zones, type BenchShape } from "./bench/billing/fixture.ts";
import { startHosts, type ReportRows } from "./bench/billing/hosts-protocol.ts";
import { postgresCpuSeconds } from "./bench/billing/postgres-cpu.ts";
import { generate } from "./bench/billing/segments.ts";
import { benchClock, serveBilling } from "./bench/billing/server.ts";
import { median, printResult } from "./bench/figures.ts";
import { startPostgres } from "./postgres-server.ts";

const env = process.env;
const totalSegments = int(env, "BENCH_SEGMENTS", 1_000_000, { min: 1000 });
const agentCount = int(env, "BENCH_AGENTS", 1000, { min: 4 });
const hostCount = int(env, "BENCH_HOSTS", 10, { min: 1 });
const batchSize = int(env, "BENCH_BATCH", 5000, { min: 1, max: 10_000 });
const concurrency = int(env, "BENCH_CONCURRENCY", 4, { min: 1 });
const reportRepeats = int(env, "BENCH_REPEATS", 5, { min: 1 });
// rollup queries one month report runs at once (billing/usage.ts rollupParts); 1: the single query of before
const reportParts = env.BENCH_REPORT_PARTS === undefined ? undefined : int(env, "BENCH_REPORT_PARTS", 2, { min: 1, max: 16 });
const shape: BenchShape = { agents: agentCount, hosts: hostCount, batch: batchSize, concurrency };

async function main(): Promise<void> {
  const wall0 = performance.now();
  const load0 = loadavg()[0]!;
  const pg = await startPostgres({ durable: true });
  // As the URL's own user: the bench ANALYZEs and TRUNCATEs, which the application role may not.
  const database = await openDatabase({ url: pg.url, maxConnections: 8, appRole: "" });
  const db = database.db;
  const key = componentKey(secret);
  try {
    await seedTenantsAndAgents(db, agentCount);

    log(`generating ${totalSegments} segments for ${agentCount} agents on ${hostCount} hosts (in the client thread)`);
    const clock = benchClock(Date.UTC(2026, 10, 2));
    const server = await serveBilling({ db, clock, componentKey: key, reportParts });
    const base = server.base;
    // the hosts: a worker thread with its own event loop, as hosts are other machines
    const { ask } = startHosts({ base, shape });
    const oct = monthRange("UTC", month);
    const ready = await ask({ type: "prepare", start: oct.start, end: oct.end, count: totalSegments, seqBase: 0 });
    const segments = ready.segments;
    const expectedMs = ready.expectedMs;

    // the same rows (the generator is deterministic), COPYed into the same table first, then removed
    const settings = await queryRows<{ name: string; setting: string }>(
      db,
      sql`select name, setting from pg_settings where name in ('fsync', 'synchronous_commit', 'full_page_writes', 'wal_sync_method') order by name`,
    );
    const postgresSettings = Object.fromEntries(settings.map((r) => [r.name, r.setting]));
    if (postgresSettings.fsync !== "on" || postgresSettings.synchronous_commit !== "on" || postgresSettings.full_page_writes !== "on")
      throw new Error(`Postgres is not durable: ${JSON.stringify(postgresSettings)}`);
    const copy = await copyReference(pg.url, generate(shape, oct.start, oct.end, totalSegments, 0).byHost, new Date(clock.now()).toISOString());
    if (copy.rows !== segments) throw new Error(`COPY had ${copy.rows} rows, the hosts ${segments}`);
    log(`COPY of the same ${copy.rows} rows: ${Math.round(copy.rows / (copy.ms / 1000))}/s (${Math.round(copy.ms)} ms)`);

    const fromUtc = monthRange("UTC", month);
    // reports are asked for by a client in the worker thread too: its JSON parsing is not the server's work
    const perTenantMs: number[] = [];
    const reportAll = async (withRows = false) => {
      const r = await ask({ type: "report", withRows });
      if (r.error) throw new Error(r.error);
      perTenantMs.push(...(r.perTenant ?? []));
      return { ms: r.ms ?? 0, out: r.out ?? [], clientCpuUs: r.cpuUs };
    };
    const rollupRows = async () => (await queryRows<{ n: number }>(db, sql`select count(*)::int as n from usage_quarter_hours`))[0]?.n ?? 0;

    // ingest in four quarters; after each, time the full month report (it must not grow with the segments)
    const reportByFill: { segments: number; rollup_rows: number; report_ms: number }[] = [];
    let ingestMs = 0;
    let nodeCpuUs = 0;
    let clientCpuUs = 0;
    let pgCpuS = 0;
    let accepted = 0;
    let sent = 0;
    for (let quarter = 1; quarter <= 4; quarter++) {
      const t = performance.now();
      const cpu0 = process.cpuUsage();
      const pg0 = postgresCpuSeconds();
      const r = await ask({ type: "send", quarter });
      if (r.error) throw new Error(r.error);
      ingestMs += performance.now() - t;
      const cpu = process.cpuUsage(cpu0);
      nodeCpuUs += cpu.user + cpu.system;
      clientCpuUs += r.cpuUs;
      pgCpuS += postgresCpuSeconds() - pg0;
      accepted += r.accepted;
      sent += r.sent;
      await db.execute(sql`ANALYZE usage_quarter_hours`); // fresh planner statistics, as autovacuum keeps them
      const rs = [];
      for (let k = 0; k < 3; k++) rs.push((await reportAll()).ms);
      reportByFill.push({ segments: sent, rollup_rows: await rollupRows(), report_ms: Math.round(median(rs)) });
      log(`quarter ${quarter}: ${sent} segments, ${Math.round(sent / (ingestMs / 1000))}/s so far, month report ${Math.round(median(rs))} ms`);
    }
    if (accepted !== segments) throw new Error(`accepted ${accepted} of ${segments}`);

    const [counts] = await queryRows<{ n: number; ms: string }>(
      db,
      sql`select count(*)::int as n, sum(extract(epoch from ended_at - started_at) * 1000)::int8::text as ms from meter_segments`,
    );
    if (counts?.n !== segments || Number(counts.ms) !== expectedMs)
      throw new Error(`stored ${counts?.n} segments / ${counts?.ms} ms, expected ${segments} / ${expectedMs}`);

    // the month report by agent and day: rollups over HTTP, timed; then the same report from raw segments
    const timings: number[] = [];
    perTenantMs.length = 0;
    let last: ReportRows = [];
    // CPU the reports cost (what a quiet machine's latency would be bounded by): the server thread and Postgres
    const reportCpu0 = process.cpuUsage();
    const reportPg0 = postgresCpuSeconds();
    let reportClientCpuUs = 0;
    // BENCH_PROFILE=file.cpuprofile: a CPU profile of the billing thread over the timed reports (for chrome://inspect)
    const profiler = env.BENCH_PROFILE ? new (await import("node:inspector/promises")).Session() : undefined;
    if (profiler) {
      profiler.connect();
      await profiler.post("Profiler.enable");
      await profiler.post("Profiler.start");
    }
    for (let k = 0; k < reportRepeats; k++) {
      const r = await reportAll(k === reportRepeats - 1);
      timings.push(r.ms);
      reportClientCpuUs += r.clientCpuUs;
      last = r.out;
    }
    const reportCpuUs = process.cpuUsage(reportCpu0);
    if (profiler) {
      const { profile } = await profiler.post("Profiler.stop");
      writeFileSync(env.BENCH_PROFILE!, JSON.stringify(profile));
      profiler.disconnect();
      log(`CPU profile of the timed reports: ${env.BENCH_PROFILE}`);
    }
    const reportCpuMs = {
      billing: Math.round((reportCpuUs.user + reportCpuUs.system - reportClientCpuUs) / 1000 / reportRepeats),
      postgres: Math.round(((postgresCpuSeconds() - reportPg0) * 1000) / reportRepeats),
    };
    const singleTenantMs = median(perTenantMs);
    const { rawTimings, identical: reportsIdentical } = await rawReportsMatch(db, last, Math.min(3, reportRepeats));
    const naive = await naiveGroupBy(db, fromUtc);
    // invoices (drafts, cutoff = now) for every tenant over HTTP, checked against raw segments received before the cutoff
    const { invoiceTimings, invoiceCents } = await invoicesOverHttp(base, reportRepeats);
    const invoicesIdentical = await invoicesMatchRaw(db, clock);
    const identical = reportsIdentical && invoicesIdentical;

    // more segments, of another month: October's report must not slow down (it reads October's rollup rows only)
    const sep = monthRange("UTC", "2026-09");
    const more = Math.round(totalSegments / 2);
    await ask({ type: "prepare", start: sep.start, end: sep.end, count: more, seqBase: 1_000_000 });
    const sentMore = await ask({ type: "send", quarter: 4 });
    if (sentMore.error) throw new Error(sentMore.error);
    await db.execute(sql`ANALYZE usage_quarter_hours`);
    const after: number[] = [];
    for (let k = 0; k < reportRepeats; k++) after.push((await reportAll()).ms);
    await ask({ type: "exit" });
    if (env.BENCH_EXPLAIN) {
      // the report's own query (billing/usage.ts rollupQuery), for one tenant
      const range = monthRange(zones[1]!, month);
      const { text, params } = rollupQuery({ tenantId: "ten_1", byAgent: true }, windowBoundaries(zones[1]!, range.start, range.end, "day"));
      const plan = await sqlRunner(db).query<Record<string, string>>(`EXPLAIN ANALYZE ${text}`, params);
      log(plan.map((r) => Object.values(r)[0]).join("\n"));
    }
    const afterOtherMonth = { segments: segments + sentMore.sent, rollup_rows: await rollupRows(), report_ms: Math.round(median(after)) };
    log(`after ${sentMore.sent} more segments in September: October report ${afterOtherMonth.report_ms} ms`);
    server.close();

    // COPY once more at the end (into the emptied table): on a shared machine the load moves, and the ratio should
    // not hang on the moment of one measurement
    const copyAgain = await copyReference(pg.url, generate(shape, oct.start, oct.end, totalSegments, 0).byHost, new Date(clock.now()).toISOString());
    log(`COPY again: ${Math.round(copyAgain.rows / (copyAgain.ms / 1000))}/s`);

    const ingestPerS = segments / (ingestMs / 1000);
    // both COPYs: rows over their summed time
    const copyPerS = (copy.rows + copyAgain.rows) / ((copy.ms + copyAgain.ms) / 1000);
    const reportMs = Math.round(median(timings));
    const result = {
      segments,
      postgres: postgresSettings,
      ingest_per_s: Math.round(ingestPerS),
      copy_per_s: Math.round(copyPerS),
      copy_per_s_runs: [copy, copyAgain].map((c) => Math.round(c.rows / (c.ms / 1000))),
      ingest_vs_copy: Number((ingestPerS / copyPerS).toFixed(3)),
      // cpuUsage is per process: "billing" is the whole process (server thread + client thread), "hosts" the client thread alone
      ingest_cpu_us_per_segment: {
        billing: Number(((nodeCpuUs - clientCpuUs) / segments).toFixed(2)),
        hosts: Number((clientCpuUs / segments).toFixed(2)),
        postgres: Number(((pgCpuS * 1e6) / segments).toFixed(2)),
      },
      // the month's usage report by agent and local day of all four tenants (one HTTP call each, in sequence)
      report_ms: reportMs,
      report_ms_per_tenant: Math.round(singleTenantMs),
      // rollup queries each tenant's report ran at once (BENCH_REPORT_PARTS; 1 is the single query of before)
      report_parts: reportParts ?? rollupParts.max,
      // CPU ms one month report (4 tenants) used: the gateway's server thread (JSON, zones) and Postgres (the query)
      report_cpu_ms: reportCpuMs,
      invoice_ms: Math.round(median(invoiceTimings)),
      raw_report_ms: Math.round(median(rawTimings)),
      naive_group_by_ms: Math.round(median(naive)),
      report_ms_by_fill: reportByFill,
      report_ms_after_other_month: afterOtherMonth,
      identical,
      agents: agentCount,
      tenants: zones.length,
      hosts: hostCount,
      batch: batchSize,
      concurrency,
      invoice_total_cents: invoiceCents,
      targets: { ingest_vs_copy: targets.ingestVsCopy, report_ms: targets.reportMs },
      meets_targets: { ingest_vs_copy: ingestPerS / copyPerS >= targets.ingestVsCopy, report_ms: reportMs < targets.reportMs },
      wall_s: Math.round((performance.now() - wall0) / 1000),
      // the machine's 1-minute load average at the start and the end (other processes share the cores)
      load: [load0, loadavg()[0]!].map((l) => Number(l.toFixed(1))),
    };
    printResult(result);
    if (!identical) process.exitCode = 1;
  } finally {
    await database.close();
    await pg.stop();
  }
}

await main();

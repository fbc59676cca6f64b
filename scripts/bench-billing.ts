// Benchmark: ≥1M meter segments through HTTP ingest into a durable Postgres (fsync, synchronous_commit, full_page_writes on)
// beside a plain COPY of the same rows, then the month's usage report and invoices vs a raw scan.
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { loadavg } from "node:os";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { isMainThread, parentPort, Worker, workerData } from "node:worker_threads";
import { serve } from "@hono/node-server";
import { Hono } from "hono";
import postgres from "postgres";
import { sql } from "drizzle-orm";
import { createBillingRoutes } from "../billing/routes.ts";
import { invoiceForMonth } from "../billing/invoices.ts";
import { sqlRunner } from "../billing/sql-runner.ts";
import { rawUsage, rollupParts, rollupQuery, usageReport, type UsageRow } from "../billing/usage.ts";
import { monthRange, windowBoundaries } from "../billing/zones.ts";
import type { MeterSegment } from "../contracts/meter.ts";
import { allScopes, type GatewayEnv } from "../contracts/caller.ts";
import { systemClock, type Clock } from "../lib/clock.ts";
import { int } from "../lib/env.ts";
import { toErrorResponse } from "../lib/errors.ts";
import { componentKey, signComponentToken } from "../lib/host-token.ts";
import { silentLogger } from "../lib/log.ts";
import { agents, tenants } from "../schema/core.ts";
import { openDatabase, queryRows } from "../schema/db.ts";
import { freePort, startPostgres } from "./postgres-server.ts";

const env = process.env;
const totalSegments = int(env, "BENCH_SEGMENTS", 1_000_000, { min: 1000 });
const agentCount = int(env, "BENCH_AGENTS", 1000, { min: 4 });
const hostCount = int(env, "BENCH_HOSTS", 10, { min: 1 });
const batchSize = int(env, "BENCH_BATCH", 5000, { min: 1, max: 10_000 });
const concurrency = int(env, "BENCH_CONCURRENCY", 4, { min: 1 });
const reportRepeats = int(env, "BENCH_REPEATS", 5, { min: 1 });
// rollup queries one month report runs at once (billing/usage.ts rollupParts); 1: the single query of before
const reportParts = env.BENCH_REPORT_PARTS === undefined ? undefined : int(env, "BENCH_REPORT_PARTS", 2, { min: 1, max: 16 });

const month = "2026-10";
const zones = ["UTC", "America/New_York", "Europe/Berlin", "Asia/Kolkata"] as const;
const secret = "bench-component-secret-0123456789abcdef";
const log = (msg: string) => console.error(`[bench-billing] ${msg}`);

function lcg(seed: number): (n: number) => number {
  let s = seed;
  return (n) => {
    s = (s * 1103515245 + 12345) & 0x7fffffff;
    return s % n;
  };
}

/** Each agent wakes, runs a few minutes in 10 s heartbeat segments, sleeps, over the month: as meters cut it. */
function generate(monthStart: number, monthEnd: number, count: number, seqBase: number): { byHost: MeterSegment[][]; expectedMs: number } {
  const rnd = lcg(7);
  const byHost: MeterSegment[][] = Array.from({ length: hostCount }, () => []);
  const perAgent = Math.ceil(count / agentCount);
  const tag = new Date(monthStart + 86_400_000).toISOString().slice(2, 7).replace("-", "");
  const span = monthEnd - monthStart - 86_400_000; // the last day stays free: no segment runs past the month
  let expectedMs = 0;
  let made = 0;
  for (let a = 0; a < agentCount && made < count; a++) {
    const hostId = `host_${String(a % hostCount).padStart(4, "0")}`;
    const vmId = `vm_${String(a).padStart(6, "0")}`;
    const agentId = `agt_${String(a).padStart(6, "0")}`;
    const tenantId = `ten_${a % zones.length}`;
    // runs of 5–54 heartbeat segments, spread evenly over the month with a random start in each slot
    const lengths: number[] = [];
    for (let left = Math.min(perAgent, count - made); left > 0; ) {
      const n = Math.min(left, 5 + rnd(50));
      lengths.push(n);
      left -= n;
    }
    const slot = Math.floor(span / lengths.length);
    let seq = seqBase;
    lengths.forEach((n, run) => {
      let t = monthStart + run * slot + rnd(Math.max(1, slot - n * 10_000));
      const runId = `run_${agentId.slice(4)}_${tag}_${run}`;
      const wake = (["request", "webhook", "api"] as const)[rnd(3)]!;
      for (let i = 0; i < n; i++) {
        const dur = i === n - 1 ? 1 + rnd(10_000) : 10_000;
        byHost[a % hostCount]!.push({
          id: `${hostId}:${vmId}:${seq}`,
          hostId,
          vmId,
          seq: seq++,
          tenantId,
          agentId,
          runId,
          startedAt: new Date(t).toISOString(),
          endedAt: new Date(t + dur).toISOString(),
          vcpus: 1 + (a % 4),
          memMiB: 256 * (1 + (a % 8)),
          startReason: i === 0 ? wake : "heartbeat",
          endReason: i === n - 1 ? "idle" : "heartbeat",
        });
        expectedMs += dur;
        t += dur;
      }
      made += n;
    });
  }
  // a host ships its segments in the order it closed them
  for (const segs of byHost) segs.sort((x, y) => (x.endedAt < y.endedAt ? -1 : x.endedAt > y.endedAt ? 1 : 0));
  return { byHost, expectedMs };
}

/** Billing's clock in the bench: real time, started just after the benchmarked month ends (so drafts count everything). */
function benchClock(startWall: number): Clock {
  const mono0 = performance.now();
  return { now: () => startWall + Math.round(performance.now() - mono0), monotonic: () => performance.now(), setTimeout: systemClock.setTimeout };
}

/** CPU seconds used so far by the Postgres server this process started (postmaster, live backends, reaped children). */
function postgresCpuSeconds(): number {
  const stats = new Map<number, { ppid: number; comm: string; own: number; children: number }>();
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const raw = readFileSync(`/proc/${d}/stat`, "utf8");
      const comm = raw.slice(raw.indexOf("(") + 1, raw.lastIndexOf(")"));
      const f = raw.slice(raw.lastIndexOf(")") + 2).split(" ");
      stats.set(Number(d), { ppid: Number(f[1]), comm, own: Number(f[11]) + Number(f[12]), children: Number(f[13]) + Number(f[14]) });
    } catch {
      /* the process ended meanwhile */
    }
  }
  let ticks = 0;
  for (const [pid, s] of stats) {
    if (s.ppid !== process.pid || s.comm !== "postgres") continue;
    ticks += s.own + s.children;
    for (const c of stats.values()) if (c.ppid === pid) ticks += c.own;
  }
  return ticks / 100;
}

/** Targets of issue 15: our ingest at least half as fast as COPY, the month's report under 100 ms with 1 M segments. */
const targets = { ingestVsCopy: 0.5, reportMs: 100 } as const;

const copyColumns = "id, tenant_id, agent_id, run_id, started_at, ended_at, vcpus, mem_mib, start_reason, end_reason, received_at";

/** The segments as COPY text rows (tab-separated; nothing here needs escaping), in chunks of `rows` rows. */
function copyChunks(byHost: MeterSegment[][], receivedAt: string, rows = 10_000): string[] {
  const chunks: string[] = [];
  let chunk = "";
  let n = 0;
  for (const segs of byHost) {
    for (const s of segs) {
      chunk += `${s.id}\t${s.tenantId}\t${s.agentId}\t${s.runId}\t${s.startedAt}\t${s.endedAt}\t${s.vcpus}\t${s.memMiB}\t${s.startReason}\t${s.endReason}\t${receivedAt}\n`;
      if (++n % rows === 0) {
        chunks.push(chunk);
        chunk = "";
      }
    }
  }
  if (chunk) chunks.push(chunk);
  return chunks;
}

/**
 * The reference: the same rows in one `COPY meter_segments … FROM STDIN` (one statement, one commit), timed from the
 * first byte to the commit, into the emptied table; then it is emptied again for our ingest. Both start after a CHECKPOINT.
 */
async function copyReference(url: string, byHost: MeterSegment[][], receivedAt: string): Promise<{ rows: number; ms: number }> {
  // the server's own superuser (the app's pool runs as a role that may not TRUNCATE)
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  try {
    const chunks = copyChunks(byHost, receivedAt);
    const rows = byHost.reduce((t, segs) => t + segs.length, 0);
    await sql`TRUNCATE meter_segments`;
    await sql`CHECKPOINT`;
    const t = performance.now();
    const writable = await sql.unsafe(`COPY meter_segments (${copyColumns}) FROM STDIN`).writable();
    await pipeline(Readable.from(chunks), writable);
    const ms = performance.now() - t;
    const [stored] = await sql<{ n: number }[]>`select count(*)::int as n from meter_segments`;
    if (stored?.n !== rows) throw new Error(`COPY stored ${stored?.n} of ${rows} rows`);
    await sql`TRUNCATE meter_segments`;
    await sql`CHECKPOINT`;
    return { rows, ms };
  } finally {
    await sql.end();
  }
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

async function main(): Promise<void> {
  const wall0 = performance.now();
  const load0 = loadavg()[0]!;
  const pg = await startPostgres({ durable: true });
  // As the URL's own user: the bench ANALYZEs and TRUNCATEs, which the application role may not.
  const database = await openDatabase({ url: pg.url, maxConnections: 8, appRole: "" });
  const db = database.db;
  const key = componentKey(secret);
  try {
    for (let i = 0; i < zones.length; i++) await db.insert(tenants).values({ id: `ten_${i}`, name: `tenant ${i}`, timeZone: zones[i]! });
    for (let a = 0; a < agentCount; a += 500) {
      await db.insert(agents).values(
        Array.from({ length: Math.min(500, agentCount - a) }, (_, k) => ({ id: `agt_${String(a + k).padStart(6, "0")}`, tenantId: `ten_${(a + k) % zones.length}`, name: `agent ${a + k}`, image: "demo" })),
      );
    }

    log(`generating ${totalSegments} segments for ${agentCount} agents on ${hostCount} hosts (in the client thread)`);
    const clock = benchClock(Date.UTC(2026, 10, 2));
    const routes = createBillingRoutes({ db, clock, log: silentLogger, componentKey: key, ...(reportParts === undefined ? {} : { usageParts: reportParts }) });
    const app = new Hono<GatewayEnv>();
    app.use(async (c, next) => {
      c.set("requestId", "req_bench");
      const tenant = c.req.header("x-bench-tenant");
      c.set("caller", tenant ? { tenantId: tenant, subject: "bench", scopes: new Set(allScopes) } : undefined);
      await next();
    });
    app.onError((e, c) => toErrorResponse(e, c.get("requestId") ?? "req_bench"));
    app.route("/", routes);
    const port = await freePort();
    const server = serve({ fetch: app.fetch, port, hostname: "127.0.0.1" });
    const base = `http://127.0.0.1:${port}`;
    // the hosts: a worker thread with its own event loop, as hosts are other machines
    const client = new Worker(new URL(import.meta.url), { workerData: { base } });
    const replies: ((m: ClientReply) => void)[] = [];
    client.on("message", (m: ClientReply) => replies.shift()?.(m));
    client.on("error", (e) => {
      throw e;
    });
    const ask = (m: ClientCommand) =>
      new Promise<ClientReply>((resolve) => {
        replies.push(resolve);
        client.postMessage(m);
      });
    const oct = monthRange("UTC", month);
    const ready = await ask({ type: "prepare", start: oct.start, end: oct.end, count: totalSegments, seqBase: 0 });
    const segments = ready.segments;
    const expectedMs = ready.expectedMs;

    // the same rows (the generator is deterministic), COPYed into the same table first, then removed
    const settings = await queryRows<{ name: string; setting: string }>(db, sql`select name, setting from pg_settings where name in ('fsync', 'synchronous_commit', 'full_page_writes', 'wal_sync_method') order by name`);
    const postgresSettings = Object.fromEntries(settings.map((r) => [r.name, r.setting]));
    if (postgresSettings.fsync !== "on" || postgresSettings.synchronous_commit !== "on" || postgresSettings.full_page_writes !== "on") throw new Error(`Postgres is not durable: ${JSON.stringify(postgresSettings)}`);
    const copy = await copyReference(pg.url, generate(oct.start, oct.end, totalSegments, 0).byHost, new Date(clock.now()).toISOString());
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

    const [counts] = await queryRows<{ n: number; ms: string }>(db, sql`select count(*)::int as n, sum(extract(epoch from ended_at - started_at) * 1000)::int8::text as ms from meter_segments`);
    if (counts?.n !== segments || Number(counts.ms) !== expectedMs) throw new Error(`stored ${counts?.n} segments / ${counts?.ms} ms, expected ${segments} / ${expectedMs}`);

    // the month report by agent and day: rollups over HTTP, timed; then the same report from raw segments
    const timings: number[] = [];
    perTenantMs.length = 0;
    let last: Awaited<ReturnType<typeof reportAll>>["out"] = [];
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
    const rawTimings: number[] = [];
    let identical = true;
    for (let k = 0; k < Math.min(3, reportRepeats); k++) {
      const t = performance.now();
      const raws: UsageRow[][] = [];
      for (let i = 0; i < zones.length; i++) {
        const range = monthRange(zones[i]!, month);
        raws.push((await usageReport(db, { tenantId: `ten_${i}`, from: range.start, to: range.end, zone: zones[i]!, byAgent: true, time: "day" }, { source: "raw" })).rows);
      }
      rawTimings.push(performance.now() - t);
      for (let i = 0; i < zones.length; i++) {
        const api = last[i]!.rows;
        const raw = raws[i]!;
        if (api.length !== raw.length || api.some((r, j) => r.agentId !== raw[j]!.agentId || r.activeMs !== raw[j]!.activeMs || r.vcpuMs !== raw[j]!.vcpuMs || r.mibMs !== raw[j]!.mibMs)) {
          identical = false;
          log(`report of ten_${i} differs from the raw scan (${api.length} vs ${raw.length} rows)`);
        }
      }
    }

    // a plain GROUP BY of raw segments by agent and UTC start day (not split at day edges): the naive query's cost
    const naive: number[] = [];
    for (let k = 0; k < 3; k++) {
      const t = performance.now();
      await queryRows(db, sql`select tenant_id, agent_id, date_trunc('day', started_at) as d, sum(extract(epoch from ended_at - started_at) * 1000)::int8, count(*)
        from meter_segments where started_at >= ${new Date(fromUtc.start).toISOString()}::timestamptz and started_at < ${new Date(fromUtc.end).toISOString()}::timestamptz group by 1, 2, 3`);
      naive.push(performance.now() - t);
    }

    // invoices (drafts, cutoff = now) for every tenant over HTTP, checked against raw segments received before the cutoff
    const invoiceTimings: number[] = [];
    let invoiceCents = 0;
    for (let k = 0; k < reportRepeats; k++) {
      const t = performance.now();
      invoiceCents = 0;
      for (let i = 0; i < zones.length; i++) {
        const res = await fetch(`${base}/v1/invoices?month=${month}`, { headers: { "x-bench-tenant": `ten_${i}` } });
        if (!res.ok) throw new Error(`invoice ${res.status}: ${await res.text()}`);
        invoiceCents += ((await res.json()) as { totalCents: number }).totalCents;
      }
      invoiceTimings.push(performance.now() - t);
    }
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
    const copyAgain = await copyReference(pg.url, generate(oct.start, oct.end, totalSegments, 0).byHost, new Date(clock.now()).toISOString());
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
      ingest_cpu_us_per_segment: { billing: Number(((nodeCpuUs - clientCpuUs) / segments).toFixed(2)), hosts: Number((clientCpuUs / segments).toFixed(2)), postgres: Number(((pgCpuS * 1e6) / segments).toFixed(2)) },
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
    console.log(`RESULT ${JSON.stringify(result)}`);
    if (!identical) process.exitCode = 1;
  } finally {
    await database.close();
    await pg.stop();
  }
}

type ClientCommand =
  | { type: "prepare"; start: number; end: number; count: number; seqBase: number }
  | { type: "send"; quarter: number }
  | { type: "report"; withRows: boolean }
  | { type: "exit" };
type ReportRows = { rows: { agentId: string; start: string; activeMs: number; vcpuMs: number; mibMs: number }[] }[];
interface ClientReply {
  segments: number;
  expectedMs: number;
  accepted: number;
  sent: number;
  cpuUs: number;
  /** report: all tenants' time, each tenant's, and (when asked) the rows */
  ms?: number;
  perTenant?: number[];
  out?: ReportRows;
  error?: string;
}

/** The hosts: generate and serialize every batch up front, then POST them with `concurrency` requests in flight. */
async function hosts(base: string): Promise<void> {
  const key = componentKey(secret);
  let batches: { hostId: string; body: string; n: number }[] = [];
  let expectedMs = 0;
  let next = 0;
  const tokens = new Map<string, { value: string; at: number }>();
  const token = async (hostId: string) => {
    const t = tokens.get(hostId);
    if (t && Date.now() - t.at < 30_000) return t.value;
    const value = await signComponentToken(key, { sub: hostId, aud: "billing" });
    tokens.set(hostId, { value, at: Date.now() });
    return value;
  };
  const reply = (r: Partial<ClientReply>) => parentPort!.postMessage({ segments: 0, expectedMs: 0, accepted: 0, sent: 0, cpuUs: 0, ...r });
  parentPort!.on("message", async (m: ClientCommand) => {
    if (m.type === "exit") {
      reply({});
      parentPort!.close();
      return;
    }
    if (m.type === "report") {
      try {
        const t = performance.now();
        const cpu0 = process.threadCpuUsage();
        const perTenant: number[] = [];
        const out: ReportRows = [];
        for (let i = 0; i < zones.length; i++) {
          const ti = performance.now();
          const res = await fetch(`${base}/v1/usage?from=${month}-01&to=2026-11-01&tz=${encodeURIComponent(zones[i]!)}&groupBy=agent,day`, { headers: { "x-bench-tenant": `ten_${i}` } });
          if (!res.ok) throw new Error(`usage ${res.status}: ${await res.text()}`);
          out.push((await res.json()) as ReportRows[number]);
          perTenant.push(performance.now() - ti);
        }
        const cpu = process.threadCpuUsage(cpu0);
        reply({ ms: performance.now() - t, perTenant, cpuUs: cpu.user + cpu.system, ...(m.withRows ? { out } : {}) });
      } catch (err) {
        reply({ error: String(err) });
      }
      return;
    }
    if (m.type === "prepare") {
      const g = generate(m.start, m.end, m.count, m.seqBase);
      batches = [];
      next = 0;
      expectedMs = g.expectedMs;
      // batches in the order hosts send them, hosts interleaved
      const perHost = g.byHost.map((segs) => {
        const out: { hostId: string; body: string; n: number }[] = [];
        for (let i = 0; i < segs.length; i += batchSize) {
          const slice = segs.slice(i, i + batchSize);
          out.push({ hostId: slice[0]!.hostId, body: JSON.stringify({ segments: slice }), n: slice.length });
        }
        return out;
      });
      for (let i = 0; perHost.some((b) => i < b.length); i++) for (const b of perHost) if (b[i]) batches.push(b[i]!);
      reply({ segments: batches.reduce((t, b) => t + b.n, 0), expectedMs });
      return;
    }
    const until = Math.ceil((batches.length * m.quarter) / 4);
    const cpu0 = process.threadCpuUsage(); // this thread only (process.cpuUsage counts every thread)
    let accepted = 0;
    let sent = 0;
    try {
      await Promise.all(
        Array.from({ length: concurrency }, async () => {
          for (;;) {
            const i = next++;
            if (i >= until) return;
            const b = batches[i]!;
            const res = await fetch(`${base}/v1/meter-segments`, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${await token(b.hostId)}` }, body: b.body });
            const body = (await res.json()) as { accepted: string[]; rejected: unknown[] };
            if (!res.ok || body.rejected.length > 0) throw new Error(`ingest ${res.status}: ${JSON.stringify(body.rejected ?? body).slice(0, 500)}`);
            accepted += body.accepted.length;
            sent += b.n;
          }
        }),
      );
      next = until;
      const cpu = process.threadCpuUsage(cpu0);
      reply({ accepted, sent, cpuUs: cpu.user + cpu.system });
    } catch (err) {
      reply({ error: String(err) });
    }
  });
}

if (isMainThread) await main();
else await hosts((workerData as { base: string }).base);

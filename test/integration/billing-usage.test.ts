// Usage on real Postgres: rollups equal raw segments in every zone and grouping; the HTTP API's scoping, auth, JSON and CSV.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ingestSegments } from "../../billing/ingest.ts";
import { createBillingRoutes } from "../../billing/routes.ts";
import { splitIntoWindows } from "../../billing/buckets.ts";
import { usageJson } from "../../billing/report-views.ts";
import { partCuts, usageReport, usageTable, windowsOf, type UsageQuery } from "../../billing/usage.ts";
import type { MeterSegment } from "../../contracts/meter.ts";
import { ManualClock } from "../../lib/clock.ts";
import { componentKey, signComponentToken } from "../../lib/host-token.ts";
import { silentLogger } from "../../lib/log.ts";
import { sql } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { usageQuarterHours } from "../../schema/billing.ts";
import { runs } from "../../schema/core.ts";
import type { Database } from "../../schema/db.ts";
import { freshDatabase } from "../helpers/db.ts";
import { appWithCaller, rawTotals, runSegments, seedTenant, segment } from "./billing-fixtures.ts";

const zones = ["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kolkata"] as const;
const hour = 3_600_000;
const key = componentKey("a-component-secret-of-at-least-32-chars!");
const clock = new ManualClock(Date.UTC(2026, 11, 1));

/** Deterministic runs of three agents around the 2026 DST changes of the four zones. */
function workload(): MeterSegment[] {
  let seed = 42;
  const rnd = (n: number) => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    return seed % n;
  };
  const around = [
    Date.UTC(2026, 2, 8, 7),
    Date.UTC(2026, 2, 29, 1),
    Date.UTC(2026, 3, 4, 15),
    Date.UTC(2026, 9, 3, 15, 30),
    Date.UTC(2026, 9, 25, 1),
    Date.UTC(2026, 10, 1, 6),
  ];
  const out: MeterSegment[] = [];
  let seq = 0;
  for (const t of around) {
    for (const agent of ["agt_u1", "agt_u2", "agt_u3"]) {
      let start = t - 30 * hour + rnd(3 * hour);
      for (let r = 0; r < 12; r++) {
        const durationMs = 1 + rnd(2 * hour);
        const segs = runSegments({
          tenantId: "ten_u",
          agentId: agent,
          vmId: `vm_${agent}`,
          runId: `run_${agent}_${seq}`,
          start,
          durationMs,
          firstSeq: seq,
          heartbeatMs: 10_000 + rnd(5000),
          vcpus: 1 + rnd(4),
          memMiB: 128 * (1 + rnd(8)),
        });
        seq += segs.length;
        out.push(...segs);
        start += durationMs + rnd(6 * hour);
      }
    }
  }
  return out;
}

describe("usage", () => {
  let database: Database & { url: string };
  let segs: MeterSegment[];
  beforeAll(async () => {
    database = await freshDatabase();
    await seedTenant(database.db, "ten_u", "Asia/Kolkata", ["agt_u1", "agt_u2", "agt_u3"]);
    await seedTenant(database.db, "ten_o", "UTC", ["agt_o1"]);
    segs = workload();
    for (let i = 0; i < segs.length; i += 2000) await ingestSegments(database.db, segs.slice(i, i + 2000), clock);
    await ingestSegments(
      database.db,
      [segment({ tenantId: "ten_o", agentId: "agt_o1", vmId: "vm_o", hostId: "host_o", start: Date.UTC(2026, 2, 8, 12), end: Date.UTC(2026, 2, 8, 12, 30) })],
      clock,
    );
  });
  afterAll(async () => {
    await database.close();
  });

  it("gives the same numbers from rollups as from raw segments, for every zone, hour and day, by agent or not", async () => {
    const total = await rawTotals(database.db, "ten_u");
    expect(total.n).toBe(segs.length);
    for (const zone of zones) {
      for (const time of ["hour", "day"] as const) {
        for (const byAgent of [true, false]) {
          const q: UsageQuery = { tenantId: "ten_u", from: Date.UTC(2026, 2, 1), to: Date.UTC(2026, 10, 10), zone, byAgent, time };
          if (time === "hour") q.to = Date.UTC(2026, 4, 20);
          const rollup = await usageReport(database.db, q);
          expect(rollup.source).toBe("rollup");
          const raw = await usageReport(database.db, q, { source: "raw" });
          expect(rollup.rows).toEqual(raw.rows);
          // and both equal splitting the segments in JS
          const b = windowsOf(q);
          let expected = 0;
          for (const s of segs) for (const p of splitIntoWindows(Date.parse(s.startedAt), Date.parse(s.endedAt), b)) expected += p.ms;
          expect(rollup.totals.activeMs).toBe(expected);
        }
      }
    }
    const all = await usageReport(database.db, {
      tenantId: "ten_u",
      from: Date.UTC(2026, 0, 1),
      to: Date.UTC(2027, 0, 1),
      zone: "Australia/Lord_Howe",
      byAgent: true,
      time: "day",
    });
    expect(all.totals).toEqual({
      activeMs: total.activeMs,
      vcpuMs: total.vcpuMs,
      mibMs: total.mibMs,
      dozedMs: 0,
      dozedVcpuMs: 0,
      dozedMibMs: 0,
      hibernatedMs: 0,
    });
  });

  it("answers ranges that are not on quarter hours from raw segments, still conserving every millisecond", async () => {
    const q: UsageQuery = {
      tenantId: "ten_u",
      from: Date.UTC(2026, 2, 7, 10, 7, 3, 17),
      to: Date.UTC(2026, 2, 9, 22, 59, 59, 999),
      zone: "America/New_York",
      byAgent: true,
      time: "hour",
    };
    const report = await usageReport(database.db, q);
    expect(report.source).toBe("raw");
    const b = windowsOf(q);
    let expected = 0;
    for (const s of segs) for (const p of splitIntoWindows(Date.parse(s.startedAt), Date.parse(s.endedAt), b)) expected += p.ms;
    expect(report.totals.activeMs).toBe(expected);
    expect(expected).toBeGreaterThan(0);
  });

  describe("in parts", () => {
    /**
     * A Db over its own connections that records the rollup statements it is sent (not the event log's, for hibernated
     * time); `beforeSecondPart` runs after the first part's statement has answered and before the second part's is sent
     * (for a write committed between them).
     */
    function watchedDb(beforeSecondPart?: () => Promise<void>) {
      const client = postgres(database.url, { max: 3, onnotice: () => {} });
      const sent: string[] = [];
      let firstPart: Promise<unknown> | undefined;
      const unsafe = (text: string, params?: unknown[], opts?: object) => {
        if (text.includes("usage_quarter_hours")) sent.push(text.includes("pg_current_snapshot") ? "part" : "one");
        if (!text.includes("pg_current_snapshot")) return client.unsafe(text, params as never, opts);
        if (!firstPart) return (firstPart = Promise.resolve(client.unsafe(text, params as never, opts)));
        return firstPart.then(async () => {
          await beforeSecondPart?.();
          return client.unsafe(text, params as never, opts);
        });
      };
      const watched = new Proxy(client, { get: (target, name, receiver) => (name === "unsafe" ? unsafe : (Reflect.get(target, name, receiver) as unknown)) });
      return { db: drizzle(watched) as unknown as Database["db"], sent, close: () => client.end() };
    }
    const q: UsageQuery = { tenantId: "ten_u", from: Date.UTC(2026, 2, 1), to: Date.UTC(2026, 4, 1), zone: "Europe/Berlin", byAgent: true, time: "day" };

    it("cuts a long range on window boundaries into runs of about equal time, none shorter than a day", () => {
      const days = windowsOf(q);
      expect(partCuts(days, 2)).toEqual([0, 31, days.length - 1]); // 61 local days: March, then April and the DST change
      expect(partCuts(days, 1)).toEqual([0, days.length - 1]);
      expect(partCuts(windowsOf({ ...q, to: q.from + 36 * hour }), 2)).toEqual([0, 2]); // a day and a half: one query
      const hours = windowsOf({ ...q, to: q.from + 2 * 24 * hour, time: "hour" });
      expect(partCuts(hours, 4)).toEqual([0, 24, 48]);
      expect(partCuts([q.from, q.from + 10 * 24 * hour], 4)).toEqual([0, 1]); // one window is never cut
    });

    it("answers what one query answers, asking Postgres for the parts at once", async () => {
      const watched = watchedDb();
      try {
        const one = await usageTable(database.db, q, { parts: 1 });
        expect(one.columns.length).toBeGreaterThan(0);
        for (const parts of [2, 3]) {
          watched.sent.length = 0;
          expect(await usageTable(watched.db, q, { parts })).toEqual(one);
          expect(watched.sent).toEqual(Array(parts).fill("part"));
        }
        watched.sent.length = 0;
        await usageTable(watched.db, q, { parts: 1 });
        expect(watched.sent).toEqual(["one"]);
      } finally {
        await watched.close();
      }
    });

    it("answers with one query when a write commits between the parts' statements, so no report mixes two instants", async () => {
      const late = { tenantId: "ten_u", agentId: "agt_u_late", bucketStart: new Date(Date.UTC(2026, 2, 2, 12)), activeMs: 1000, vcpuMs: 2000, mibMs: 3000 };
      const watched = watchedDb(async () => {
        await database.db.insert(usageQuarterHours).values(late); // in the first part's range, after its statement
      });
      try {
        const report = await usageTable(watched.db, q, { parts: 2 });
        expect(watched.sent).toEqual(["part", "part", "one"]);
        expect(report.columns.agents).toContain("agt_u_late");
        expect(report).toEqual(await usageTable(database.db, q, { parts: 1 }));
      } finally {
        await watched.close();
        await database.db.execute(sql`delete from usage_quarter_hours where agent_id = 'agt_u_late'`);
      }
    });
  });

  describe("HTTP API", () => {
    const app = () => appWithCaller(createBillingRoutes({ db: database.db, clock, log: silentLogger, componentKey: key }));
    const get = (path: string, headers: Record<string, string> = { "x-test-tenant": "ten_u" }) => app().request(path, { headers });

    it("requires a caller with usage:read, and answers another tenant's agent or tenant with 404", async () => {
      const anon = await get("/v1/usage?from=2026-03-01&to=2026-04-01", {});
      expect(anon.status).toBe(401);
      expect(await anon.json()).toMatchObject({ error: { code: "unauthorized", requestId: "req_test" } });
      expect((await get("/v1/usage?from=2026-03-01&to=2026-04-01", { "x-test-tenant": "ten_u", "x-test-scopes": "agents:invoke" })).status).toBe(403);
      const other = await get("/v1/usage?from=2026-03-01&to=2026-04-01&agentId=agt_o1");
      expect(other.status).toBe(404);
      expect(await other.json()).toMatchObject({ error: { code: "not_found" } });
      expect((await get("/v1/usage?from=2026-03-01&to=2026-04-01&tenantId=ten_o")).status).toBe(404);
      expect((await get("/v1/agents/agt_o1/runs")).status).toBe(404);
      // the other tenant's usage never shows up in this tenant's totals
      const mine = (await (await get("/v1/usage?from=2026-03-08&to=2026-03-09")).json()) as { totals: { activeMs: number } };
      const theirs = (await (await get("/v1/usage?from=2026-03-08&to=2026-03-09", { "x-test-tenant": "ten_o" })).json()) as { totals: { activeMs: number } };
      expect(theirs.totals.activeMs).toBe(30 * 60_000);
      expect(mine.totals.activeMs).not.toBe(theirs.totals.activeMs);
    });

    it("groups by agent and local day in the requested zone, as JSON and as CSV", async () => {
      const res = await get("/v1/usage?from=2026-03-07&to=2026-03-10&tz=America/New_York&groupBy=agent,day");
      expect(res.status).toBe(200);
      const body = (await res.json()) as {
        rows: { start: string; end: string; agentId: string; activeMs: number }[];
        totals: { activeMs: number };
        source: string;
        timeZone: string;
      };
      expect(body.timeZone).toBe("America/New_York");
      expect(body.source).toBe("rollup");
      expect(new Set(body.rows.map((r) => r.start))).toEqual(new Set(["2026-03-07T00:00:00-05:00", "2026-03-08T00:00:00-05:00", "2026-03-09T00:00:00-04:00"]));
      expect(body.rows.find((r) => r.start.startsWith("2026-03-08"))?.end).toBe("2026-03-09T00:00:00-04:00");
      expect(body.rows.reduce((t, r) => t + r.activeMs, 0)).toBe(body.totals.activeMs);
      const csv = await get("/v1/usage?from=2026-03-07&to=2026-03-10&tz=America/New_York&groupBy=agent,day", { "x-test-tenant": "ten_u", accept: "text/csv" });
      expect(csv.headers.get("content-type")).toMatch(/^text\/csv/);
      const lines = (await csv.text()).trim().split("\r\n");
      expect(lines[0]).toBe("window_start,window_end,agent_id,active_ms,vcpu_ms,mib_ms,dozed_ms,dozed_vcpu_ms,dozed_mib_ms,hibernated_ms,pool_id");
      expect(lines.length - 1).toBe(body.rows.length);
      const first = body.rows[0]! as (typeof body.rows)[number] & { vcpuMs: number; mibMs: number };
      expect(lines[1]).toBe(`${first.start},${first.end},${first.agentId},${first.activeMs},${first.vcpuMs},${first.mibMs},0,0,0,0,`);
      expect((await get("/v1/usage?from=2026-03-07&to=2026-03-10&format=csv")).headers.get("content-type")).toMatch(/^text\/csv/);
    });

    it("refuses bad parameters with 400", async () => {
      for (const q of [
        "from=2026-03-01",
        "from=2026-03-01&to=2026-04-01&groupBy=week",
        "from=2026-03-01&to=2026-04-01&tz=Mars/Base",
        "from=2026-04-01&to=2026-03-01",
        "from=yesterday&to=2026-04-01",
        "from=2026-01-01&to=2026-12-01&groupBy=hour",
        "from=2026-03-01&to=2026-04-01&groupBy=hour,day",
      ]) {
        const res = await get(`/v1/usage?${q}`);
        expect(res.status, q).toBe(400);
        expect(((await res.json()) as { error: { code: string } }).error.code).toBe("bad_request");
      }
    });

    it("ingests over HTTP only with a billing component token, and only the host's own segments", async () => {
      const body = (s: MeterSegment[]) => JSON.stringify({ segments: s });
      const s1 = segment({
        hostId: "host_h",
        vmId: "vm_h",
        tenantId: "ten_o",
        agentId: "agt_o1",
        start: Date.UTC(2026, 5, 1),
        end: Date.UTC(2026, 5, 1, 0, 1),
      });
      const s2 = segment({
        hostId: "host_other",
        vmId: "vm_h",
        tenantId: "ten_o",
        agentId: "agt_o1",
        start: Date.UTC(2026, 5, 1),
        end: Date.UTC(2026, 5, 1, 0, 1),
      });
      const post = (auth: string | undefined, payload: string) =>
        app().request("/v1/meter-segments", {
          method: "POST",
          headers: { "content-type": "application/json", ...(auth ? { authorization: auth } : {}) },
          body: payload,
        });
      expect((await post(undefined, body([s1]))).status).toBe(401);
      expect((await post(undefined, "{nope")).status).toBe(401); // the token is checked before the body is read
      expect((await post(`Bearer ${await signComponentToken(key, { sub: "host_h", aud: "host:host_h" })}`, body([s1]))).status).toBe(401);
      expect(
        (
          await post(
            `Bearer ${await signComponentToken(componentKey("another-secret-that-is-32-chars-long!!"), { sub: "host_h", aud: "billing" })}`,
            body([s1]),
          )
        ).status,
      ).toBe(401);
      const token = `Bearer ${await signComponentToken(key, { sub: "host_h", aud: "billing" })}`;
      expect((await post(token, "{nope")).status).toBe(400);
      expect((await post(token, JSON.stringify({ segs: [] }))).status).toBe(400);
      const ok = await post(token, body([s1, s2]));
      expect(ok.status).toBe(200);
      expect(await ok.json()).toEqual({ accepted: [s1.id], duplicates: [], rejected: [{ id: s2.id, code: "host_mismatch", message: expect.any(String) }] });
      expect(await (await post(token, body([s1]))).json()).toEqual({ accepted: [], duplicates: [s1.id], rejected: [] });
    });

    it("answers the bytes the report object serializes to: agents in C order, sums exact up to 2^53, larger ones refused", async () => {
      await seedTenant(database.db, "ten_big", "America/New_York");
      // rollup rows written directly: ids ingest would refuse (the report must not rely on it), sums near 2^53
      const ids = ["agt_b", "agt_B", "agt_a", "\u{1F600}", "\uFFFD", "é", 'q"uote', "new\nline"];
      const day1 = Date.UTC(2026, 6, 1, 4); // local midnight in New York (EDT)
      const rollups = ids.flatMap((agentId, k) => [
        { tenantId: "ten_big", agentId, bucketStart: new Date(day1 + k * 900_000), activeMs: 1000 + k, vcpuMs: 2 ** 52, mibMs: 3 * 2 ** 50 + k },
        { tenantId: "ten_big", agentId, bucketStart: new Date(day1 + 23 * hour + 45 * 60_000), activeMs: 7, vcpuMs: 2 ** 52 - 1 - k, mibMs: 2 ** 50 + 1 },
        { tenantId: "ten_big", agentId, bucketStart: new Date(day1 + 24 * hour), activeMs: 5, vcpuMs: 3, mibMs: 1 },
      ]);
      await database.db.insert(usageQuarterHours).values(rollups);
      const path = "/v1/usage?from=2026-07-01&to=2026-07-03&tz=America/New_York&groupBy=agent,day";
      const res = await get(path, { "x-test-tenant": "ten_big" });
      expect(res.status).toBe(200);
      expect(res.headers.get("content-type")).toBe("application/json");
      const text = await res.text();
      const q: UsageQuery = { tenantId: "ten_big", from: day1, to: day1 + 48 * hour, zone: "America/New_York", byAgent: true, time: "day" };
      expect(text).toBe(JSON.stringify(usageJson(await usageTable(database.db, q), ["agent", "day"])));
      const body = JSON.parse(text) as {
        rows: { start: string; agentId: string; activeMs: number; vcpuMs: number; mibMs: number }[];
        totals: { vcpuMs: number };
      };
      const cOrder = (await database.db.execute(
        sql`select distinct agent_id from usage_quarter_hours where tenant_id = 'ten_big' order by agent_id`,
      )) as unknown as { agent_id: string }[];
      expect(body.rows.filter((r) => r.start.startsWith("2026-07-01")).map((r) => r.agentId)).toEqual(cOrder.map((r) => r.agent_id));
      for (const [k, agentId] of ids.entries()) {
        const first = body.rows.find((r) => r.agentId === agentId && r.start.startsWith("2026-07-01"))!;
        // exact, as sum(int8) was: 2^52 + (2^52 - 1 - k) and 3·2^50 + k + 2^50 + 1
        expect([first.activeMs, first.vcpuMs, first.mibMs]).toEqual([1007 + k, 2 ** 53 - 1 - k, 2 ** 52 + k + 1]);
        expect(BigInt(first.vcpuMs)).toBe(2n ** 52n + 2n ** 52n - 1n - BigInt(k));
      }
      expect(body.rows).toHaveLength(2 * ids.length);
      // a sum that reaches 2^53 is refused, as before (the answer would not be exact in JSON)
      await database.db
        .insert(usageQuarterHours)
        .values({ tenantId: "ten_big", agentId: "agt_b", bucketStart: new Date(day1 + hour), activeMs: 1, vcpuMs: 1, mibMs: 0 }); // agt_b: 2^53 - 1 + 1
      await expect(usageTable(database.db, q)).rejects.toThrow(/exceeds 2\^53/);
      expect((await get(path, { "x-test-tenant": "ten_big" })).status).toBe(500);
    });

    it("lists an agent's runs with wake reason, mode, timing breakdown, sleep reason and metered time", async () => {
      const woke = Date.UTC(2026, 5, 2, 8);
      await database.db.insert(runs).values([
        {
          id: "run_r1",
          agentId: "agt_u1",
          tenantId: "ten_u",
          hostId: "host_r",
          vmId: "vm_r",
          wokeAt: new Date(woke),
          wakeReason: "webhook",
          wakeMode: "restore",
          timings: { queuedMs: 3, restoreMs: 850, clockFixMs: 2, firstByteMs: 910 },
          sleptAt: new Date(woke + 95_000),
          sleepReason: "idle",
        },
        {
          id: "run_r2",
          agentId: "agt_u1",
          tenantId: "ten_u",
          hostId: "host_r",
          vmId: "vm_r",
          wokeAt: new Date(woke + hour),
          wakeReason: "request",
          wakeMode: "boot",
          timings: { queuedMs: 1, bootMs: 3900 },
        },
      ]);
      await ingestSegments(
        database.db,
        runSegments({
          hostId: "host_r",
          vmId: "vm_r",
          tenantId: "ten_u",
          agentId: "agt_u1",
          runId: "run_r1",
          start: woke,
          durationMs: 95_000,
          vcpus: 2,
          memMiB: 512,
        }),
        clock,
      );
      const res = await get("/v1/agents/agt_u1/runs?from=2026-06-01&to=2026-06-03");
      expect(res.status).toBe(200);
      const body = (await res.json()) as { runs: Record<string, unknown>[] };
      expect(body.runs).toEqual([
        expect.objectContaining({
          runId: "run_r2",
          wakeReason: "request",
          wakeMode: "boot",
          sleptAt: null,
          sleepReason: null,
          activeMs: 0,
          dozedMs: 0,
          segments: 0,
        }),
        expect.objectContaining({
          runId: "run_r1",
          wokeAt: "2026-06-02T08:00:00.000Z",
          wakeReason: "webhook",
          wakeMode: "restore",
          timings: { queuedMs: 3, restoreMs: 850, clockFixMs: 2, firstByteMs: 910 },
          sleptAt: "2026-06-02T08:01:35.000Z",
          sleepReason: "idle",
          awakeMs: 95_000,
          activeMs: 95_000,
          vcpuMs: 190_000,
          mibMs: 512 * 95_000,
          dozedMs: 0,
          dozedVcpuMs: 0,
          dozedMibMs: 0,
          segments: 10,
          operations: 0,
          upstreamWaitMs: 0,
        }),
      ]);
      const csv = await (await get("/v1/agents/agt_u1/runs?from=2026-06-01&to=2026-06-03&format=csv")).text();
      expect(csv.split("\r\n")[0]).toBe(
        "run_id,woke_at,wake_reason,wake_mode,queued_ms,restore_ms,clock_fix_ms,first_byte_ms,boot_ms,skew_before_ms,skew_after_ms,rollback_ms,slept_at,sleep_reason,active_ms,vcpu_ms,mib_ms,dozed_ms,dozed_vcpu_ms,dozed_mib_ms,segments,operations,upstream_wait_ms,input_tokens,output_tokens,viewer_ms,control_ms,overlap_ms",
      );
      expect(csv).toContain(
        "run_r1,2026-06-02T08:00:00.000Z,webhook,restore,3,850,2,910,,,,,2026-06-02T08:01:35.000Z,idle,95000,190000,48640000,0,0,0,10,0,0,0,0",
      );
    });
  });
});

describe("on embedded PGlite (the all-in-one npm start)", () => {
  it("reports, lists runs and invoices with the same SQL", async () => {
    const { openDatabase } = await import("../../schema/db.ts");
    const { invoiceForMonth } = await import("../../billing/invoices.ts");
    const { agentRuns } = await import("../../billing/runs.ts");
    const lite = await openDatabase({ pgliteMemory: true });
    try {
      await seedTenant(lite.db, "ten_l", "Asia/Kolkata", ["agt_l"]);
      const liteClock = new ManualClock(Date.UTC(2026, 3, 1, 12));
      await lite.db.insert(runs).values({
        id: "run_l",
        agentId: "agt_l",
        tenantId: "ten_l",
        hostId: "host_l",
        vmId: "vm_l",
        wokeAt: new Date(Date.UTC(2026, 2, 10, 18)),
        wakeReason: "api",
        wakeMode: "boot",
        timings: { bootMs: 3500 },
      });
      const r = await ingestSegments(
        lite.db,
        runSegments({
          hostId: "host_l",
          vmId: "vm_l",
          tenantId: "ten_l",
          agentId: "agt_l",
          runId: "run_l",
          start: Date.UTC(2026, 2, 10, 18),
          durationMs: 2 * hour,
          vcpus: 2,
          memMiB: 512,
        }),
        liteClock,
      );
      expect(r.accepted).toHaveLength(720);
      const q: UsageQuery = { tenantId: "ten_l", from: Date.UTC(2026, 2, 1), to: Date.UTC(2026, 3, 1), zone: "Asia/Kolkata", byAgent: true, time: "day" };
      const rollup = await usageReport(lite.db, q);
      expect(rollup.rows.map((x) => x.activeMs)).toEqual([30 * 60_000, 90 * 60_000]); // 23:30 IST is the day change
      expect((await usageReport(lite.db, q, { source: "raw" })).rows).toEqual(rollup.rows);
      expect((await agentRuns(lite.db, "ten_l", "agt_l"))[0]).toMatchObject({ runId: "run_l", activeMs: 2 * hour, segments: 720 });
      const inv = await invoiceForMonth(lite.db, liteClock, "ten_l", "2026-03");
      expect(inv.lines.map((l) => [l.resource, l.quantity])).toEqual([
        ["vcpu", String(4 * hour)],
        ["memory", String(512 * 2 * hour)],
      ]);
    } finally {
      await lite.close();
    }
  });
});

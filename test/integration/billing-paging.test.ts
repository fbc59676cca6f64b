// Billing's lists page with opaque cursors on real Postgres (runs by time, invoices), its parameters are validated, and its document.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { sql } from "drizzle-orm";
import { createBillingRoutes } from "../../billing/routes.ts";
import { ManualClock } from "../../lib/clock.ts";
import { encodeCursor } from "../../lib/api.ts";
import { componentKey } from "../../lib/host-token.ts";
import { silentLogger } from "../../lib/log.ts";
import { invoices } from "../../schema/billing.ts";
import type { Database } from "../../schema/db.ts";
import { freshDatabase } from "../helpers/db.ts";
import { appWithCaller, seedTenant } from "./billing-fixtures.ts";

const t0 = Date.UTC(2026, 5, 1);
const runCount = 250;

describe("billing lists and parameters", () => {
  let database: Database;
  const clock = new ManualClock(Date.UTC(2026, 6, 1));
  const routes = () =>
    createBillingRoutes({ db: database.db, clock, log: silentLogger, componentKey: componentKey("a-component-secret-of-at-least-32-chars!") });
  const get = (path: string, headers: Record<string, string> = {}) =>
    appWithCaller(routes()).request(path, { headers: { "x-test-tenant": "ten_p", ...headers } });

  beforeAll(async () => {
    database = await freshDatabase();
    await seedTenant(database.db, "ten_p", "UTC", ["agt_p"]);
    await seedTenant(database.db, "ten_q", "UTC", ["agt_q"]);
    // 250 runs a minute apart, except: runs 100–109 all woke in the same millisecond, and 200–204 within one
    // millisecond a microsecond apart (a cursor cut to the millisecond would skip or repeat them).
    const values = Array.from({ length: runCount }, (_, i) => {
      const at =
        i >= 100 && i < 110
          ? new Date(t0 + 100 * 60_000).toISOString()
          : i >= 200 && i < 205
            ? `2026-06-01T03:20:00.00000${i - 200}Z`
            : new Date(t0 + i * 60_000).toISOString();
      return sql`(${`run_${String(i).padStart(3, "0")}`}, 'agt_p', 'ten_p', 'host_p', 'vm_p', ${at}::timestamptz, 'request', 'boot', '{}'::jsonb)`;
    });
    await database.db.execute(
      sql`INSERT INTO runs (id, agent_id, tenant_id, host_id, vm_id, woke_at, wake_reason, wake_mode, timings) VALUES ${sql.join(values, sql`, `)}`,
    );
    // 25 months of invoices (rows as the first read of a month creates them)
    await database.db.insert(invoices).values(
      Array.from({ length: 25 }, (_, i) => {
        const start = Date.UTC(2024, i, 1);
        const month = new Date(start).toISOString().slice(0, 7);
        return { id: `inv_${month}`, tenantId: "ten_p", month, timeZone: "UTC", periodStart: new Date(start), periodEnd: new Date(Date.UTC(2024, i + 1, 1)) };
      }),
    );
  });
  afterAll(async () => {
    await database?.close();
  });

  /** Follows `nextCursor` from the first page to the last; every page's ids. */
  async function allPages(first: string, items: (body: Record<string, unknown>) => string[]): Promise<string[][]> {
    const pages: string[][] = [];
    let url: string | undefined = first;
    while (url) {
      const res = await get(url);
      expect(res.status, url).toBe(200);
      const body = (await res.json()) as Record<string, unknown> & { nextCursor: string | null };
      pages.push(items(body));
      url = body.nextCursor ? `${first}${first.includes("?") ? "&" : "?"}cursor=${encodeURIComponent(body.nextCursor)}` : undefined;
      expect(pages.length).toBeLessThan(50);
    }
    return pages;
  }

  it("pages an agent's runs newest first across pages: no duplicate, no gap, ties within a millisecond kept apart", async () => {
    const pages = await allPages("/v1/agents/agt_p/runs?limit=100", (b) => (b.runs as { runId: string }[]).map((r) => r.runId));
    expect(pages.map((p) => p.length)).toEqual([100, 100, 50]);
    const ids = pages.flat();
    expect(new Set(ids).size).toBe(runCount);
    const expected = Array.from({ length: runCount }, (_, i) => `run_${String(i).padStart(3, "0")}`).reverse();
    expect(ids).toEqual(expected);

    // small pages cut right through the ties
    const small = (
      await allPages("/v1/agents/agt_p/runs?limit=3&from=2026-06-01T01:40:00Z&until=2026-06-01T01:41:00Z", (b) =>
        (b.runs as { runId: string }[]).map((r) => r.runId),
      )
    ).flat();
    expect(small).toEqual(["run_109", "run_108", "run_107", "run_106", "run_105", "run_104", "run_103", "run_102", "run_101", "run_100"]);
    const micro = (
      await allPages("/v1/agents/agt_p/runs?limit=2&from=2026-06-01T03:20:00Z&until=2026-06-01T03:20:00.001Z", (b) =>
        (b.runs as { runId: string }[]).map((r) => r.runId),
      )
    ).flat();
    expect(micro).toEqual(["run_204", "run_203", "run_202", "run_201", "run_200"]);
  });

  it("filters runs by time: from inclusive, until (or to) exclusive", async () => {
    const ids = async (q: string) => ((await (await get(`/v1/agents/agt_p/runs?${q}`)).json()) as { runs: { runId: string }[] }).runs.map((r) => r.runId);
    expect(await ids("from=2026-06-01T00:10:00Z&until=2026-06-01T00:13:00Z")).toEqual(["run_012", "run_011", "run_010"]);
    expect(await ids("from=2026-06-01T00:10:00Z&to=2026-06-01T00:13:00Z")).toEqual(["run_012", "run_011", "run_010"]);
    expect(await ids("from=2026-06-02")).toEqual([]);
  });

  it("gives CSV pages with the next cursor in x-next-cursor", async () => {
    const res = await get("/v1/agents/agt_p/runs?limit=2&format=csv");
    expect(res.headers.get("content-type")).toMatch(/^text\/csv/);
    const lines = (await res.text()).trim().split("\r\n");
    expect(lines.slice(1).map((l) => l.split(",")[0])).toEqual(["run_249", "run_248"]);
    const cursor = res.headers.get("x-next-cursor");
    expect(cursor).toBeTruthy();
    const next = await (await get(`/v1/agents/agt_p/runs?limit=2&format=csv&cursor=${encodeURIComponent(cursor!)}`)).text();
    expect(
      next
        .trim()
        .split("\r\n")
        .slice(1)
        .map((l) => l.split(",")[0]),
    ).toEqual(["run_247", "run_246"]);
  });

  it("pages invoices newest month first", async () => {
    const pages = await allPages("/v1/invoices?limit=10", (b) => (b.invoices as { month: string }[]).map((i) => i.month));
    expect(pages.map((p) => p.length)).toEqual([10, 10, 5]);
    const months = pages.flat();
    expect(new Set(months).size).toBe(25);
    expect(months).toEqual([...months].sort().reverse());
    expect(months[0]).toBe("2026-01");
    expect(months.at(-1)).toBe("2024-01");
    // another tenant sees none of them
    expect(((await (await get("/v1/invoices", { "x-test-tenant": "ten_q" })).json()) as { invoices: unknown[] }).invoices).toEqual([]);
  });

  it("answers 400 with the envelope to a cursor it did not give, and to limits out of range", async () => {
    for (const cursor of [
      "garbage!",
      encodeCursor(["2026-06-01"]),
      encodeCursor([1, 2]),
      encodeCursor(["not a time", "run_001"]),
      encodeCursor(["2026-13-01T00:00:00.000000Z", "run_001"]),
    ]) {
      const res = await get(`/v1/agents/agt_p/runs?cursor=${encodeURIComponent(cursor)}`);
      expect(res.status, cursor).toBe(400);
      expect(await res.json()).toMatchObject({ error: { code: "bad_request", message: expect.stringContaining("cursor"), requestId: "req_test" } });
    }
    for (const cursor of ["garbage!", encodeCursor(["2026-06-01T00:00:00.000000Z", "run_001"]), encodeCursor(["2026/01"])]) {
      expect((await get(`/v1/invoices?cursor=${encodeURIComponent(cursor)}`)).status, cursor).toBe(400);
    }
    for (const limit of ["0", "1001", "x", "1.5"]) {
      expect((await get(`/v1/agents/agt_p/runs?limit=${limit}`)).status, limit).toBe(400);
      expect((await get(`/v1/invoices?limit=${limit}`)).status, limit).toBe(400);
    }
  });

  it("refuses instants outside years 1970–9999, days the calendar lacks, unknown parameters and formats with 400", async () => {
    for (const path of [
      "/v1/usage?from=0000-01-01&to=0000-01-02",
      "/v1/usage?from=0000-01-01T00:00:00Z&to=0000-01-02T00:00:00Z",
      "/v1/usage?from=1969-12-31&to=1970-01-02",
      "/v1/usage?from=2026-02-30&to=2026-03-02",
      "/v1/usage?from=2026-03-01T24:00:00Z&to=2026-03-02",
      "/v1/usage?from=2026-03-01&to=2026-03-02&groupby=agent",
      "/v1/usage?from=2026-03-01&to=2026-03-02&format=xml",
      "/v1/usage?from=2026-03-01&from=2026-03-02&to=2026-03-03",
      `/v1/usage?from=2026-03-01&to=2026-03-02&groupBy=${"x".repeat(5000)}`,
      "/v1/agents/agt_p/runs?from=0000-01-01",
      "/v1/agents/agt_p/runs?until=10000-01-01",
      "/v1/agents/agt_p/runs?before=2026-06-01",
      "/v1/invoices?month=0000-01",
      "/v1/invoices?month=2026-13",
    ]) {
      const res = await get(path);
      expect(res.status, path).toBe(400);
      const body = (await res.json()) as { error: { code: string; message: string } };
      expect(body.error.code, path).toBe("bad_request");
      expect(body.error.message.length, path).toBeLessThan(400);
    }
    const year0 = (await (await get("/v1/usage?from=0000-01-01&to=2026-01-01")).json()) as { error: { message: string } };
    expect(year0.error.message).toBe('from: must be in the years 1970 to 9999; got "0000-01-01"');
    const missing = (await (await get("/v1/usage?from=2026-01-01")).json()) as { error: { message: string } };
    expect(missing.error.message).toMatch(/^to: is required/);
    // the edges are fine
    expect((await get("/v1/usage?from=1970-01-01&to=1970-01-02")).status).toBe(200);
    expect((await get("/v1/agents/agt_p/runs?from=9999-12-31T23:59:59Z")).status).toBe(200);
  });

  it("describes its routes in the OpenAPI document: JSON or CSV answers, paged lists, a loose meter body", () => {
    const doc = routes().getOpenAPI31Document({ openapi: "3.1.0", info: { title: "t", version: "1" } });
    const paths = doc.paths as Record<
      string,
      Record<
        string,
        {
          operationId: string;
          parameters?: { name: string }[];
          requestBody?: { content: Record<string, { schema: unknown }> };
          responses: Record<string, { content?: Record<string, unknown> }>;
        }
      >
    >;
    expect(Object.keys(paths["/v1/usage"]!.get!.responses["200"]!.content!)).toEqual(["application/json", "text/csv"]);
    expect(paths["/v1/agents/{id}/runs"]!.get!.parameters!.map((p) => p.name)).toEqual(expect.arrayContaining(["cursor", "limit", "from", "until", "id"]));
    expect(paths["/v1/invoices"]!.get!.operationId).toBe("listInvoices");
    expect(paths["/v1/meter-segments"]!.post!.requestBody!.content["application/json"]).toBeDefined();
    expect(JSON.stringify(doc.components?.schemas?.MeterBatch)).toContain('"items":{"type":"object"');
    for (const [path, methods] of Object.entries(paths))
      for (const op of Object.values(methods)) expect(op.responses["400"] ?? op.responses["401"], path).toBeDefined();
  });
});

// The worked example of docs/billing.md (Metering and billing), end to end: meter (manual clock) → spool → in-process ingest → usage, runs, invoice.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createBillingRoutes } from "../../billing/routes.ts";
import { Meter } from "../../fleet-agent/meter/meter.ts";
import { billingSink } from "../../billing/sink.ts";
import { ManualClock } from "../../lib/clock.ts";
import { componentKey } from "../../lib/host-token.ts";
import { silentLogger } from "../../lib/log.ts";
import { runs, vmEvents } from "../../schema/core.ts";
import type { Database } from "../../schema/db.ts";
import { freshDatabase } from "../helpers/db.ts";
import { appWithCaller, seedTenant } from "./billing-fixtures.ts";

const docs = readFileSync(new URL("../../docs/billing.md", import.meta.url), "utf8");
const snapshotBytes = 268_435_456; // 256 MiB

/** The agent's life in March 2026 (America/New_York): three wakes, hibernated in between. */
const timeline = [
  { runId: "run_ex1", wake: "request", wokeAt: "2026-03-02T19:00:00.000Z", sleep: "idle", sleptAt: "2026-03-02T20:12:30.250Z" },
  { runId: "run_ex2", wake: "webhook", wokeAt: "2026-03-08T04:30:00.000Z", sleep: "idle", sleptAt: "2026-03-08T07:30:00.000Z" },
  { runId: "run_ex3", wake: "api", wokeAt: "2026-04-01T03:00:00.000Z", sleep: "api", sleptAt: "2026-04-01T04:45:00.000Z" },
] as const;

describe("the billing worked example of docs/billing.md", () => {
  let database: Database;
  let dataDir: string;
  const clock = new ManualClock(Date.parse("2026-02-20T17:00:00.000Z"));
  const app = () =>
    appWithCaller(createBillingRoutes({ db: database.db, clock, log: silentLogger, componentKey: componentKey("a-component-secret-of-at-least-32-chars!") }));
  const get = async (path: string) => {
    const res = await app().request(path, { headers: { "x-test-tenant": "ten_example", "x-test-scopes": "usage:read,agents:admin" } });
    expect(res.status, path).toBe(200);
    return res;
  };

  beforeAll(async () => {
    database = await freshDatabase();
    dataDir = mkdtempSync(join(tmpdir(), "billing-example-"));
    await seedTenant(database.db, "ten_example", "America/New_York", ["agt_example"]);
    const event = (at: string, fromState: string, toState: string, reason: string, timings?: Record<string, number>) => ({
      at: new Date(at),
      hostId: "host_ex",
      agentId: "agt_example",
      vmId: "vm_ex",
      fromState,
      toState,
      reason,
      ...(timings ? { timings } : {}),
    });
    await database.db.insert(vmEvents).values(event("2026-02-20T17:00:00.000Z", "snapshotting", "hibernated", "idle", { snapshot_bytes: snapshotBytes }));

    const meter = Meter.open({ hostId: "host_ex", dataDir, sink: billingSink(database.db, clock), clock, heartbeatMs: 10_000 });
    meter.start();
    const until = (iso: string) => clock.advance(Date.parse(iso) - clock.now());
    for (const r of timeline) {
      until(r.wokeAt);
      meter.active({
        at: clock.now(),
        mono: clock.monotonic(),
        hostId: "host_ex",
        vmId: "vm_ex",
        agentId: "agt_example",
        tenantId: "ten_example",
        runId: r.runId,
        vcpus: 2,
        memMiB: 2048,
        reason: r.wake,
      });
      await database.db.insert(vmEvents).values(event(r.wokeAt, "hibernated", "restoring", r.wake));
      until(r.sleptAt);
      meter.inactive({ at: clock.now(), mono: clock.monotonic(), vmId: "vm_ex", reason: r.sleep });
      await database.db.insert(vmEvents).values(event(r.sleptAt, "running", "hibernated", r.sleep, { snapshot_bytes: snapshotBytes }));
      await database.db.insert(runs).values({
        id: r.runId,
        agentId: "agt_example",
        tenantId: "ten_example",
        hostId: "host_ex",
        vmId: "vm_ex",
        wokeAt: new Date(r.wokeAt),
        wakeReason: r.wake,
        wakeMode: "restore",
        timings: { queuedMs: 2, restoreMs: 870, clockFixMs: 3, firstByteMs: 1010 },
        sleptAt: new Date(r.sleptAt),
        sleepReason: r.sleep,
      });
    }
    await meter.stop(); // ships everything left in the spool
  });
  afterAll(async () => {
    await database.close();
    rmSync(dataDir, { recursive: true, force: true });
  });

  it("reports usage by local day, DST day included, exactly as documented", async () => {
    const body = (await (await get("/v1/usage?from=2026-03-01&to=2026-04-02&tz=America/New_York&groupBy=day")).json()) as {
      rows: { start: string; end: string; activeMs: number; dozedMs: number; hibernatedMs: number; vcpuMs: number; mibMs: number }[];
      totals: { hibernatedMs: number };
    };
    const awake = body.rows.filter((r) => r.activeMs > 0);
    const table = [
      "| local day (America/New_York) | window | active ms | dozed ms | hibernated ms | vCPU-ms | MiB-ms |",
      "|---|---|---:|---:|---:|---:|---:|",
      ...awake.map((r) => `| ${r.start.slice(0, 10)} | ${r.start} → ${r.end} | ${r.activeMs} | ${r.dozedMs} | ${r.hibernatedMs} | ${r.vcpuMs} | ${r.mibMs} |`),
    ].join("\n");
    expect(docs).toContain(table);
    expect(awake.map((r) => r.activeMs)).toEqual([4_350_250, 1_800_000, 9_000_000, 3_600_000, 2_700_000]);
    // every other day of the range has a row of its own: hibernated all of it, active not at all
    expect(body.rows).toHaveLength(32);
    for (const r of body.rows.filter((r) => r.activeMs === 0)) expect(r.hibernatedMs).toBe(Date.parse(r.end) - Date.parse(r.start));
    // the March part of the report's hibernation is the invoice's (below), the April 1 part the rest
    expect(body.totals.hibernatedMs).toBe(2_656_049_750 + (24 * 3_600_000 - 2_700_000));
  });

  it("reports the hours of the spring-forward night, where 2 a.m. does not exist", async () => {
    const body = (await (await get("/v1/usage?from=2026-03-08&to=2026-03-09&tz=America/New_York&groupBy=hour")).json()) as {
      rows: { start: string; activeMs: number; hibernatedMs: number }[];
    };
    expect(body.rows).toHaveLength(23);
    // the hours it slept through have a row each, hibernated all of the hour; it fell asleep at 03:30 EDT
    for (const r of body.rows.filter((r) => r.activeMs === 0)) expect(r.hibernatedMs).toBe(3_600_000);
    expect(body.rows.find((r) => r.start === "2026-03-08T03:00:00-04:00")?.hibernatedMs).toBe(1_800_000);
    expect(body.rows.filter((r) => r.activeMs > 0).map((r) => [r.start, r.activeMs])).toEqual([
      ["2026-03-08T00:00:00-05:00", 3_600_000],
      ["2026-03-08T01:00:00-05:00", 3_600_000],
      ["2026-03-08T03:00:00-04:00", 1_800_000],
    ]);
  });

  it("lists the runs with their metered seconds", async () => {
    const body = (await (await get("/v1/agents/agt_example/runs")).json()) as {
      runs: { runId: string; wakeReason: string; sleepReason: string; activeMs: number; segments: number }[];
    };
    const table = [
      "| run | woke by | slept by | active ms | segments |",
      "|---|---|---|---:|---:|",
      ...[...body.runs].reverse().map((r) => `| ${r.runId} | ${r.wakeReason} | ${r.sleepReason} | ${r.activeMs} | ${r.segments} |`),
    ].join("\n");
    expect(docs).toContain(table);
  });

  it("invoices March: a draft until April 3, then final with the documented lines and total", async () => {
    const early = await app().request("/v1/invoices/2026-03/finalize", {
      method: "POST",
      headers: { "x-test-tenant": "ten_example", "x-test-scopes": "agents:admin" },
    });
    expect(early.status).toBe(409);
    clock.advance(Date.parse("2026-04-03T04:00:00.000Z") - clock.now());
    const res = await app().request("/v1/invoices/2026-03/finalize", {
      method: "POST",
      headers: { "x-test-tenant": "ten_example", "x-test-scopes": "agents:admin" },
    });
    expect(res.status).toBe(200);
    const inv = (await res.json()) as {
      status: string;
      cutoffAt: string;
      lines: { resource: string; quantity: string; unit: string; unitPriceNanocents: number; priceUnit: string; amountCents: number }[];
      time: unknown[];
      totalCents: number;
      total: string;
    };
    expect(inv.status).toBe("final");
    expect(inv.cutoffAt).toBe("2026-04-03T04:00:00.000Z");
    const table = [
      "| resource | quantity | unit price | amount |",
      "|---|---:|---:|---:|",
      ...inv.lines.map((l) => `| ${l.resource} | ${l.quantity} ${l.unit} | ${l.unitPriceNanocents} nano-cents per ${l.priceUnit} | ${l.amountCents} ¢ |`),
      `| **total** | | | **${inv.totalCents} ¢** |`,
    ].join("\n");
    expect(docs).toContain(table);
    expect(inv.lines.map((l) => l.amountCents)).toEqual([38, 4, 3]);
    // the March time by state: the hibernation the snapshot line priced, to the millisecond
    expect(inv.time).toEqual([{ agentId: "agt_example", activeMs: 18_750_250, dozedMs: 0, hibernatedMs: 2_656_049_750 }]);
    expect(inv.total).toBe("0.45");
  });
});

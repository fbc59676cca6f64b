// Billing down for a while: the meter keeps spooling, retries with backoff, and every segment arrives complete and once.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { serve, type ServerType } from "@hono/node-server";
import { Hono } from "hono";
import { sql } from "drizzle-orm";
import { createBillingRoutes } from "../../billing/routes.ts";
import { Meter } from "../../fleet-agent/meter/meter.ts";
import { HttpSink } from "../../fleet-agent/meter/sinks.ts";
import { meterDir } from "../../fleet-agent/meter/spool.ts";
import type { GatewayEnv } from "../../contracts/caller.ts";
import { systemClock } from "../../lib/clock.ts";
import { componentKey } from "../../lib/host-token.ts";
import { silentLogger } from "../../lib/log.ts";
import { queryRows, type Database } from "../../schema/db.ts";
import { freshDatabase } from "../helpers/db.ts";
import { freePort } from "../../scripts/postgres-server.ts";
import { appWithCaller } from "./billing-fixtures.ts";

const key = componentKey("a-component-secret-of-at-least-32-chars!");
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("meter → HTTP → billing, while billing is down", () => {
  let database: Database;
  let dataDir: string;
  let server: ServerType | undefined;
  beforeAll(async () => {
    database = await freshDatabase();
    dataDir = mkdtempSync(join(tmpdir(), "meter-http-"));
  });
  afterAll(async () => {
    server?.close();
    await database.close();
    rmSync(dataDir, { recursive: true, force: true });
  });

  it("piles segments up in the spool while billing refuses, then delivers all of them exactly once", async () => {
    const port = await freePort();
    let mode: "503" | "up" = "503";
    let refused = 0;
    const billing = appWithCaller(createBillingRoutes({ db: database.db, clock: systemClock, log: silentLogger, componentKey: key }));
    const front = new Hono<GatewayEnv>();
    front.all("*", async (c) => {
      if (mode === "503") {
        refused++;
        return c.text("billing is restarting", 503);
      }
      return billing.fetch(c.req.raw);
    });

    const meter = Meter.open({
      hostId: "host_h",
      dataDir,
      sink: new HttpSink({ billingUrl: `http://127.0.0.1:${port}`, hostId: "host_h", key, timeoutMs: 5000 }),
      clock: systemClock,
      heartbeatMs: 50,
      shipper: { lingerMs: 20, minBackoffMs: 40, maxBackoffMs: 300 },
    });
    meter.start();
    const expected = new Map<string, number>();
    const run = (vmId: string, runId: string) => {
      const mono = performance.now();
      meter.active({
        at: Date.now(),
        mono,
        hostId: "host_h",
        vmId,
        agentId: `agt_${vmId}`,
        tenantId: "ten_h",
        runId,
        vcpus: 1,
        memMiB: 256,
        reason: "request",
      });
      return () => {
        const end = performance.now();
        meter.inactive({ at: Date.now(), mono: end, vmId, reason: "idle" });
        expected.set(vmId, (expected.get(vmId) ?? 0) + Math.round(end - mono));
      };
    };

    // phase 1: nothing listens on the port (connection refused)
    const stopA = run("vm_a", "run_a1");
    const stopB = run("vm_b", "run_b1");
    await sleep(400);
    stopA();
    // phase 2: a server that answers 503
    server = serve({ fetch: front.fetch, port, hostname: "127.0.0.1" });
    const stopC = run("vm_c", "run_c1");
    await sleep(400);
    const spoolFile = join(meterDir(dataDir, "host_h"), "segments.ndjson");
    const spooled = readFileSync(spoolFile, "utf8").trim().split("\n").length;
    expect(spooled).toBeGreaterThan(15);
    expect(refused).toBeGreaterThan(0);
    const before = await queryRows<{ n: number }>(database.db, sql`select count(*)::int as n from meter_segments`);
    expect(before[0]?.n).toBe(0);
    // phase 3: billing is back
    mode = "up";
    const stopA2 = run("vm_a", "run_a2");
    await sleep(300);
    stopB();
    stopC();
    stopA2();
    await meter.stop();

    const rows = await queryRows<{ id: string; ms: string | number }>(
      database.db,
      sql`select id, (extract(epoch from ended_at - started_at) * 1000)::int8 as ms from meter_segments`,
    );
    const byVm = new Map<string, { ms: number; seqs: number[] }>();
    for (const r of rows) {
      const [, vm, seq] = r.id.split(":");
      const e = byVm.get(vm!) ?? { ms: 0, seqs: [] };
      e.ms += Number(r.ms);
      e.seqs.push(Number(seq));
      byVm.set(vm!, e);
    }
    for (const [vm, ms] of expected) {
      expect(byVm.get(vm)?.ms, vm).toBe(ms);
      const seqs = byVm.get(vm)!.seqs.sort((a, b) => a - b);
      expect(seqs).toEqual(seqs.map((_, i) => i)); // 0..n-1: nothing missing, nothing twice
    }
    // the spool is empty again: just the checkpoint line
    const left = readFileSync(spoolFile, "utf8").trim().split("\n");
    expect(left).toHaveLength(1);
    expect(JSON.parse(left[0]!)).toHaveProperty("checkpoint");
  });
});

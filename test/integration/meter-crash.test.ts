// kill -9 of the metering process at random points, restarts, then a drain: nothing counted twice, nothing invented, loss ≤ one heartbeat.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { serve, type ServerType } from "@hono/node-server";
import { sql } from "drizzle-orm";
import { createBillingRoutes } from "../../billing/routes.ts";
import { meterDir } from "../../fleet-agent/meter/spool.ts";
import { systemClock } from "../../lib/clock.ts";
import { componentKey } from "../../lib/host-token.ts";
import { silentLogger } from "../../lib/log.ts";
import { queryRows, type Database } from "../../schema/db.ts";
import { freshDatabase } from "../helpers/db.ts";
import { freePort } from "../../scripts/postgres-server.ts";
import { appWithCaller } from "./billing-fixtures.ts";
import type { CrashChildConfig } from "./meter-crash-child.ts";

const secret = "a-component-secret-of-at-least-32-chars!";
const heartbeatMs = 200;
/** Timers fire late by a few ms, more under load: the tolerance for where an interval's metering starts or ends. */
const slackMs = 120;
const childScript = fileURLToPath(new URL("./meter-crash-child.ts", import.meta.url));

interface Interval {
  start: number;
  end: number;
}

function overlap(a: Interval, b: Interval): number {
  return Math.max(0, Math.min(a.end, b.end) - Math.max(a.start, b.start));
}

function startChild(config: CrashChildConfig): { child: ChildProcess; ready: Promise<number>; exited: Promise<number | null> } {
  const child = spawn(process.execPath, [childScript], {
    env: { ...process.env, METER_CHILD_CONFIG: JSON.stringify(config) },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  child.stderr?.on("data", (d: Buffer) => (err += d.toString()));
  const ready = new Promise<number>((resolve, reject) => {
    child.stdout?.on("data", (d: Buffer) => {
      out += d.toString();
      const m = /ready (\d+)/.exec(out);
      if (m) resolve(Number(m[1]));
      if (out.includes("drained")) resolve(Date.now());
    });
    child.once("exit", (code) => reject(new Error(`child exited (${code}) before it was ready: ${err}`)));
  });
  ready.catch(() => {});
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  return { child, ready, exited };
}

describe("meter crash (kill -9) and restart", () => {
  let database: Database;
  let dataDir: string;
  let server: ServerType;
  let billingUrl: string;
  beforeAll(async () => {
    database = await freshDatabase();
    dataDir = mkdtempSync(join(tmpdir(), "meter-crash-"));
    const port = await freePort();
    server = serve({
      fetch: appWithCaller(createBillingRoutes({ db: database.db, clock: systemClock, log: silentLogger, componentKey: componentKey(secret) })).fetch,
      port,
      hostname: "127.0.0.1",
    });
    billingUrl = `http://127.0.0.1:${port}`;
  });
  afterAll(async () => {
    server.close();
    await database.close();
    rmSync(dataDir, { recursive: true, force: true });
  });

  it("bills only real activity, at most once, losing at most one heartbeat per crash", async () => {
    let seed = Number(process.env.METER_CRASH_SEED ?? Date.now() % 100_000);
    const seedUsed = seed;
    const rnd = (lo: number, hi: number) => {
      seed = (seed * 1103515245 + 12345) & 0x7fffffff;
      return lo + (seed % (hi - lo + 1));
    };
    const t0 = Date.now() + 1500;
    const schedule: CrashChildConfig["schedule"] = [
      { vmId: "vm_0", runId: "run_0a", start: t0, end: t0 + 3000 },
      { vmId: "vm_0", runId: "run_0b", start: t0 + 3400, end: t0 + 8000 },
      { vmId: "vm_1", runId: "run_1a", start: t0 + 150, end: t0 + 8000 },
      { vmId: "vm_2", runId: "run_2a", start: t0 + 900, end: t0 + 1700 },
      { vmId: "vm_2", runId: "run_2b", start: t0 + 2300, end: t0 + 6100 },
      { vmId: "vm_2", runId: "run_2c", start: t0 + 6500, end: t0 + 7600 },
    ];
    const base: Omit<CrashChildConfig, "mode"> = { dataDir, hostId: "host_c", billingUrl, secret, heartbeatMs, schedule };
    const lifetimes: Interval[] = [];
    while (Date.now() < t0 + 8200) {
      const { child, ready, exited } = startChild({ ...base, mode: "run" });
      const readyAt = await ready;
      await new Promise((r) => setTimeout(r, rnd(150, 900)));
      const killAt = Date.now();
      child.kill("SIGKILL");
      await exited;
      lifetimes.push({ start: readyAt, end: killAt });
    }
    const drain = startChild({ ...base, mode: "drain" });
    expect(await drain.exited, "drain exits cleanly").toBe(0);
    expect(lifetimes.length).toBeGreaterThanOrEqual(5);

    const rows = await queryRows<{ id: string; s: string | number; e: string | number }>(
      database.db,
      sql`select id, (extract(epoch from started_at) * 1000)::int8 as s, (extract(epoch from ended_at) * 1000)::int8 as e from meter_segments order by started_at`,
    );
    const conflicts = await queryRows<{ n: number }>(database.db, sql`select count(*)::int as n from meter_conflicts`);
    expect(conflicts[0]?.n, `seed ${seedUsed}`).toBe(0);
    expect(existsSync(join(meterDir(dataDir, "host_c"), "rejected.ndjson"))).toBe(false);

    for (const vmId of ["vm_0", "vm_1", "vm_2"]) {
      const segs = rows.filter((r) => r.id.split(":")[1] === vmId).map((r) => ({ start: Number(r.s), end: Number(r.e) }));
      const intervals = schedule.filter((s) => s.vmId === vmId);
      // nothing twice: a VM's billed segments never overlap
      for (let i = 1; i < segs.length; i++) expect(segs[i]!.start, `${vmId} seed ${seedUsed}`).toBeGreaterThanOrEqual(segs[i - 1]!.end);
      // nothing invented: every segment lies inside a scheduled interval while a process was alive
      for (const s of segs) {
        const home = intervals.some((iv) => lifetimes.some((l) => s.start >= Math.max(iv.start, l.start) - 5 && s.end <= Math.min(iv.end, l.end) + slackMs));
        expect(home, `${vmId} segment ${new Date(s.start).toISOString()}–${new Date(s.end).toISOString()} seed ${seedUsed}`).toBe(true);
      }
      // loss per lifetime ≤ one heartbeat (the open segment at the kill) plus timer slack
      for (const l of lifetimes) {
        const truth = intervals.reduce((t, iv) => t + overlap(iv, l), 0);
        const billed = segs.filter((s) => s.start >= l.start - 5 && s.start < l.end).reduce((t, s) => t + (s.end - s.start), 0);
        expect(billed, `${vmId} lifetime ${l.start}-${l.end} seed ${seedUsed}`).toBeLessThanOrEqual(truth + slackMs);
        expect(truth - billed, `${vmId} loss in lifetime ${l.start}-${l.end} seed ${seedUsed}`).toBeLessThanOrEqual(heartbeatMs + slackMs);
      }
    }
  }, 60_000);
});

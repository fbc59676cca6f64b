// The usage CLI against a real server: tables, CSV, invoices, and a clear failure without the right token.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { serve, type ServerType } from "@hono/node-server";
import { Hono } from "hono";
import { ingestSegments } from "../../billing/ingest.ts";
import { createBillingRoutes } from "../../billing/routes.ts";
import { allScopes, type GatewayEnv } from "../../contracts/caller.ts";
import { ManualClock } from "../../lib/clock.ts";
import { toErrorResponse } from "../../lib/errors.ts";
import { componentKey } from "../../lib/host-token.ts";
import { silentLogger } from "../../lib/log.ts";
import type { Database } from "../../schema/db.ts";
import { freshDatabase } from "../helpers/db.ts";
import { freePort } from "../../scripts/postgres-server.ts";
import { runSegments, seedTenant } from "./billing-fixtures.ts";

const cli = fileURLToPath(new URL("../../scripts/usage.ts", import.meta.url));

function run(args: string[], env: Record<string, string> = {}): Promise<{ code: number; out: string; err: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [cli, ...args], { env: { ...process.env, ...env } }, (error, out, err) =>
      resolve({ code: error ? Number(error.code ?? 1) : 0, out, err }),
    );
  });
}

describe("npm run usage", () => {
  let database: Database;
  let server: ServerType;
  let url: string;
  beforeAll(async () => {
    database = await freshDatabase();
    await seedTenant(database.db, "ten_cli", "Europe/Berlin", ["agt_c1", "agt_c2"]);
    const clock = new ManualClock(Date.UTC(2026, 3, 1, 12)); // after March, inside its grace period
    await ingestSegments(
      database.db,
      runSegments({
        tenantId: "ten_cli",
        agentId: "agt_c1",
        vmId: "vm_c1",
        start: Date.UTC(2026, 2, 28, 22, 30),
        durationMs: 3_600_000,
        vcpus: 2,
        memMiB: 1024,
      }),
      clock,
    );
    await ingestSegments(
      database.db,
      runSegments({ tenantId: "ten_cli", agentId: "agt_c2", vmId: "vm_c2", start: Date.UTC(2026, 2, 29, 12), durationMs: 1_234_567 }),
      clock,
    );
    // stand-in for the gateway's auth: `Bearer test:<tenant>` is a caller of that tenant
    const app = new Hono<GatewayEnv>();
    app.use(async (c, next) => {
      c.set("requestId", "req_cli");
      const m = /^Bearer test:(\S+)$/.exec(c.req.header("authorization") ?? "");
      c.set("caller", m ? { tenantId: m[1]!, subject: "usr_cli", scopes: new Set(allScopes) } : undefined);
      await next();
    });
    app.onError((e, c) => toErrorResponse(e, c.get("requestId")));
    app.route("/", createBillingRoutes({ db: database.db, clock, log: silentLogger, componentKey: componentKey("a-component-secret-of-at-least-32-chars!") }));
    const port = await freePort();
    server = serve({ fetch: app.fetch, port, hostname: "127.0.0.1" });
    url = `http://127.0.0.1:${port}`;
  });
  afterAll(async () => {
    server.close();
    await database.close();
  });

  it("prints usage by agent and local day as a table with exact seconds and a total", async () => {
    const r = await run(
      ["--url", url, "--from", "2026-03-28", "--to", "2026-03-31", "--tz", "Europe/Berlin", "--group-by", "agent,day", "--tenant", "ten_cli"],
      { AGENTVM_TOKEN: "test:ten_cli" },
    );
    expect(r.err).toBe("");
    expect(r.code).toBe(0);
    const lines = r.out.trim().split("\n");
    expect(lines[0]).toMatch(/^window start\s+agent\s+active s\s+dozed s\s+hibernated s\s+vCPU-s\s+GiB-s$/);
    // 23:30–00:30 Berlin (UTC+1) on the 28th/29th, then 2 h later the DST change; agt_c2 at 14:00 CEST
    expect(lines.slice(2, 5).map((l) => l.split(/\s+/).slice(0, 3))).toEqual([
      ["2026-03-28T00:00:00+01:00", "agt_c1", "1800.000"],
      ["2026-03-29T00:00:00+01:00", "agt_c1", "1800.000"],
      ["2026-03-29T00:00:00+01:00", "agt_c2", "1234.567"],
    ]);
    expect(lines[5]).toMatch(/^total\s+4834\.567\s+0\.000\s+0\.000\s+8434\.567\s+3908\.642$/); // 1024 MiB × 3600 s + 256 MiB × 1234.567 s, in GiB-s
  });

  it("passes CSV through, prints invoices, and fails clearly without a valid token", async () => {
    const csv = await run(["--url", url, "--token", "test:ten_cli", "--from", "2026-03-01", "--to", "2026-04-01", "--csv"]);
    expect(csv.out).toBe(
      "window_start,window_end,active_ms,vcpu_ms,mib_ms,dozed_ms,dozed_vcpu_ms,dozed_mib_ms,hibernated_ms\r\n2026-03-01T00:00:00Z,2026-04-01T00:00:00Z,4834567,8434567,4002449152,0,0,0,0\r\n".replace(
        /Z/g,
        "+00:00",
      ),
    );
    const inv = await run(["--url", url, "--token", "test:ten_cli", "--invoice", "2026-03"]);
    expect(inv.code).toBe(0);
    expect(inv.out).toMatch(/^invoice inv_\w+ for 2026-03 \(draft; segments received before /);
    expect(inv.out).toContain("agt_c1  vcpu");
    expect(inv.out).toContain("agent agt_c1: active 3600.000 s, dozed 0.000 s, hibernated 0.000 s");
    expect(inv.out).toMatch(/total \d+\.\d\d USD/);
    const anon = await run(["--url", url, "--token", "nope", "--from", "2026-03-01", "--to", "2026-04-01"]);
    expect(anon.code).toBe(1);
    expect(anon.err).toMatch(/^401 unauthorized: /);
    const wrongTenant = await run(["--url", url, "--token", "test:ten_cli", "--tenant", "ten_other", "--from", "2026-03-01", "--to", "2026-04-01"]);
    expect(wrongTenant.err).toMatch(/^404 not_found/);
    const noToken = await run(["--url", url, "--from", "2026-03-01", "--to", "2026-04-01"], { AGENTVM_TOKEN: "" });
    expect(noToken.code).toBe(2);
  });
});

// Shared fixtures for billing and meter tests: wire segments, tenants/agents rows, and a routes app with a fake caller.
import { Hono } from "hono";
import { sql } from "drizzle-orm";
import type { MeterSegment, SegmentEndReason, SegmentStartReason } from "../../contracts/meter.ts";
import { allScopes, type GatewayEnv, type Scope } from "../../contracts/caller.ts";
import { asAppError } from "../../lib/api.ts";
import { toErrorResponse } from "../../lib/errors.ts";
import type { Db } from "../../schema/db.ts";
import { agents, tenants } from "../../schema/core.ts";

export function segment(p: Partial<MeterSegment> & { start: number; end: number; seq?: number }): MeterSegment {
  const hostId = p.hostId ?? "host_a";
  const vmId = p.vmId ?? "vm_a";
  const seq = p.seq ?? 0;
  return {
    id: `${hostId}:${vmId}:${seq}`,
    hostId,
    vmId,
    seq,
    tenantId: p.tenantId ?? "ten_a",
    agentId: p.agentId ?? "agt_a",
    runId: p.runId ?? "run_a",
    startedAt: new Date(p.start).toISOString(),
    endedAt: new Date(p.end).toISOString(),
    vcpus: p.vcpus ?? 1,
    memMiB: p.memMiB ?? 256,
    startReason: p.startReason ?? "request",
    endReason: p.endReason ?? "idle",
  };
}

/** One awake run cut into heartbeat segments, as a meter would produce it. */
export function runSegments(p: {
  hostId?: string;
  vmId?: string;
  tenantId?: string;
  agentId?: string;
  runId?: string;
  start: number;
  durationMs: number;
  heartbeatMs?: number;
  firstSeq?: number;
  vcpus?: number;
  memMiB?: number;
  wake?: SegmentStartReason;
  sleep?: SegmentEndReason;
}): MeterSegment[] {
  const hb = p.heartbeatMs ?? 10_000;
  const out: MeterSegment[] = [];
  let seq = p.firstSeq ?? 0;
  for (let off = 0; off < p.durationMs; off += hb) {
    const end = Math.min(p.durationMs, off + hb);
    out.push(
      segment({
        ...p,
        seq: seq++,
        start: p.start + off,
        end: p.start + end,
        startReason: off === 0 ? (p.wake ?? "request") : "heartbeat",
        endReason: end === p.durationMs ? (p.sleep ?? "idle") : "heartbeat",
      }),
    );
  }
  return out;
}

export async function seedTenant(db: Db, id: string, timeZone = "UTC", agentIds: string[] = []): Promise<void> {
  await db.insert(tenants).values({ id, name: id, timeZone }).onConflictDoNothing();
  for (const agentId of agentIds) await db.insert(agents).values({ id: agentId, tenantId: id, name: agentId, image: "demo" }).onConflictDoNothing();
}

/** Totals straight from the raw table (no splitting; less what overlapping segments left unbilled): what every report must add up to. */
export async function rawTotals(db: Db, tenantId?: string): Promise<{ n: number; activeMs: number; vcpuMs: number; mibMs: number }> {
  const where = tenantId ? sql`where tenant_id = ${tenantId}` : sql``;
  const rows = (await db.execute(sql`select count(*)::int as n,
      coalesce(sum(extract(epoch from ended_at - started_at) * 1000 - overlap_ms), 0)::int8 as a,
      coalesce(sum((extract(epoch from ended_at - started_at) * 1000 - overlap_ms) * vcpus), 0)::int8 as v,
      coalesce(sum((extract(epoch from ended_at - started_at) * 1000 - overlap_ms) * mem_mib), 0)::int8 as m
    from meter_segments ${where}`)) as unknown;
  const r = (Array.isArray(rows) ? rows[0] : (rows as { rows: unknown[] }).rows[0]) as Record<string, unknown>;
  return { n: Number(r.n), activeMs: Number(r.a), vcpuMs: Number(r.v), mibMs: Number(r.m) };
}

/**
 * Mounts `routes` behind a stand-in for the gateway's auth: `x-test-tenant` and `x-test-scopes` become the caller
 * (no header: no caller), and errors render as the one envelope.
 */
export function appWithCaller(routes: Hono<GatewayEnv>): Hono<GatewayEnv> {
  const app = new Hono<GatewayEnv>();
  app.use(async (c, next) => {
    c.set("requestId", "req_test");
    const tenant = c.req.header("x-test-tenant");
    const scopes = (c.req.header("x-test-scopes") ?? allScopes.join(",")).split(",").filter(Boolean) as Scope[];
    c.set("caller", tenant ? { tenantId: tenant, subject: "usr_test", scopes: new Set(scopes) } : undefined);
    await next();
  });
  app.onError((e, c) => toErrorResponse(asAppError(e), c.get("requestId") ?? "req_test"));
  app.route("/", routes);
  return app;
}

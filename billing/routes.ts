// Billing's HTTP API: meter ingest for hosts (component token) and tenant-scoped usage, runs and invoices (JSON or CSV).
import { Hono, type Context } from "hono";
import { requireScope, type GatewayEnv } from "../contracts/caller.ts";
import type { Clock } from "../lib/clock.ts";
import { AppError } from "../lib/errors.ts";
import { verifyComponentToken } from "../lib/host-token.ts";
import type { Logger } from "../lib/log.ts";
import type { Db } from "../schema/db.ts";
import { toCsv } from "./csv.ts";
import { ingestSegments } from "./ingest.ts";
import { defaultInvoiceGraceMs, finalizeInvoice, invoiceById, invoiceForMonth, listInvoices, type Invoice } from "./invoices.ts";
import { formatCents } from "./money.ts";
import { rateCardFor } from "./rates.ts";
import { agentRuns, assertAgentOfTenant, type RunReport } from "./runs.ts";
import { usageReport, type TimeGroup, type UsageReport } from "./usage.ts";
import { assertZone, formatInZone, parseInstant } from "./zones.ts";
import { wakeTimingKeys } from "../contracts/agent.ts";

export interface BillingRouteDeps {
  db: Db;
  clock: Clock;
  log: Logger;
  /** Key of component tokens (`componentKey(secret)`): hosts sign their shipments with it. */
  componentKey: Uint8Array;
  /** Grace after a month's end before its invoice can be final. Default 48 h. */
  invoiceGraceMs?: number;
}

/** Largest ingest body accepted (10,000 segments take about 3.5 MB). */
export const maxIngestBytes = 16 * 1024 * 1024;

function wantsCsv(c: Context<GatewayEnv>): boolean {
  const format = c.req.query("format");
  if (format !== undefined) {
    if (format !== "csv" && format !== "json") throw new AppError("bad_request", "format must be csv or json");
    return format === "csv";
  }
  return (c.req.header("accept") ?? "").includes("text/csv");
}

function csvResponse(c: Context<GatewayEnv>, body: string, name: string): Response {
  return c.body(body, 200, { "content-type": "text/csv; charset=utf-8", "content-disposition": `attachment; filename="${name}.csv"` });
}

/** A `tenantId` query parameter is allowed, but only naming the caller's own tenant. */
function checkTenantParam(c: Context<GatewayEnv>, tenantId: string): void {
  const asked = c.req.query("tenantId") ?? c.req.query("tenant");
  if (asked !== undefined && asked !== tenantId) throw new AppError("not_found", "tenant not found");
}

function parseGroupBy(raw: string | undefined): { byAgent: boolean; time?: TimeGroup; names: string[] } {
  const names = (raw ?? "")
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
  let byAgent = false;
  let time: TimeGroup | undefined;
  for (const n of names) {
    if (n === "agent") byAgent = true;
    else if (n === "hour" || n === "day") {
      if (time && time !== n) throw new AppError("bad_request", "groupBy takes hour or day, not both");
      time = n;
    } else if (n !== "tenant") throw new AppError("bad_request", `groupBy must be a comma list of agent, hour, day (or tenant); got "${n}"`);
  }
  return { byAgent, ...(time ? { time } : {}), names };
}

/** Formats instants in a zone, once per distinct instant (rows share their window boundaries; Intl is slow). */
function zoneFormatter(zone: string): (t: number) => string {
  const memo = new Map<number, string>();
  return (t) => {
    let s = memo.get(t);
    if (s === undefined) memo.set(t, (s = formatInZone(zone, t)));
    return s;
  };
}

function usageJson(r: UsageReport, names: string[]) {
  const z = r.query.zone;
  const fmt = zoneFormatter(z);
  return {
    tenantId: r.query.tenantId,
    from: formatInZone(z, r.query.from),
    to: formatInZone(z, r.query.to),
    timeZone: z,
    groupBy: names,
    ...(r.query.agentId !== undefined ? { agentId: r.query.agentId } : {}),
    source: r.source,
    rows: r.rows.map((row) =>
      row.agentId === undefined
        ? { start: fmt(row.start), end: fmt(row.end), activeMs: row.activeMs, vcpuMs: row.vcpuMs, mibMs: row.mibMs }
        : { start: fmt(row.start), end: fmt(row.end), agentId: row.agentId, activeMs: row.activeMs, vcpuMs: row.vcpuMs, mibMs: row.mibMs },
    ),
    totals: r.totals,
  };
}

function usageCsv(r: UsageReport): string {
  const fmt = zoneFormatter(r.query.zone);
  const byAgent = r.query.byAgent;
  const header = ["window_start", "window_end", ...(byAgent ? ["agent_id"] : []), "active_ms", "vcpu_ms", "mib_ms"];
  return toCsv(
    header,
    r.rows.map((row) => [fmt(row.start), fmt(row.end), ...(byAgent ? [row.agentId] : []), row.activeMs, row.vcpuMs, row.mibMs]),
  );
}

function invoiceJson(inv: Invoice) {
  const z = inv.timeZone;
  return {
    id: inv.id,
    tenantId: inv.tenantId,
    month: inv.month,
    timeZone: z,
    periodStart: formatInZone(z, inv.periodStart),
    periodEnd: formatInZone(z, inv.periodEnd),
    status: inv.status,
    cutoffAt: new Date(inv.cutoffAt).toISOString(),
    finalizableAt: new Date(inv.finalizableAt).toISOString(),
    currency: inv.currency,
    rates: inv.rates,
    lines: inv.lines,
    totalCents: inv.totalCents,
    total: formatCents(inv.totalCents),
  };
}

function invoiceCsv(inv: Invoice): string {
  return toCsv(
    ["invoice_id", "month", "status", "agent_id", "resource", "quantity", "unit", "unit_price_nanocents", "price_unit", "amount_cents"],
    [
      ...inv.lines.map((l) => [inv.id, inv.month, inv.status, l.agentId, l.resource, l.quantity, l.unit, l.unitPriceNanocents, l.priceUnit, l.amountCents]),
      [inv.id, inv.month, inv.status, "", "total", "", "", "", "", inv.totalCents],
    ],
  );
}

function runJson(r: RunReport) {
  return {
    runId: r.runId,
    hostId: r.hostId,
    vmId: r.vmId,
    wokeAt: new Date(r.wokeAt).toISOString(),
    wakeReason: r.wakeReason,
    wakeMode: r.wakeMode,
    timings: r.timings,
    sleptAt: r.sleptAt === undefined ? null : new Date(r.sleptAt).toISOString(),
    sleepReason: r.sleepReason ?? null,
    awakeMs: r.sleptAt === undefined ? null : r.sleptAt - r.wokeAt,
    activeMs: r.activeMs,
    vcpuMs: r.vcpuMs,
    mibMs: r.mibMs,
    segments: r.segments,
  };
}

/** CSV columns of a run's wake timings: every key of the contract, in its order. */
const timingColumns = wakeTimingKeys;

export function createBillingRoutes(deps: BillingRouteDeps): Hono<GatewayEnv> {
  const app = new Hono<GatewayEnv>();
  const graceMs = deps.invoiceGraceMs ?? defaultInvoiceGraceMs;

  app.post("/v1/meter-segments", async (c) => {
    const auth = c.req.header("authorization");
    const token = auth?.startsWith("Bearer ") ? auth.slice(7).trim() : undefined;
    const claims = await verifyComponentToken(deps.componentKey, token, "billing");
    const declared = Number(c.req.header("content-length") ?? "0");
    if (declared > maxIngestBytes) throw new AppError("payload_too_large", `meter batches may be at most ${maxIngestBytes} bytes`);
    const text = await c.req.text();
    if (text.length > maxIngestBytes) throw new AppError("payload_too_large", `meter batches may be at most ${maxIngestBytes} bytes`);
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch {
      throw new AppError("bad_request", "body must be JSON: {\"segments\": [...]}");
    }
    const segments = (body as { segments?: unknown } | null)?.segments;
    if (!Array.isArray(segments)) throw new AppError("bad_request", "body must be JSON: {\"segments\": [...]}");
    const result = await ingestSegments(deps.db, segments, deps.clock, { hostId: claims.sub, log: deps.log.child({ hostId: claims.sub, requestId: c.get("requestId") }) });
    return c.json(result);
  });

  app.get("/v1/usage", async (c) => {
    const caller = requireScope(c, "usage:read");
    checkTenantParam(c, caller.tenantId);
    const zone = assertZone(c.req.query("tz") ?? "UTC");
    const fromRaw = c.req.query("from");
    const toRaw = c.req.query("to");
    if (!fromRaw || !toRaw) throw new AppError("bad_request", "from and to are required (ISO 8601 instants or YYYY-MM-DD dates in tz)");
    const from = parseInstant(fromRaw, zone, "from");
    const to = parseInstant(toRaw, zone, "to");
    const group = parseGroupBy(c.req.query("groupBy"));
    const agentId = c.req.query("agentId");
    if (agentId !== undefined) await assertAgentOfTenant(deps.db, caller.tenantId, agentId);
    const csv = wantsCsv(c);
    const report = await usageReport(deps.db, {
      tenantId: caller.tenantId,
      from,
      to,
      zone,
      byAgent: group.byAgent,
      ...(group.time ? { time: group.time } : {}),
      ...(agentId !== undefined ? { agentId } : {}),
    });
    return csv ? csvResponse(c, usageCsv(report), "usage") : c.json(usageJson(report, group.names));
  });

  app.get("/v1/agents/:id/runs", async (c) => {
    const caller = requireScope(c, "usage:read");
    const zone = "UTC";
    const opt = (name: string) => {
      const v = c.req.query(name);
      return v === undefined ? undefined : parseInstant(v, zone, name);
    };
    const limitRaw = c.req.query("limit");
    const limit = limitRaw === undefined ? 100 : Number(limitRaw);
    if (!Number.isInteger(limit) || limit < 1 || limit > 1000) throw new AppError("bad_request", "limit must be an integer from 1 to 1000");
    const csv = wantsCsv(c);
    const from = opt("from");
    const to = opt("to");
    const before = opt("before");
    const runs = await agentRuns(deps.db, caller.tenantId, c.req.param("id"), {
      limit,
      ...(from !== undefined ? { from } : {}),
      ...(to !== undefined ? { to } : {}),
      ...(before !== undefined ? { before } : {}),
    });
    if (csv) {
      return csvResponse(
        c,
        toCsv(
          ["run_id", "woke_at", "wake_reason", "wake_mode", ...timingColumns.map((t) => t.replace(/[A-Z]/g, (m) => `_${m.toLowerCase()}`)), "slept_at", "sleep_reason", "active_ms", "vcpu_ms", "mib_ms", "segments"],
          runs.map((r) => [
            r.runId,
            new Date(r.wokeAt).toISOString(),
            r.wakeReason,
            r.wakeMode,
            ...timingColumns.map((t) => r.timings[t]),
            r.sleptAt === undefined ? "" : new Date(r.sleptAt).toISOString(),
            r.sleepReason ?? "",
            r.activeMs,
            r.vcpuMs,
            r.mibMs,
            r.segments,
          ]),
        ),
        "runs",
      );
    }
    const last = runs.at(-1);
    return c.json({ agentId: c.req.param("id"), runs: runs.map(runJson), ...(last && runs.length === limit ? { next: new Date(last.wokeAt).toISOString() } : {}) });
  });

  app.get("/v1/invoices", async (c) => {
    const caller = requireScope(c, "usage:read");
    checkTenantParam(c, caller.tenantId);
    const month = c.req.query("month");
    const csv = wantsCsv(c);
    if (month === undefined) {
      const list = await listInvoices(deps.db, caller.tenantId);
      return csv ? csvResponse(c, toCsv(["invoice_id", "month", "status", "total_cents", "currency"], list.map((i) => [i.id, i.month, i.status, i.totalCents, i.currency])), "invoices") : c.json({ invoices: list });
    }
    const inv = await invoiceForMonth(deps.db, deps.clock, caller.tenantId, month, { graceMs });
    return csv ? csvResponse(c, invoiceCsv(inv), `invoice-${inv.month}`) : c.json(invoiceJson(inv));
  });

  app.get("/v1/invoices/:id", async (c) => {
    const caller = requireScope(c, "usage:read");
    const csv = wantsCsv(c);
    const inv = await invoiceById(deps.db, deps.clock, caller.tenantId, c.req.param("id"), { graceMs });
    return csv ? csvResponse(c, invoiceCsv(inv), `invoice-${inv.month}`) : c.json(invoiceJson(inv));
  });

  app.post("/v1/invoices/:month/finalize", async (c) => {
    const caller = requireScope(c, "agents:admin");
    const inv = await finalizeInvoice(deps.db, deps.clock, caller.tenantId, c.req.param("month"), { graceMs });
    deps.log.info("invoice final", { tenantId: caller.tenantId, invoiceId: inv.id, month: inv.month, totalCents: inv.totalCents, requestId: c.get("requestId") });
    return c.json(invoiceJson(inv));
  });

  app.get("/v1/rate-card", async (c) => {
    const caller = requireScope(c, "usage:read");
    const card = await rateCardFor(deps.db, caller.tenantId);
    return c.json({ ...card, units: { vcpuSecondNanocents: "nano-cents per vCPU-second", gibSecondNanocents: "nano-cents per GiB-second", snapshotGibMonthNanocents: "nano-cents per GiB-month (730 h)" } });
  });

  return app;
}

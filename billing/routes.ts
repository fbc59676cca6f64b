// Billing's HTTP API: meter ingest for hosts (component token), tenant-scoped usage, runs and invoices (JSON or CSV), and rate-card versions (operator).
import { createRoute } from "@hono/zod-openapi";
import { eq } from "drizzle-orm";
import type { Context, MiddlewareHandler } from "hono";
import { requireScope, scopeGate, type GatewayEnv, type GatewayVariables } from "../contracts/caller.ts";
import { apiRouter, badCursor, decodeCursor, errors, json, jsonBody, jsonRequest, pageOf, z } from "../lib/api.ts";
import type { Clock } from "../lib/clock.ts";
import { AppError } from "../lib/errors.ts";
import { verifyComponentToken } from "../lib/host-token.ts";
import type { Logger } from "../lib/log.ts";
import { createDbAuditLog, type DbAuditLog } from "../schema/audit-log.ts";
import type { Db } from "../schema/db.ts";
import { tenants } from "../schema/core.ts";
import {
  AgentIdParams,
  FormatQuery,
  Invoice,
  InvoiceIdParams,
  InvoicePage,
  InvoicesQuery,
  MeterBatch,
  MeterIngestResult,
  maxRateCardBodyBytes,
  MonthParams,
  NewRateCardVersion,
  RateCard,
  RateCardsQuery,
  RateCardVersion,
  RateCardVersionPage,
  TenantIdParams,
  TenantRateCards,
  RunPage,
  RunsQuery,
  Usage,
  UsageQuery,
} from "./api-schemas.ts";
import { ingestSegments } from "./ingest.ts";
import { defaultInvoiceGraceMs, finalizeInvoice, invoiceById, invoiceForMonth, listInvoices } from "./invoices.ts";
import { addRateCardVersion, defaultRateCardAt, latestRateInstant, listRateCardVersions, nextQuarterHour, rateCardAt, tenantRateCardTimeline } from "./rates.ts";
import { invoiceCsv, invoiceJson, invoiceListCsv, rateCardVersionJson, runJson, runsCsv, usageCsv, usageJsonBytes } from "./report-views.ts";
import { agentRuns, assertAgentOfTenant, type RunPosition } from "./runs.ts";
import { usageTable } from "./usage.ts";
import { parseInstant } from "./zones.ts";

export interface BillingRouteDeps {
  db: Db;
  clock: Clock;
  log: Logger;
  /** Key of component tokens (`componentKey(secret)`): hosts sign their shipments with it. */
  componentKey: Uint8Array;
  /** Grace after a month's end before its invoice can be final. Default 48 h. */
  invoiceGraceMs?: number;
  /** Where rate-card versions are recorded (`rate_card.create`); default the Postgres audit log over `db`. */
  audit?: DbAuditLog;
  /** Most rollup queries one usage report runs at once (usage.ts `rollupParts`); default 2, 1 for one query. */
  usageParts?: number;
}

/** Largest ingest body accepted (10,000 segments take about 3.5 MB). */
export const maxIngestBytes = 16 * 1024 * 1024;

/** The meter route's context: the host its component token names. */
type MeterEnv = { Variables: GatewayVariables & { meterHostId: string } };

const csvText = z.string().openapi({ description: "RFC 4180 CSV with a header row" });
const nextCursorHeader = z.object({ "x-next-cursor": z.string().optional().openapi({ description: "The next page's cursor, when there is one" }) });

/** A 200 answer that is JSON, or CSV with `format=csv` / `Accept: text/csv`. */
function jsonOrCsv<T extends z.ZodType>(schema: T, description: string, opts: { paged?: boolean } = {}) {
  return { description, ...(opts.paged ? { headers: nextCursorHeader } : {}), content: { "application/json": { schema }, "text/csv": { schema: csvText } } } as const;
}

function wantsCsv(c: Context, format: "json" | "csv" | undefined): boolean {
  return format !== undefined ? format === "csv" : (c.req.header("accept") ?? "").includes("text/csv");
}

function csvResponse(c: Context, body: string, name: string, nextCursor: string | null = null): Response {
  return c.body(body, 200, {
    "content-type": "text/csv; charset=utf-8",
    "content-disposition": `attachment; filename="${name}.csv"`,
    ...(nextCursor ? { "x-next-cursor": nextCursor } : {}),
  });
}

/** A `tenantId` query parameter is allowed, but only naming the caller's own tenant. */
function checkTenantParam(query: { tenantId?: string | undefined; tenant?: string | undefined }, tenantId: string): void {
  const asked = query.tenantId ?? query.tenant;
  if (asked !== undefined && asked !== tenantId) throw new AppError("not_found", "tenant not found");
}


/** A runs cursor: `woke_at` to the microsecond as the page query wrote it, and the run id. */
function runPosition(cursor: string): RunPosition {
  const [wokeAt, runId] = decodeCursor(cursor, ["string", "string"]) as [string, string];
  if (!/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$/.test(wokeAt) || !Number.isFinite(Date.parse(wokeAt)) || runId.length > 200) throw badCursor();
  return { wokeAt, runId };
}

/** A rate-card versions cursor: the `effectiveFrom` (epoch ms) of the last version shown (unique per card). */
function versionPosition(cursor: string): number {
  const [at] = decodeCursor(cursor, ["number"]) as [number];
  if (!Number.isSafeInteger(at)) throw badCursor();
  return at;
}

/** An invoices cursor: the month of the last invoice shown. */
function monthPosition(cursor: string): string {
  const [month] = decodeCursor(cursor, ["string"]) as [string];
  if (!/^\d{4}-\d{2}$/.test(month)) throw badCursor();
  return month;
}

const tags = ["billing"];

const ingestRoute = createRoute({
  method: "post",
  path: "/v1/meter-segments",
  operationId: "ingestMeterSegments",
  summary: "Ship meter segments (a host, with its component token of audience billing); idempotent per segment id",
  tags,
  request: jsonRequest(MeterBatch),
  responses: { 200: json(MeterIngestResult, "Each segment accepted, a duplicate, or rejected with its code"), ...errors(400, 413) },
});

const usageRoute = createRoute({
  method: "get",
  middleware: [scopeGate("usage:read")],
  path: "/v1/usage",
  operationId: "getUsage",
  summary: "Active time, vCPU-ms and MiB-ms of the tenant over [from, to), by agent and/or local hour or day in a zone",
  tags,
  request: { query: UsageQuery },
  responses: { 200: jsonOrCsv(Usage, "The usage rows and their totals"), ...errors(400, 404) },
});

const runsRoute = createRoute({
  method: "get",
  middleware: [scopeGate("usage:read")],
  path: "/v1/agents/{id}/runs",
  operationId: "listAgentRuns",
  summary: "The agent's awake runs, newest first: what woke it, the wake's timings, what put it to sleep, metered time",
  tags,
  request: { params: AgentIdParams, query: RunsQuery },
  responses: { 200: jsonOrCsv(RunPage, "A page of runs", { paged: true }), ...errors(400, 404) },
});

const invoicesRoute = createRoute({
  method: "get",
  middleware: [scopeGate("usage:read")],
  path: "/v1/invoices",
  operationId: "listInvoices",
  summary: "The tenant's invoices, newest month first; with `month`, that month's invoice",
  tags,
  request: { query: InvoicesQuery },
  responses: { 200: jsonOrCsv(z.union([InvoicePage, Invoice]), "A page of invoices (an Invoice with `month`)", { paged: true }), ...errors(400, 404) },
});

const invoiceRoute = createRoute({
  method: "get",
  middleware: [scopeGate("usage:read")],
  path: "/v1/invoices/{id}",
  operationId: "getInvoice",
  summary: "One invoice with its lines: stored if final, computed now if a draft",
  tags,
  request: { params: InvoiceIdParams, query: FormatQuery },
  responses: { 200: jsonOrCsv(Invoice, "The invoice"), ...errors(400, 404) },
});

const finalizeRoute = createRoute({
  method: "post",
  middleware: [scopeGate("agents:admin")],
  path: "/v1/invoices/{month}/finalize",
  operationId: "finalizeInvoice",
  summary: "Freeze the month's invoice (agents:admin): from the month's end + grace; finalizing twice answers the same invoice",
  tags,
  request: { params: MonthParams },
  responses: { 200: json(Invoice, "The final invoice"), ...errors(400, 409) },
});

const rateCardRoute = createRoute({
  method: "get",
  middleware: [scopeGate("usage:read")],
  path: "/v1/rate-card",
  operationId: "getRateCard",
  summary: "The prices in effect now for the tenant (its card version, or the default card's); see /v1/rate-cards for every version",
  tags,
  responses: { 200: json(RateCard, "The tenant's rate card (or the default one)"), ...errors() },
});

// The operator's routes: an operator token's own tenant need not exist (the gateway's tenant gate reads this).
const operatorOnly = scopeGate("operator", { tenantGate: "not-operators" });
const operatorBody = [operatorOnly, jsonBody(() => maxRateCardBodyBytes)];
const rateTags = ["rate cards"];

const addTenantVersionRoute = createRoute({
  method: "post",
  middleware: operatorBody,
  path: "/v1/tenants/{id}/rate-cards",
  operationId: "addTenantRateCardVersion",
  summary: "Add a version of the tenant's card (operator): it prices the tenant's usage from `effectiveFrom` until its next version",
  tags: rateTags,
  request: { params: TenantIdParams, ...jsonRequest(NewRateCardVersion) },
  responses: {
    201: json(RateCardVersion, "The version written"),
    ...errors(400, 404, 409, 413),
  },
});

const listTenantVersionsRoute = createRoute({
  method: "get",
  middleware: [operatorOnly],
  path: "/v1/tenants/{id}/rate-cards",
  operationId: "listTenantRateCardVersions",
  summary: "The tenant's own card versions, newest first, and the version pricing it now (operator)",
  tags: rateTags,
  request: { params: TenantIdParams, query: RateCardsQuery },
  responses: { 200: json(RateCardVersionPage, "A page of versions"), ...errors(400, 404) },
});

const addDefaultVersionRoute = createRoute({
  method: "post",
  middleware: operatorBody,
  path: "/v1/rate-cards/default",
  operationId: "addDefaultRateCardVersion",
  summary: "Add a version of the default card (operator): it prices every tenant without a version of its own at that time",
  tags: rateTags,
  request: jsonRequest(NewRateCardVersion),
  responses: { 201: json(RateCardVersion, "The version written"), ...errors(400, 409, 413) },
});

const listDefaultVersionsRoute = createRoute({
  method: "get",
  middleware: [operatorOnly],
  path: "/v1/rate-cards/default",
  operationId: "listDefaultRateCardVersions",
  summary: "The default card's versions, newest first, and the one in effect now (operator)",
  tags: rateTags,
  request: { query: RateCardsQuery },
  responses: { 200: json(RateCardVersionPage, "A page of versions"), ...errors(400) },
});

const tenantRateCardsRoute = createRoute({
  method: "get",
  // A tenant's route, but an operator token here is not checked for its tenant either (as ever under /v1/rate-cards).
  middleware: [scopeGate("usage:read", { tenantGate: "not-operators" })],
  path: "/v1/rate-cards",
  operationId: "listRateCards",
  summary: "The card version pricing the caller's tenant now, and every version that priced or will price it (past and scheduled)",
  tags: rateTags,
  request: { query: RateCardsQuery },
  responses: { 200: json(TenantRateCards, "The current version and a page of versions"), ...errors(400) },
});

export function createBillingRoutes(deps: BillingRouteDeps) {
  const app = apiRouter<GatewayEnv>();
  const graceMs = deps.invoiceGraceMs ?? defaultInvoiceGraceMs;

  /** Before the body is read: only a host with a billing component token ships segments, and only its own. */
  const hostToken: MiddlewareHandler<MeterEnv> = async (c, next) => {
    const auth = c.req.header("authorization");
    const token = auth?.startsWith("Bearer ") ? auth.slice(7).trim() : undefined;
    c.set("meterHostId", (await verifyComponentToken(deps.componentKey, token, "billing")).sub);
    await next();
  };

  const ingestMiddleware: [typeof hostToken, MiddlewareHandler<MeterEnv>] = [hostToken, jsonBody(() => maxIngestBytes)];
  app.openapi({ ...ingestRoute, middleware: ingestMiddleware }, async (c) => {
    const hostId = c.get("meterHostId");
    const { segments } = c.req.valid("json");
    const result = await ingestSegments(deps.db, segments, deps.clock, { hostId, log: deps.log.child({ hostId, requestId: c.get("requestId") }) });
    return c.json(result, 200);
  });

  app.openapi(usageRoute, async (c) => {
    const caller = requireScope(c, "usage:read");
    const q = c.req.valid("query");
    checkTenantParam(q, caller.tenantId);
    if (q.agentId !== undefined) await assertAgentOfTenant(deps.db, caller.tenantId, q.agentId);
    const query = {
      tenantId: caller.tenantId,
      from: parseInstant(q.from, q.tz, "from"),
      to: parseInstant(q.to, q.tz, "to"),
      zone: q.tz,
      byAgent: q.groupBy.byAgent,
      ...(q.groupBy.time ? { time: q.groupBy.time } : {}),
      ...(q.agentId !== undefined ? { agentId: q.agentId } : {}),
    };
    const report = await usageTable(deps.db, query, deps.usageParts === undefined ? {} : { parts: deps.usageParts });
    if (wantsCsv(c, q.format)) return csvResponse(c, usageCsv(report), "usage");
    // the bytes c.json would send (report-views.ts `usageJsonBytes`), written without an object per row
    return c.body(usageJsonBytes(report, q.groupBy.names), 200, { "content-type": "application/json" });
  });

  app.openapi(runsRoute, async (c) => {
    const caller = requireScope(c, "usage:read");
    const { id } = c.req.valid("param");
    const q = c.req.valid("query");
    const until = q.until ?? q.to;
    const rows = await agentRuns(deps.db, caller.tenantId, id, {
      limit: q.limit + 1,
      ...(q.from !== undefined ? { from: parseInstant(q.from, "UTC", "from") } : {}),
      ...(until !== undefined ? { until: parseInstant(until, "UTC", "until") } : {}),
      ...(q.cursor !== undefined ? { after: runPosition(q.cursor) } : {}),
    });
    const page = pageOf(rows, q.limit, (r) => [r.position.wokeAt, r.position.runId]);
    if (wantsCsv(c, q.format)) return csvResponse(c, runsCsv(page.items), "runs", page.nextCursor);
    return c.json({ agentId: id, runs: page.items.map(runJson), nextCursor: page.nextCursor }, 200);
  });

  app.openapi(invoicesRoute, async (c) => {
    const caller = requireScope(c, "usage:read");
    const q = c.req.valid("query");
    checkTenantParam(q, caller.tenantId);
    const csv = wantsCsv(c, q.format);
    if (q.month !== undefined) {
      const inv = await invoiceForMonth(deps.db, deps.clock, caller.tenantId, q.month, { graceMs });
      return csv ? csvResponse(c, invoiceCsv(inv), `invoice-${inv.month}`) : c.json(invoiceJson(inv), 200);
    }
    const rows = await listInvoices(deps.db, caller.tenantId, { limit: q.limit + 1, ...(q.cursor !== undefined ? { afterMonth: monthPosition(q.cursor) } : {}) });
    const page = pageOf(rows, q.limit, (i) => [i.month]);
    return csv ? csvResponse(c, invoiceListCsv(page.items), "invoices", page.nextCursor) : c.json({ invoices: page.items, nextCursor: page.nextCursor }, 200);
  });

  app.openapi(invoiceRoute, async (c) => {
    const caller = requireScope(c, "usage:read");
    const inv = await invoiceById(deps.db, deps.clock, caller.tenantId, c.req.valid("param").id, { graceMs });
    return wantsCsv(c, c.req.valid("query").format) ? csvResponse(c, invoiceCsv(inv), `invoice-${inv.month}`) : c.json(invoiceJson(inv), 200);
  });

  app.openapi(finalizeRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const finalizeAudit = { log: audit, actor: caller.subject, requestId: c.get("requestId") ?? null };
    const inv = await finalizeInvoice(deps.db, deps.clock, caller.tenantId, c.req.valid("param").month, { graceMs, audit: finalizeAudit });
    deps.log.info("invoice final", { tenantId: caller.tenantId, invoiceId: inv.id, month: inv.month, totalCents: inv.totalCents, requestId: c.get("requestId") });
    return c.json(invoiceJson(inv), 200);
  });

  const audit = deps.audit ?? createDbAuditLog(deps.db);

  const assertTenant = async (id: string) => {
    const [row] = await deps.db.select({ id: tenants.id }).from(tenants).where(eq(tenants.id, id));
    if (!row) throw new AppError("not_found", "tenant not found");
  };

  /** Writes a version from a request body; without `effectiveFrom` it starts at the next quarter hour. */
  const addVersion = async (c: Context<GatewayEnv>, tenantId: string | null, body: z.infer<typeof NewRateCardVersion>) => {
    const caller = requireScope(c, "operator");
    const effectiveFrom = body.effectiveFrom !== undefined ? parseInstant(body.effectiveFrom, "UTC", "effectiveFrom") : nextQuarterHour(deps.clock.now());
    const { effectiveFrom: _, ...rates } = body;
    const card = await addRateCardVersion(deps.db, tenantId, rates, effectiveFrom, caller.subject, { audit, requestId: c.get("requestId") ?? null });
    deps.log.info("rate card version", { tenantId, rateCardId: card.id, effectiveFrom: new Date(card.effectiveFrom).toISOString(), by: caller.subject, requestId: c.get("requestId") });
    return rateCardVersionJson(card);
  };

  app.openapi(addTenantVersionRoute, async (c) => {
    const { id } = c.req.valid("param");
    return c.json(await addVersion(c, id, c.req.valid("json")), 201);
  });

  app.openapi(addDefaultVersionRoute, async (c) => c.json(await addVersion(c, null, c.req.valid("json")), 201));

  const versionPage = async (tenantId: string | null, q: z.infer<typeof RateCardsQuery>) => {
    const rows = await listRateCardVersions(deps.db, tenantId, { limit: q.limit + 1, ...(q.cursor !== undefined ? { before: versionPosition(q.cursor) } : {}) });
    const page = pageOf(rows, q.limit, (v) => [v.effectiveFrom]);
    const now = deps.clock.now();
    const current = tenantId === null ? await defaultRateCardAt(deps.db, now) : await rateCardAt(deps.db, tenantId, now);
    return { tenantId, current: rateCardVersionJson(current), versions: page.items.map(rateCardVersionJson), nextCursor: page.nextCursor };
  };

  app.openapi(listTenantVersionsRoute, async (c) => {
    requireScope(c, "operator");
    const { id } = c.req.valid("param");
    await assertTenant(id);
    return c.json(await versionPage(id, c.req.valid("query")), 200);
  });

  app.openapi(listDefaultVersionsRoute, async (c) => {
    requireScope(c, "operator");
    return c.json(await versionPage(null, c.req.valid("query")), 200);
  });

  app.openapi(tenantRateCardsRoute, async (c) => {
    const caller = requireScope(c, "usage:read");
    const q = c.req.valid("query");
    const before = q.cursor !== undefined ? versionPosition(q.cursor) : undefined;
    const pieces = (await tenantRateCardTimeline(deps.db, caller.tenantId)).filter((p) => before === undefined || p.from < before);
    const page = pageOf(pieces, q.limit, (p) => [p.from]);
    const now = deps.clock.now();
    const current = await rateCardAt(deps.db, caller.tenantId, now);
    // the last piece runs to the end of what instants can say: no next version is scheduled
    const openEnded = (p: { to: number }) => p.to > latestRateInstant;
    return c.json(
      {
        tenantId: caller.tenantId,
        current: rateCardVersionJson(current),
        versions: page.items.map((p) => ({ ...rateCardVersionJson(p.card), until: openEnded(p) ? null : new Date(p.to).toISOString() })),
        nextCursor: page.nextCursor,
      },
      200,
    );
  });

  app.openapi(rateCardRoute, async (c) => {
    const caller = requireScope(c, "usage:read");
    const card = await rateCardAt(deps.db, caller.tenantId, deps.clock.now());
    return c.json({ id: card.id, tenantId: card.tenantId, currency: card.currency, vcpuSecondNanocents: card.vcpuSecondNanocents, gibSecondNanocents: card.gibSecondNanocents, snapshotGibMonthNanocents: card.snapshotGibMonthNanocents, units: { vcpuSecondNanocents: "nano-cents per vCPU-second", gibSecondNanocents: "nano-cents per GiB-second", snapshotGibMonthNanocents: "nano-cents per GiB-month (730 h)" } }, 200);
  });

  return app;
}

// Invoices: the tenant's list or one month's, one invoice by id (JSON or CSV), and freezing a month's invoice.
import { createRoute } from "@hono/zod-openapi";
import { requireScope, scopeGate } from "../../contracts/caller.ts";
import { badCursor, decodeCursor, errors, json, pageOf, z } from "../../lib/api.ts";
import { Invoice, InvoiceIdParams, InvoicePage, InvoicesQuery, FormatQuery, MonthParams } from "../api-schemas.ts";
import { finalizeInvoice, invoiceById, invoiceForMonth, listInvoices } from "../invoices.ts";
import { invoiceCsv, invoiceJson, invoiceListCsv } from "../report-views.ts";
import type { BillingRouteContext, BillingRouter } from "./context.ts";
import { checkTenantParam, csvResponse, jsonOrCsv, tags, wantsCsv } from "./http.ts";

/** An invoices cursor: the month of the last invoice shown. */
function monthPosition(cursor: string): string {
  const [month] = decodeCursor(cursor, ["string"]) as [string];
  if (!/^\d{4}-\d{2}$/.test(month)) throw badCursor();
  return month;
}

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

export function addInvoiceRoutes(app: BillingRouter, deps: BillingRouteContext): void {
  const { graceMs } = deps;

  app.openapi(invoicesRoute, async (c) => {
    const caller = requireScope(c, "usage:read");
    const q = c.req.valid("query");
    checkTenantParam(q, caller.tenantId);
    const csv = wantsCsv(c, q.format);
    if (q.month !== undefined) {
      const inv = await invoiceForMonth(deps.db, deps.clock, caller.tenantId, q.month, { graceMs });
      return csv ? csvResponse(c, invoiceCsv(inv), `invoice-${inv.month}`) : c.json(invoiceJson(inv), 200);
    }
    const rows = await listInvoices(deps.db, caller.tenantId, {
      limit: q.limit + 1,
      ...(q.cursor !== undefined ? { afterMonth: monthPosition(q.cursor) } : {}),
    });
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
    const finalizeAudit = { log: deps.audit, actor: caller.subject, requestId: c.get("requestId") ?? null };
    const inv = await finalizeInvoice(deps.db, deps.clock, caller.tenantId, c.req.valid("param").month, { graceMs, audit: finalizeAudit });
    deps.log.info("invoice final", {
      tenantId: caller.tenantId,
      invoiceId: inv.id,
      month: inv.month,
      totalCents: inv.totalCents,
      requestId: c.get("requestId"),
    });
    return c.json(invoiceJson(inv), 200);
  });
}

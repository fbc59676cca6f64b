// Billing's HTTP API: meter ingest for hosts (component token), tenant-scoped usage, runs and invoices (JSON or CSV), and rate-card versions (operator).
// Each group of routes lives in routes/; they are added in the order the OpenAPI document lists them.
import type { GatewayEnv } from "../contracts/caller.ts";
import { apiRouter } from "../lib/api.ts";
import { createDbAuditLog } from "../schema/audit-log.ts";
import { defaultInvoiceGraceMs } from "./invoices.ts";
import type { BillingRouteDeps } from "./routes/context.ts";
import { addInvoiceRoutes } from "./routes/invoices.ts";
import { addMeterRoutes } from "./routes/meter.ts";
import { addRateCardRoutes } from "./routes/rate-cards.ts";
import { addUsageRoutes } from "./routes/usage.ts";

export type { BillingRouteDeps } from "./routes/context.ts";
export { maxIngestBytes } from "./routes/meter.ts";

export function createBillingRoutes(deps: BillingRouteDeps) {
  const app = apiRouter<GatewayEnv>();
  const context = { ...deps, graceMs: deps.invoiceGraceMs ?? defaultInvoiceGraceMs, audit: deps.audit ?? createDbAuditLog(deps.db) };
  addMeterRoutes(app, context);
  addUsageRoutes(app, context);
  addInvoiceRoutes(app, context);
  addRateCardRoutes(app, context);
  return app;
}

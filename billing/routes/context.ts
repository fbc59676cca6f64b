// What billing's routes are built over: the dependencies the composition root passes, and the router they join.
import type { OpenAPIHono } from "@hono/zod-openapi";
import type { GatewayEnv } from "../../contracts/caller.ts";
import type { Clock } from "../../lib/clock.ts";
import type { Logger } from "../../lib/log.ts";
import type { Metrics } from "../../lib/metrics.ts";
import type { DbAuditLog } from "../../schema/audit-log.ts";
import type { Db } from "../../schema/db.ts";

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
  /** Where ingest counts what it clipped (`agentvm_billing_overlap_*`); default nowhere. */
  metrics?: Metrics;
  /** Most rollup queries one usage report runs at once (usage.ts `rollupParts`); default 2, 1 for one query. */
  usageParts?: number;
}

/** The dependencies with their defaults applied once, for every group of routes. */
export interface BillingRouteContext extends BillingRouteDeps {
  graceMs: number;
  audit: DbAuditLog;
}

/** The router every group of billing's routes is added to. */
export type BillingRouter = OpenAPIHono<GatewayEnv>;

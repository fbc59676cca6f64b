// Tenant-scoped usage: the usage report and an agent's runs, JSON or CSV.
import { createRoute } from "@hono/zod-openapi";
import { requireScope, scopeGate } from "../../contracts/caller.ts";
import { badCursor, decodeCursor, errors, pageOf } from "../../lib/api.ts";
import { AgentIdParams, RunPage, RunsQuery, Usage, UsageQuery } from "../api-schemas.ts";
import { runJson, runsCsv, usageCsv, usageJsonBytes } from "../report-views.ts";
import { agentRuns, assertAgentOfTenant, type RunPosition } from "../runs.ts";
import { usageTable } from "../usage.ts";
import { parseInstant } from "../zones.ts";
import type { BillingRouteContext, BillingRouter } from "./context.ts";
import { checkTenantParam, csvResponse, jsonOrCsv, tags, wantsCsv } from "./http.ts";

/** A runs cursor: `woke_at` to the microsecond as the page query wrote it, and the run id. */
function runPosition(cursor: string): RunPosition {
  const [wokeAt, runId] = decodeCursor(cursor, ["string", "string"]) as [string, string];
  if (!/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$/.test(wokeAt) || !Number.isFinite(Date.parse(wokeAt)) || runId.length > 200) throw badCursor();
  return { wokeAt, runId };
}

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

export function addUsageRoutes(app: BillingRouter, deps: BillingRouteContext): void {
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
}

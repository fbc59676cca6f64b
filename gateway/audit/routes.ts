// `GET /v1/audit`: a tenant's audit log, newest first, paged on its chain's seq; `GET /v1/audit/verify`: the operator's check of the hash chains.
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import { apiRouter, badCursor, decodeCursor, errors, json, pageOf } from "../../lib/api.ts";
import { AppError } from "../../lib/errors.ts";
import { requireScope, scopeGate, type GatewayEnv } from "../../contracts/caller.ts";
import type { AuditReader } from "../../schema/audit-log.ts";
import type { GatewayDeps } from "../deps.ts";
import { AuditListQuery, AuditListSchema, AuditVerifyQuery, AuditVerifySchema } from "./api-schemas.ts";

const listAuditRoute = createRoute({
  method: "get",
  path: "/v1/audit",
  operationId: "listAudit",
  summary: "The caller's tenant's audit log, newest first, a page at a time",
  description:
    "Admin actions, wakes, hibernations and webhook deliveries, each with who, what, when and the request id; every entry carries its hash chain links (`seq`, `hash`, `prevHash`).",
  tags: ["audit"],
  middleware: [scopeGate("agents:admin")],
  request: { query: AuditListQuery },
  responses: { 200: json(AuditListSchema, "A page of entries"), ...errors(400) },
});

const verifyAuditRoute = createRoute({
  method: "get",
  path: "/v1/audit/verify",
  operationId: "verifyAudit",
  summary: "Recompute the audit hash chains and name the first broken row of each (operator)",
  tags: ["audit"],
  middleware: [scopeGate("operator", { tenantGate: "not-operators" })],
  request: { query: AuditVerifyQuery },
  responses: { 200: json(AuditVerifySchema, "The verdict of each chain"), ...errors(400) },
});

/** Without a reader (unit tests of other parts) the routes answer 503: the log is not readable here, not empty. */
const unreadable = () => Promise.reject(new AppError("database_unavailable", "the audit log is not readable here"));
const noReader: AuditReader = { list: unreadable, verify: unreadable, verifyAll: unreadable };

export function auditRoutes(deps: Pick<GatewayDeps, "auditReader">): OpenAPIHono<GatewayEnv> {
  const r = apiRouter<GatewayEnv>();
  const reader = deps.auditReader ?? noReader;

  r.openapi(listAuditRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const q = c.req.valid("query");
    const rows = await reader.list({
      tenantId: caller.tenantId,
      limit: q.limit + 1,
      ...(q.cursor !== undefined ? { beforeSeq: seqPosition(q.cursor) } : {}),
      ...(q.action !== undefined ? { action: q.action } : {}),
      ...(q.target !== undefined ? { target: q.target } : {}),
      ...(q.since !== undefined ? { since: new Date(q.since) } : {}),
      ...(q.until !== undefined ? { until: new Date(q.until) } : {}),
    });
    const page = pageOf(rows, q.limit, (last) => [last.seq]);
    return c.json({ entries: page.items.map((e) => ({ ...e, at: e.at.toISOString() })), nextCursor: page.nextCursor }, 200);
  });

  r.openapi(verifyAuditRoute, async (c) => {
    requireScope(c, "operator");
    const { tenant } = c.req.valid("query");
    const verdicts = tenant === undefined ? await reader.verifyAll() : [await reader.verify(tenant)];
    const chains = verdicts.map((v) => (v.ok ? { chain: v.chain, ok: true, rows: v.rows } : { chain: v.chain, ok: false, rows: v.rows, broken: v.broken }));
    return c.json({ ok: verdicts.every((v) => v.ok), chains }, 200);
  });

  return r;
}

/** The position a cursor of this list holds: the seq of the last entry shown. */
function seqPosition(cursor: string): number {
  const [seq] = decodeCursor(cursor, ["number"]) as [number];
  if (!Number.isSafeInteger(seq) || seq < 1) throw badCursor();
  return seq;
}

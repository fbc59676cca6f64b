// The operator's hosts API under /v1/hosts: list (paged) with each host's health, show, drain, undrain; drains audited.
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import type { Context } from "hono";
import { apiRouter, badCursor, decodeCursor, errors, json, pageOf } from "../../lib/api.ts";
import type { Clock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import { requireScope, scopeGate, type GatewayEnv } from "../../contracts/caller.ts";
import type { AuditLog } from "../../schema/audit-log.ts";
import { HostListQuery, HostListSchema, HostParams, HostSchema, hostIdPattern } from "./api-schemas.ts";
import type { HostRepo, HostRow } from "./repo.ts";

export interface HostRouteDeps {
  /** Built with the live window (HOST_LIVE_WINDOW_MS): it decides `live`. */
  hosts: HostRepo;
  audit: AuditLog;
  /** When a drain is recorded as having started. */
  clock: Clock;
  /** A host whose clock is further than this from the database's takes no new agents, ms. */
  maxClockSkewMs: number;
}

/** What health is judged by when a program passes nothing else: placement's defaults (HOST_LIVE_WINDOW_MS, MAX_CLOCK_SKEW_MS). */
export const defaultHostHealth = { liveWindowMs: 30_000, maxClockSkewMs: 2_000 } as const;

const tags = ["hosts"];
// The operator's routes: an operator token's own tenant need not exist (the tenant gate reads this).
const operator = scopeGate("operator", { tenantGate: "not-operators" });

const listHostsRoute = createRoute({
  method: "get",
  path: "/v1/hosts",
  operationId: "listHosts",
  summary: "List hosts by id, a page at a time, each with its health, load and agents (operator)",
  tags,
  middleware: [operator],
  request: { query: HostListQuery },
  responses: { 200: json(HostListSchema, "A page of hosts"), ...errors(400) },
});

const getHostRoute = createRoute({
  method: "get",
  path: "/v1/hosts/{id}",
  operationId: "getHost",
  summary: "A host with its health, load and agents (operator)",
  tags,
  middleware: [operator],
  request: { params: HostParams },
  responses: { 200: json(HostSchema, "The host"), ...errors(400, 404) },
});

const drainHostRoute = createRoute({
  method: "post",
  path: "/v1/hosts/{id}/drain",
  operationId: "drainHost",
  summary:
    "Drain a host: it takes no new agents, and its agents hibernate and wake on other hosts; answered once marked, the moves follow (operator; idempotent)",
  tags,
  middleware: [operator],
  request: { params: HostParams },
  responses: { 202: json(HostSchema, "Marked draining"), ...errors(400, 404) },
});

const undrainHostRoute = createRoute({
  method: "post",
  path: "/v1/hosts/{id}/undrain",
  operationId: "undrainHost",
  summary: "Stop draining a host: it takes new agents again (agents that moved away stay where they are; operator; idempotent)",
  tags,
  middleware: [operator],
  request: { params: HostParams },
  responses: { 200: json(HostSchema, "No longer draining"), ...errors(400, 404) },
});

export function hostRoutes(deps: HostRouteDeps): OpenAPIHono<GatewayEnv> {
  const r = apiRouter<GatewayEnv>();
  const { hosts } = deps;
  const view = (row: HostRow) => hostJson(row, deps);

  r.openapi(listHostsRoute, async (c) => {
    requireScope(c, "operator");
    const q = c.req.valid("query");
    const rows = await hosts.list({ limit: q.limit + 1, after: q.cursor === undefined ? undefined : hostPosition(q.cursor) });
    const page = pageOf(rows, q.limit, (last) => [last.id]);
    return c.json({ hosts: page.items.map(view), nextCursor: page.nextCursor }, 200);
  });

  r.openapi(getHostRoute, async (c) => {
    requireScope(c, "operator");
    const { id } = c.req.valid("param");
    const row = await hosts.get(id);
    if (!row) throw notFound(id);
    return c.json(view(row), 200);
  });

  // Hosts belong to no tenant: their rows go to the system's chain (tenant null), like the default rate card's.
  async function drainChange(c: Context<GatewayEnv>, draining: boolean) {
    const caller = requireScope(c, "operator");
    const id = c.req.param("id") ?? "";
    const result = await hosts.setDraining(id, draining ? new Date(deps.clock.now()) : null);
    if (!result) throw notFound(id);
    await deps.audit.record({
      tenantId: null,
      actor: caller.subject,
      action: draining ? "host.drain" : "host.undrain",
      target: id,
      requestId: c.get("requestId"),
      detail: { changed: result.changed, agents: result.host.agents, awakeAgents: result.host.awakeAgents },
    });
    return view(result.host);
  }

  r.openapi(drainHostRoute, async (c) => c.json(await drainChange(c, true), 202));
  r.openapi(undrainHostRoute, async (c) => c.json(await drainChange(c, false), 200));

  return r;
}

const notFound = (id: string) => new AppError("not_found", `host ${id} not found`);

/** The position a host list's cursor holds: the last host id shown. */
function hostPosition(cursor: string): string {
  const [id] = decodeCursor(cursor, ["string"]) as [string];
  if (!hostIdPattern.test(id)) throw badCursor();
  return id;
}

/** Whole seconds, or tenths below ten (a 6.4 s skew against a 5 s limit should not read "6 s"). */
function seconds(ms: number): string {
  const s = Math.abs(ms) / 1000;
  return s < 10 ? `${Number(s.toFixed(1))} s` : `${Math.round(s)} s`;
}

/** Why a host takes no new agents, each reason once, or null when it does. */
export function hostHealth(
  row: Pick<HostRow, "live" | "heartbeatAgeMs" | "clockSkewMs" | "drainingAt">,
  maxClockSkewMs: number,
): { healthy: boolean; why: string | null } {
  const reasons: string[] = [];
  if (!row.live) reasons.push(`no heartbeat for ${seconds(row.heartbeatAgeMs)}`);
  if (Math.abs(row.clockSkewMs) > maxClockSkewMs) reasons.push(`clock ${seconds(row.clockSkewMs)} ${row.clockSkewMs > 0 ? "ahead" : "behind"}`);
  if (row.drainingAt) reasons.push("draining");
  return reasons.length === 0 ? { healthy: true, why: null } : { healthy: false, why: reasons.join("; ") };
}

function hostJson(row: HostRow, deps: Pick<HostRouteDeps, "maxClockSkewMs">) {
  return {
    id: row.id,
    url: row.url,
    driver: row.driver,
    ...hostHealth(row, deps.maxClockSkewMs),
    live: row.live,
    lastHeartbeatAt: row.lastHeartbeatAt.toISOString(),
    heartbeatAgeMs: row.heartbeatAgeMs,
    startedAt: row.startedAt.toISOString(),
    clockSkewMs: row.clockSkewMs,
    capacityMiB: row.capacityMiB,
    usedMiB: row.usedMiB,
    awakeAgents: row.awakeAgents,
    agents: row.agents,
    draining: row.drainingAt !== null,
    drainingAt: row.drainingAt?.toISOString() ?? null,
  };
}

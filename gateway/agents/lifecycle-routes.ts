// The agents' lifecycle actions: hibernate, wake, keep-awake leases (add, drop), and the VM event log.
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import type { MiddlewareHandler } from "hono";
import { badCursor, decodeCursor, errors, json, jsonRequest, pageOf } from "../../lib/api.ts";
import { AppError } from "../../lib/errors.ts";
import { requireScope, type GatewayEnv } from "../../contracts/caller.ts";
import {
  AddLeaseBody,
  AgentEventListSchema,
  AgentParams,
  AgentStateSchema,
  EventListQuery,
  LeaseDroppedSchema,
  LeaseParams,
  LeaseSchema,
  WakeSchema,
} from "./api-schemas.ts";
import { agentSpec } from "./repo.ts";
import { admin, tags, type AgentRouteContext } from "./route-context.ts";
const hibernateAgentRoute = createRoute({
  method: "post",
  path: "/v1/agents/{id}/hibernate",
  operationId: "hibernateAgent",
  summary: "Hibernate an agent now",
  tags,
  middleware: [admin],
  request: { params: AgentParams },
  // 409: requests are in flight (the agent stays awake for them).
  responses: { 200: json(AgentStateSchema, "The state it is in"), ...errors(400, 404, 409, 502, 504) },
});
const wakeAgentRoute = createRoute({
  method: "post",
  path: "/v1/agents/{id}/wake",
  operationId: "wakeAgent",
  summary: "Wake an agent now",
  tags,
  middleware: [admin],
  request: { params: AgentParams },
  responses: { 200: json(WakeSchema, "Awake: how it woke and what that cost"), ...errors(400, 404, 502, 504) },
});
const addLeaseRoute = (body: MiddlewareHandler) =>
  createRoute({
    method: "post",
    path: "/v1/agents/{id}/leases",
    operationId: "addAgentLease",
    summary: "Keep an agent awake for a while (a lease), waking it",
    tags,
    middleware: [admin, body],
    request: { params: AgentParams, ...jsonRequest(AddLeaseBody) },
    responses: { 201: json(LeaseSchema, "The lease"), ...errors(400, 404, 413, 502, 504) },
  });
const dropLeaseRoute = createRoute({
  method: "delete",
  path: "/v1/agents/{id}/leases/{leaseId}",
  operationId: "dropAgentLease",
  summary: "End a lease before it expires",
  tags,
  middleware: [admin],
  request: { params: LeaseParams },
  responses: { 200: json(LeaseDroppedSchema, "Dropped"), ...errors(400, 404, 502, 504) },
});
const listEventsRoute = createRoute({
  method: "get",
  path: "/v1/agents/{id}/events",
  operationId: "listAgentEvents",
  summary: "An agent's VM event log (state transitions with reasons and timings), newest first, a page at a time",
  tags,
  middleware: [admin],
  request: { params: AgentParams, query: EventListQuery },
  responses: { 200: json(AgentEventListSchema, "A page of events"), ...errors(400, 404) },
});
export function registerAgentLifecycle(r: OpenAPIHono<GatewayEnv>, ctx: AgentRouteContext): void {
  const { deps, body, ownAgent, audit } = ctx;
  const { agents, fleet } = deps;
  r.openapi(hibernateAgentRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownAgent(caller, c.req.valid("param").id);
    const state = await fleet.hibernate(row.id);
    await audit(c, caller, "agent.hibernate", row.id, { state });
    return c.json({ id: row.id, state }, 200);
  });
  r.openapi(wakeAgentRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownAgent(caller, c.req.valid("param").id);
    const info = await fleet.wake(agentSpec(row), "api");
    await audit(c, caller, "agent.wake", row.id, { wake: info.wake, runId: info.runId });
    return c.json({ id: row.id, state: "running" as const, ...info }, 200);
  });
  r.openapi(addLeaseRoute(body), async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownAgent(caller, c.req.valid("param").id);
    const { ttlMs } = c.req.valid("json");
    const lease = await fleet.addLease(agentSpec(row), ttlMs);
    await audit(c, caller, "agent.lease", row.id, { leaseId: lease.leaseId, ttlMs });
    return c.json({ leaseId: lease.leaseId, agentId: row.id, expiresAt: new Date(lease.expiresAt).toISOString() }, 201);
  });
  r.openapi(dropLeaseRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const { id, leaseId } = c.req.valid("param");
    const row = await ownAgent(caller, id);
    if (!(await fleet.dropLease(row.id, leaseId))) throw new AppError("not_found", `lease ${leaseId.slice(0, 64)} not found`);
    await audit(c, caller, "agent.lease.drop", row.id, { leaseId });
    return c.json({ leaseId, dropped: true as const }, 200);
  });
  r.openapi(listEventsRoute, async (c) => {
    const row = await ownAgent(requireScope(c, "agents:admin"), c.req.valid("param").id);
    const q = c.req.valid("query");
    const beforeId = q.cursor === undefined ? undefined : eventPosition(q.cursor);
    const rows = await agents.events(row.id, { limit: q.limit + 1, beforeId, since: q.since, until: q.until });
    const page = pageOf(rows, q.limit, (last) => [last.id]);
    const events = page.items.map((e) => ({ ...e, at: e.at.toISOString() }));
    return c.json({ events, nextCursor: page.nextCursor }, 200);
  });
}

/** The position an event list's cursor holds: the id of the last event shown. */
function eventPosition(cursor: string): number {
  const [id] = decodeCursor(cursor, ["number"]) as [number];
  if (!Number.isSafeInteger(id) || id < 1) throw badCursor();
  return id;
}

// The agents' admin reads and edits: list (paged), get, update, delete.
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import type { MiddlewareHandler } from "hono";
import { badCursor, decodeCursor, errors, json, jsonRequest, pageOf } from "../../lib/api.ts";
import { AppError } from "../../lib/errors.ts";
import { requireScope, type GatewayEnv } from "../../contracts/caller.ts";
import type { VmState } from "../../contracts/agent.ts";
import { noOverrides, type AgentSettingsPatch } from "../proxy/agents.ts";
import { AgentDeletedSchema, AgentListQuery, AgentListSchema, AgentParams, AgentSchema, UpdateAgentBody } from "./api-schemas.ts";
import type { AgentPosition } from "./repo.ts";
import { admin, tags, type AgentRouteContext } from "./route-context.ts";
import { agentJson } from "./view.ts";
const listAgentsRoute = createRoute({
  method: "get",
  path: "/v1/agents",
  operationId: "listAgents",
  summary: "List the tenant's agents, oldest first, a page at a time",
  tags,
  middleware: [admin],
  request: { query: AgentListQuery },
  responses: { 200: json(AgentListSchema, "A page of agents"), ...errors(400) },
});
const getAgentRoute = createRoute({
  method: "get",
  path: "/v1/agents/{id}",
  operationId: "getAgent",
  summary: "An agent, with its live state",
  tags,
  middleware: [admin],
  request: { params: AgentParams },
  responses: { 200: json(AgentSchema, "The agent"), ...errors(400, 404) },
});
const updateAgentRoute = (body: MiddlewareHandler) =>
  createRoute({
    method: "patch",
    path: "/v1/agents/{id}",
    operationId: "updateAgent",
    summary: "Change what may change on a live agent: idle timeouts, non-waking rules (null = defaults), limits (null = global), egress (while it sleeps)",
    tags,
    middleware: [admin, body],
    request: { params: AgentParams, ...jsonRequest(UpdateAgentBody) },
    responses: { 200: json(AgentSchema, "The agent as changed"), ...errors(400, 404, 405, 409, 413) },
  });
const deleteAgentRoute = createRoute({
  method: "delete",
  path: "/v1/agents/{id}",
  operationId: "deleteAgent",
  summary: "Delete an agent (its VM is removed from its host)",
  tags,
  middleware: [admin],
  request: { params: AgentParams },
  responses: { 200: json(AgentDeletedSchema, "Deleted"), ...errors(400, 404, 502, 504) },
});
/** States in which the VM has started and runs on what it started with. */
const awakeStates = new Set<VmState>(["booting", "restoring", "running", "dozing", "snapshotting"]);

export function registerAgentCrud(r: OpenAPIHono<GatewayEnv>, ctx: AgentRouteContext): void {
  const { deps, proxy, body, view, ownAgent, audit } = ctx;
  const { agents, fleet, settings } = deps;
  // One query for the page, then one status read and one settings read for all of its agents.
  r.openapi(listAgentsRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const q = c.req.valid("query");
    const rows = await agents.page(caller.tenantId, {
      limit: q.limit + 1,
      after: q.cursor === undefined ? undefined : agentPosition(q.cursor),
      state: q.state,
      namePrefix: q.namePrefix,
      image: q.image,
    });
    const page = pageOf(rows, q.limit, (last) => [last.createdAtUs, last.id]);
    const ids = page.items.map((row) => row.id);
    const [statuses, overrides] = await Promise.all([fleet.statuses(ids), settings?.limitsMany(ids)]);
    const shown = page.items.map((row) => agentJson(row, statuses.get(row.id), proxy.limitsOf(row, overrides?.get(row.id) ?? noOverrides)));
    return c.json({ agents: shown, nextCursor: page.nextCursor }, 200);
  });
  r.openapi(getAgentRoute, async (c) => {
    const row = await ownAgent(requireScope(c, "agents:admin"), c.req.valid("param").id);
    return c.json(await view(row, await fleet.status(row.id)), 200);
  });
  r.openapi(updateAgentRoute(body), async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownAgent(caller, c.req.valid("param").id);
    if (!settings) throw new AppError("method_not_allowed", "this gateway cannot change agents");
    const b = c.req.valid("json");
    const patch: AgentSettingsPatch = {};
    if (b.idleTimeoutMs !== undefined) patch.idleTimeoutMs = b.idleTimeoutMs;
    if (b.streamIdleMs !== undefined) patch.streamIdleMs = b.streamIdleMs;
    if (b.nonWaking !== undefined) patch.nonWaking = b.nonWaking;
    if (b.limits) patch.limits = b.limits;
    if (b.allowEgress !== undefined && b.allowEgress !== row.allowEgress) {
      // The way out is set up when the VM starts: a running one keeps what it started with, so the change waits for
      // a sleep the caller asks for rather than taking effect at some later, unannounced wake.
      const state = (await fleet.status(row.id))?.state;
      if (state !== undefined && awakeStates.has(state))
        throw new AppError("conflict", `agent ${row.id} is ${state}: allowEgress changes while it sleeps (POST /v1/agents/${row.id}/hibernate first)`);
      patch.allowEgress = b.allowEgress;
    }
    await settings.update(row.id, patch);
    proxy.invalidate(row.id);
    await audit(c, caller, "agent.update", row.id, { ...patch });
    const updated = (await agents.get(row.id)) ?? row;
    return c.json(await view(updated, await fleet.status(row.id)), 200);
  });
  r.openapi(deleteAgentRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownAgent(caller, c.req.valid("param").id);
    await fleet.remove(row.id);
    await agents.markDeleted(row.id);
    // A pool's agent deleted by hand: its pool forks another to keep its size.
    if (row.poolId !== null) deps.pools?.kick(row.poolId);
    proxy.invalidate(row.id);
    await audit(c, caller, "agent.delete", row.id);
    return c.json({ id: row.id, deleted: true as const }, 200);
  });
}

/** The position an agent list's cursor holds: [createdAt in µs since the epoch, agent id]. */
function agentPosition(cursor: string): AgentPosition {
  const [createdAtUs, id] = decodeCursor(cursor, ["number", "string"]) as [number, string];
  if (!Number.isSafeInteger(createdAtUs) || createdAtUs < 0 || id.length > 100) throw badCursor();
  return { createdAtUs, id };
}

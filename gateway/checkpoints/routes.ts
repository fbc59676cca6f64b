// Checkpoints API under /v1/agents/{id}: take one, list (paged), get, delete, and roll the agent back to one (restore).
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import type { Context, MiddlewareHandler } from "hono";
import { apiRouter, badCursor, decodeCursor, errors, json, jsonBody, jsonRequest, pageOf } from "../../lib/api.ts";
import { AppError } from "../../lib/errors.ts";
import { isId } from "../../lib/ids.ts";
import type { VmStatus } from "../../contracts/agent.ts";
import type { Fleet } from "../../contracts/fleet.ts";
import { requireScope, scopeGate, type Caller, type GatewayEnv } from "../../contracts/caller.ts";
import { callerAction } from "../../schema/audit-log.ts";
import { agentSpec, ownAgent as findOwnAgent, type AgentRow } from "../agents/repo.ts";
import type { GatewayDeps } from "../deps.ts";
import { ownCheckpoint, type CheckpointPosition, type CheckpointRepo, type CheckpointRow } from "./repo.ts";
import {
  CheckpointDeletedSchema,
  CheckpointListQuery,
  CheckpointListSchema,
  CheckpointParams,
  CheckpointSchema,
  CreateCheckpointBody,
  RestoreBody,
} from "./api-schemas.ts";
import { AgentParams, AgentSchema } from "../agents/api-schemas.ts";
import { ResetSchema } from "../pools/api-schemas.ts";
import { resetToFork } from "./reset.ts";

/** What the checkpoint routes need besides the gateway's own parts: the rows' reader (none: 501 checkpoints_unsupported). */
export type CheckpointGatewayDeps = GatewayDeps & { checkpoints?: CheckpointRepo };

const tags = ["checkpoints"];
const admin = scopeGate("agents:admin");

const createCheckpointRoute = (body: MiddlewareHandler) =>
  createRoute({
    method: "post",
    path: "/v1/agents/{id}/checkpoints",
    operationId: "createCheckpoint",
    summary: "Keep a checkpoint of the agent: an immutable copy of its memory and disk (an awake agent pauses for it)",
    tags,
    middleware: [admin, body],
    request: { params: AgentParams, ...jsonRequest(CreateCheckpointBody) },
    // 409: the name is taken, or the agent never ran (nothing to copy); 501: its host's driver keeps no checkpoints.
    responses: { 201: json(CheckpointSchema, "The checkpoint"), ...errors(400, 404, 409, 413, 501, 502, 504) },
  });

const listCheckpointsRoute = createRoute({
  method: "get",
  path: "/v1/agents/{id}/checkpoints",
  operationId: "listCheckpoints",
  summary: "The agent's checkpoints, oldest first, a page at a time",
  tags,
  middleware: [admin],
  request: { params: AgentParams, query: CheckpointListQuery },
  responses: { 200: json(CheckpointListSchema, "A page of checkpoints"), ...errors(400, 404) },
});

const getCheckpointRoute = createRoute({
  method: "get",
  path: "/v1/agents/{id}/checkpoints/{checkpointId}",
  operationId: "getCheckpoint",
  summary: "One of the agent's checkpoints",
  tags,
  middleware: [admin],
  request: { params: CheckpointParams },
  responses: { 200: json(CheckpointSchema, "The checkpoint"), ...errors(400, 404) },
});

const deleteCheckpointRoute = createRoute({
  method: "delete",
  path: "/v1/agents/{id}/checkpoints/{checkpointId}",
  operationId: "deleteCheckpoint",
  summary: "Delete a checkpoint (its files are removed; agents forked from it keep theirs)",
  tags,
  middleware: [admin],
  request: { params: CheckpointParams },
  responses: { 200: json(CheckpointDeletedSchema, "Deleted"), ...errors(400, 404, 501, 502, 504) },
});

const restoreRoute = (body: MiddlewareHandler) =>
  createRoute({
    method: "post",
    path: "/v1/agents/{id}/restore",
    operationId: "restoreAgent",
    summary:
      "Roll the agent back to one of its checkpoints: stopped if awake, then hibernated on the checkpoint (its snapshot replaced); the next call wakes it",
    tags,
    middleware: [admin, body],
    request: { params: AgentParams, ...jsonRequest(RestoreBody) },
    responses: { 200: json(AgentSchema, "The agent, hibernated on the checkpoint"), ...errors(400, 404, 413, 501, 502, 504) },
  });

const resetRoute = createRoute({
  method: "post",
  path: "/v1/agents/{id}/reset",
  operationId: "resetAgent",
  summary:
    "Roll a forked agent back to the checkpoint it was forked from (`forkedFrom`): one episode ends, the next starts from the same state; it is woken in the background",
  tags,
  middleware: [admin],
  request: { params: AgentParams },
  // 409: the agent was not forked (or its checkpoint was deleted since).
  responses: { 200: json(ResetSchema, "The agent, rolled back (awake or waking)"), ...errors(400, 404, 409, 501, 502, 504) },
});

/**
 * The routes; `view` shows an agent as the agents API does (it is theirs). Every change is audited with the caller as
 * actor (`checkpoint.create`, `checkpoint.delete`, `agent.restore`, `agent.reset`); the host audits what it did (`vm.checkpoint`, the
 * transition to `hibernated`).
 */
export function checkpointRoutes(
  deps: CheckpointGatewayDeps,
  view: (row: AgentRow, status: VmStatus | undefined) => Promise<unknown>,
): OpenAPIHono<GatewayEnv> {
  const r = apiRouter<GatewayEnv>();
  const { agents, fleet, config } = deps;
  const body = jsonBody(() => config.maxApiBodyBytes);
  const ownAgent = (caller: Caller, id: string) => findOwnAgent(agents, caller, id);

  function audit(c: Context<GatewayEnv>, caller: Caller, action: string, target: string, detail: Record<string, unknown>) {
    return deps.audit.record(callerAction(caller, c.get("requestId"), action, target, detail));
  }

  /** The agent's own checkpoint, by id; 404 for another agent's (or tenant's). */
  async function agentsCheckpoint(caller: Caller, agentId: string, checkpointId: string): Promise<CheckpointRow> {
    const row = await ownCheckpoint(repo(deps), caller, checkpointId);
    if (row.agentId !== agentId) throw new AppError("not_found", `checkpoint ${checkpointId} not found`);
    return row;
  }

  r.openapi(createCheckpointRoute(body), async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownAgent(caller, c.req.valid("param").id);
    const { name } = c.req.valid("json");
    // Asked before the copy is made (the host and the unique index check again): a taken name costs nothing.
    if (name !== undefined && (await repo(deps).byName(row.id, name)))
      throw new AppError("conflict", `agent ${row.id} already has a checkpoint named "${name}"`);
    const taken = await op(fleet, "checkpoint")(agentSpec(row), { ...(name !== undefined ? { name } : {}), requestId: c.get("requestId") });
    await audit(c, caller, "checkpoint.create", row.id, { checkpointId: taken.id, name: taken.name, bytes: taken.bytes, pausedMs: taken.pausedMs });
    return c.json(checkpointJson(taken), 201);
  });

  r.openapi(listCheckpointsRoute, async (c) => {
    const row = await ownAgent(requireScope(c, "agents:admin"), c.req.valid("param").id);
    const q = c.req.valid("query");
    const rows = await repo(deps).page(row.id, { limit: q.limit + 1, after: q.cursor === undefined ? undefined : checkpointPosition(q.cursor) });
    const page = pageOf(rows, q.limit, (last) => [last.createdAtUs, last.id]);
    return c.json({ checkpoints: page.items.map(checkpointJson), nextCursor: page.nextCursor }, 200);
  });

  r.openapi(getCheckpointRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const { id, checkpointId } = c.req.valid("param");
    const row = await ownAgent(caller, id);
    return c.json(checkpointJson(await agentsCheckpoint(caller, row.id, checkpointId)), 200);
  });

  r.openapi(deleteCheckpointRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const { id, checkpointId } = c.req.valid("param");
    const row = await ownAgent(caller, id);
    const ckp = await agentsCheckpoint(caller, row.id, checkpointId);
    await op(fleet, "deleteCheckpoint")(row.id, ckp.id);
    await audit(c, caller, "checkpoint.delete", row.id, { checkpointId: ckp.id, name: ckp.name });
    return c.json({ id: ckp.id, deleted: true as const }, 200);
  });

  r.openapi(restoreRoute(body), async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownAgent(caller, c.req.valid("param").id);
    const { checkpoint } = c.req.valid("json");
    const ckp = isId("checkpoint", checkpoint) ? await agentsCheckpoint(caller, row.id, checkpoint) : await repo(deps).byName(row.id, checkpoint);
    if (!ckp) throw new AppError("not_found", `checkpoint: agent ${row.id} has no checkpoint named "${checkpoint.slice(0, 100)}"`);
    const state = await op(fleet, "restoreCheckpoint")(agentSpec(row), ckp.id, c.get("requestId"));
    await audit(c, caller, "agent.restore", row.id, { checkpointId: ckp.id, name: ckp.name, state });
    return c.json((await view(row, await fleet.status(row.id))) as never, 200);
  });

  r.openapi(resetRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownAgent(caller, c.req.valid("param").id);
    const reset = await resetToFork(fleet, deps.checkpoints, row, c.get("requestId"));
    // The next episode starts now: its first call finds the agent awake, or waits for the wake under way.
    const woken = fleet.wake(agentSpec(row), "api");
    if (deps.pools) deps.pools.after("a reset agent did not wake", woken, { agentId: row.id });
    else void woken.catch((err: unknown) => deps.log.warn("a reset agent did not wake", { agentId: row.id, err: String(err) }));
    await audit(c, caller, "agent.reset", row.id, { checkpointId: reset.checkpointId, resetMs: reset.resetMs, state: reset.state });
    const agent = await view(row, await fleet.status(row.id));
    return c.json({ agent, checkpointId: reset.checkpointId, resetMs: reset.resetMs } as never, 200);
  });

  return r;
}

/** The rows' reader, or 501: this gateway was built without one. */
export function repo(deps: CheckpointGatewayDeps): CheckpointRepo {
  if (!deps.checkpoints) throw new AppError("checkpoints_unsupported", "this gateway keeps no checkpoints");
  return deps.checkpoints;
}

/** One of the fleet's optional checkpoint operations, or 501 when this fleet has none. */
export function op<K extends "checkpoint" | "restoreCheckpoint" | "fork" | "deleteCheckpoint">(fleet: Fleet, name: K): NonNullable<Fleet[K]> {
  const fn = fleet[name];
  if (!fn) throw new AppError("checkpoints_unsupported", "this gateway's fleet keeps no checkpoints");
  return fn.bind(fleet) as NonNullable<Fleet[K]>;
}

/** The position a checkpoint list's cursor holds: [createdAt in µs since the epoch, checkpoint id]. */
function checkpointPosition(cursor: string): CheckpointPosition {
  const [createdAtUs, id] = decodeCursor(cursor, ["number", "string"]) as [number, string];
  if (!Number.isSafeInteger(createdAtUs) || createdAtUs < 0 || id.length > 100) throw badCursor();
  return { createdAtUs, id };
}

function checkpointJson(r: {
  id: string;
  agentId: string;
  name: string | null;
  origin: "api" | "guest";
  bytes: number;
  pausedMs: number;
  createdAt: Date | string;
}) {
  return {
    id: r.id,
    agentId: r.agentId,
    name: r.name,
    origin: r.origin,
    bytes: r.bytes,
    pausedMs: r.pausedMs,
    createdAt: typeof r.createdAt === "string" ? r.createdAt : r.createdAt.toISOString(),
  };
}

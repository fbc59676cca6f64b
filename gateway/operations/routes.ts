// Operations API under /v1/agents/{id}: an agent's calls through its tenant's upstreams, paged and filtered, and one of them (scope as reading the agent).
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import { requireScope, scopeGate, type GatewayEnv } from "../../contracts/caller.ts";
import { apiRouter, badCursor, decodeCursor, errors, json, pageOf } from "../../lib/api.ts";
import { AppError } from "../../lib/errors.ts";
import { isId } from "../../lib/ids.ts";
import { ownAgent, type AgentRepo } from "../agents/repo.ts";
import { AgentParams } from "../agents/api-schemas.ts";
import { OperationDetailSchema, OperationListQuery, OperationListSchema, OperationParams } from "./api-schemas.ts";
import type { OperationPosition, OperationRepo, OperationRow } from "./repo.ts";

export interface OperationRouteDeps {
  agents: AgentRepo;
  operations: OperationRepo;
}

const tags = ["operations"];
const admin = scopeGate("agents:admin");

const listOperationsRoute = createRoute({
  method: "get",
  path: "/v1/agents/{id}/operations",
  operationId: "listOperations",
  summary: "The agent's calls through its tenant's upstreams, newest first, a page at a time",
  tags,
  middleware: [admin],
  request: { params: AgentParams, query: OperationListQuery },
  responses: { 200: json(OperationListSchema, "A page of operations"), ...errors(400, 404) },
});

const getOperationRoute = createRoute({
  method: "get",
  path: "/v1/agents/{id}/operations/{opId}",
  operationId: "getOperation",
  summary: "One of the agent's operations, with the response headers it got",
  tags,
  middleware: [admin],
  request: { params: OperationParams },
  responses: { 200: json(OperationDetailSchema, "The operation"), ...errors(400, 404) },
});

export function operationRoutes(deps: OperationRouteDeps): OpenAPIHono<GatewayEnv> {
  const r = apiRouter<GatewayEnv>();

  r.openapi(listOperationsRoute, async (c) => {
    const agent = await ownAgent(deps.agents, requireScope(c, "agents:admin"), c.req.valid("param").id);
    const q = c.req.valid("query");
    const rows = await deps.operations.page(agent.id, {
      limit: q.limit + 1,
      before: q.cursor === undefined ? undefined : operationPosition(q.cursor),
      upstream: q.upstream,
      state: q.state,
      since: q.since === undefined ? undefined : new Date(q.since),
    });
    const page = pageOf(rows, q.limit, (last) => [last.createdAtUs, last.id]);
    return c.json({ operations: page.items.map(operationView), nextCursor: page.nextCursor }, 200);
  });

  r.openapi(getOperationRoute, async (c) => {
    const { id, opId } = c.req.valid("param");
    const agent = await ownAgent(deps.agents, requireScope(c, "agents:admin"), id);
    if (!isId("operation", opId)) throw new AppError("invalid_id", `"${opId.slice(0, 64)}" is not an operation id`);
    const row = await deps.operations.get(agent.id, opId);
    if (!row) throw new AppError("not_found", `operation ${opId} not found`);
    return c.json({ ...operationView(row), responseHeaders: row.responseHeaders ?? null }, 200);
  });

  return r;
}

function operationPosition(cursor: string): OperationPosition {
  const [createdAtUs, id] = decodeCursor(cursor, ["number", "string"]) as [number, string];
  if (!Number.isSafeInteger(createdAtUs) || createdAtUs < 0 || id.length > 100) throw badCursor();
  return { createdAtUs, id };
}

const iso = (d: Date | null) => (d ? d.toISOString() : null);

/** An operation as the API shows it: what was asked and answered, when, and its tokens; no body, no request header. */
export function operationView(r: OperationRow) {
  return {
    id: r.id,
    agentId: r.agentId,
    runId: r.runId,
    upstream: r.upstream,
    method: r.method,
    path: r.path,
    requestHash: r.requestHash,
    idempotencyKey: r.idempotencyKey,
    mode: r.mode,
    state: r.state,
    status: r.status,
    error: r.error ?? null,
    sentAt: iso(r.sentAt),
    firstByteAt: iso(r.firstByteAt),
    endedAt: iso(r.endedAt),
    durationMs: r.sentAt && r.endedAt ? r.endedAt.getTime() - r.sentAt.getTime() : null,
    requestBytes: r.requestBytes,
    responseBytes: r.responseBytes,
    model: r.model,
    inputTokens: r.inputTokens,
    outputTokens: r.outputTokens,
    requestBodyKept: r.requestBody !== null,
    responseBodyKept: r.responseBody !== null,
    createdAt: r.createdAt.toISOString(),
  };
}

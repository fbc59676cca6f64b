// The operator's tenants API under /v1/tenants: create, list (paged), show, suspend, resume, delete; each action audited.
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import type { Context, MiddlewareHandler } from "hono";
import { apiRouter, badCursor, decodeCursor, errors, json, jsonBody, jsonRequest, pageOf } from "../../lib/api.ts";
import { AppError } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import type { Logger } from "../../lib/log.ts";
import type { VmState } from "../../contracts/agent.ts";
import { requireScope, scopeGate, type Caller, type GatewayEnv } from "../../contracts/caller.ts";
import type { Fleet } from "../../contracts/fleet.ts";
import type { AuditLog } from "../../schema/audit-log.ts";
import type { AgentRepo } from "../agents/repo.ts";
import {
  CreateTenantBody,
  ReasonBody,
  TenantDeletedSchema,
  TenantListQuery,
  TenantListSchema,
  TenantParams,
  TenantSchema,
  TenantSuspendedSchema,
} from "./api-schemas.ts";
import type { TenantGate } from "./gate.ts";
import type { TenantRow, TenantStore } from "./store.ts";

export interface TenantRouteDeps {
  store: TenantStore;
  gate: TenantGate;
  agents: Pick<AgentRepo, "markDeleted">;
  fleet: Pick<Fleet, "statuses" | "hibernate" | "remove">;
  audit: AuditLog;
  log: Logger;
  /** Forgets a cached agent row (the proxy's) once it is deleted. */
  invalidateAgent: (agentId: string) => void;
  /** Largest JSON body, bytes. */
  maxBodyBytes: number;
}

const tags = ["tenants"];
// The operator's routes: an operator token's own tenant need not exist (the tenant gate reads this).
const operator = scopeGate("operator", { tenantGate: "not-operators" });

/** A VM in one of these states holds memory and answers: suspension hibernates it. */
const awakeStates: ReadonlySet<VmState> = new Set(["booting", "running", "dozing", "restoring"]);

const createTenantRoute = (body: MiddlewareHandler) =>
  createRoute({
    method: "post",
    path: "/v1/tenants",
    operationId: "createTenant",
    summary: "Create a tenant (operator)",
    tags,
    middleware: [operator, body],
    request: jsonRequest(CreateTenantBody),
    responses: { 201: json(TenantSchema, "The tenant"), ...errors(400, 409, 413) },
  });

const listTenantsRoute = createRoute({
  method: "get",
  path: "/v1/tenants",
  operationId: "listTenants",
  summary: "List tenants, oldest first, a page at a time (operator)",
  tags,
  middleware: [operator],
  request: { query: TenantListQuery },
  responses: { 200: json(TenantListSchema, "A page of tenants"), ...errors(400) },
});

const getTenantRoute = createRoute({
  method: "get",
  path: "/v1/tenants/{id}",
  operationId: "getTenant",
  summary: "A tenant (operator)",
  tags,
  middleware: [operator],
  request: { params: TenantParams },
  responses: { 200: json(TenantSchema, "The tenant"), ...errors(400, 404) },
});

const suspendTenantRoute = (body: MiddlewareHandler) =>
  createRoute({
    method: "post",
    path: "/v1/tenants/{id}/suspend",
    operationId: "suspendTenant",
    summary: "Suspend a tenant: its tokens and agents get 403 tenant_suspended, its awake agents are hibernated, nothing is deleted (operator; idempotent)",
    tags,
    middleware: [operator, body],
    request: { params: TenantParams, ...jsonRequest(ReasonBody) },
    responses: { 200: json(TenantSuspendedSchema, "Suspended"), ...errors(400, 404, 409, 413) },
  });

const resumeTenantRoute = createRoute({
  method: "post",
  path: "/v1/tenants/{id}/resume",
  operationId: "resumeTenant",
  summary: "Resume a suspended tenant (operator; idempotent)",
  tags,
  middleware: [operator],
  request: { params: TenantParams },
  responses: { 200: json(TenantSchema, "Active"), ...errors(400, 404, 409) },
});

const deleteTenantRoute = createRoute({
  method: "delete",
  path: "/v1/tenants/{id}",
  operationId: "deleteTenant",
  summary: "Delete a tenant: its agents are destroyed, the row is kept as deleted with its usage and invoices (operator; idempotent)",
  tags,
  middleware: [operator],
  request: { params: TenantParams },
  responses: { 200: json(TenantDeletedSchema, "Deleted"), ...errors(400, 404, 502, 504) },
});

export function createTenantRoutes(deps: TenantRouteDeps): OpenAPIHono<GatewayEnv> {
  const r = apiRouter<GatewayEnv>();
  const { store, gate, fleet } = deps;
  const body = jsonBody(() => deps.maxBodyBytes);

  function audit(c: Context<GatewayEnv>, caller: Caller, action: string, tenantId: string, detail?: Record<string, unknown>) {
    return deps.audit.record({ tenantId, actor: caller.subject, action, target: tenantId, requestId: c.get("requestId"), ...(detail ? { detail } : {}) });
  }

  async function existing(id: string): Promise<TenantRow> {
    const row = await store.get(id);
    if (!row) throw new AppError("not_found", `tenant ${id} not found`);
    return row;
  }

  r.openapi(createTenantRoute(body), async (c) => {
    const caller = requireScope(c, "operator");
    const b = c.req.valid("json");
    const id = b.id ?? newId("tenant");
    const row = await store.create({ id, name: b.name, timeZone: b.timeZone ?? "UTC" });
    if (!row) throw new AppError("conflict", `tenant ${id} exists`);
    gate.changed(row);
    await audit(c, caller, "tenant.create", id, { name: row.name, timeZone: row.timeZone });
    return c.json(tenantJson(row), 201);
  });

  r.openapi(listTenantsRoute, async (c) => {
    requireScope(c, "operator");
    const q = c.req.valid("query");
    const rows = await store.page({ limit: q.limit + 1, after: q.cursor === undefined ? undefined : tenantPosition(q.cursor), status: q.status });
    const page = pageOf(rows, q.limit, (last) => [last.createdAtUs, last.id]);
    return c.json({ tenants: page.items.map(tenantJson), nextCursor: page.nextCursor }, 200);
  });

  r.openapi(getTenantRoute, async (c) => {
    requireScope(c, "operator");
    return c.json(tenantJson(await existing(c.req.valid("param").id)), 200);
  });

  // Status first (every gateway refuses the tenant's calls within TENANT_CACHE_TTL_MS, this one at once), then the
  // awake agents are hibernated; a failed hibernation is reported, and suspending again retries it.
  r.openapi(suspendTenantRoute(body), async (c) => {
    const caller = requireScope(c, "operator");
    const { id } = c.req.valid("param");
    const reason = c.req.valid("json").reason ?? null;
    const before = await existing(id);
    if (before.status === "deleted") throw new AppError("conflict", `tenant ${id} was deleted`);
    const row = (await store.suspend(id, reason)) ?? before;
    gate.changed(row);
    const ids = await store.liveAgentIds(id);
    const statuses = await fleet.statuses(ids);
    const hibernated: string[] = [];
    const failed: { agentId: string; error: string }[] = [];
    for (const agentId of ids) {
      const state = statuses.get(agentId)?.state;
      if (!state || !awakeStates.has(state)) continue;
      try {
        await fleet.hibernate(agentId);
        hibernated.push(agentId);
      } catch (err) {
        failed.push({ agentId, error: err instanceof Error ? err.message : String(err) });
        deps.log.warn("suspending a tenant: hibernation failed", { tenantId: id, agentId, err: err instanceof Error ? err.message : String(err) });
      }
    }
    await audit(c, caller, "tenant.suspend", id, { reason, changed: before.status !== "suspended", hibernated, failed });
    return c.json({ tenant: tenantJson(row), hibernated, failed }, 200);
  });

  r.openapi(resumeTenantRoute, async (c) => {
    const caller = requireScope(c, "operator");
    const { id } = c.req.valid("param");
    const before = await existing(id);
    if (before.status === "deleted") throw new AppError("conflict", `tenant ${id} was deleted: it cannot be resumed`);
    const row = (await store.resume(id)) ?? before;
    gate.changed(row);
    await audit(c, caller, "tenant.resume", id, { changed: before.status !== "active" });
    return c.json(tenantJson(row), 200);
  });

  // The row is marked deleted first (its calls are refused from then on), then each live agent is destroyed as
  // DELETE /v1/agents/{id} does; a failure part-way leaves the tenant deleted, and deleting again finishes the job.
  r.openapi(deleteTenantRoute, async (c) => {
    const caller = requireScope(c, "operator");
    const { id } = c.req.valid("param");
    const before = await existing(id);
    const row = (await store.markDeleted(id, before.statusReason)) ?? before;
    gate.changed(row);
    const destroyed: string[] = [];
    try {
      for (const agentId of await store.liveAgentIds(id)) {
        await fleet.remove(agentId);
        await deps.agents.markDeleted(agentId);
        deps.invalidateAgent(agentId);
        destroyed.push(agentId);
      }
    } finally {
      await audit(c, caller, "tenant.delete", id, { changed: before.status !== "deleted", destroyed });
    }
    return c.json({ tenant: tenantJson(row), destroyed }, 200);
  });

  return r;
}

/** The position a tenant list's cursor holds: [createdAt in µs since the epoch, tenant id]. */
function tenantPosition(cursor: string): { createdAtUs: number; id: string } {
  const [createdAtUs, id] = decodeCursor(cursor, ["number", "string"]) as [number, string];
  if (!Number.isSafeInteger(createdAtUs) || createdAtUs < 0 || id.length > 64) throw badCursor();
  return { createdAtUs, id };
}

function tenantJson(row: TenantRow) {
  return {
    id: row.id,
    name: row.name,
    timeZone: row.timeZone,
    status: row.status,
    statusReason: row.statusReason,
    createdAt: row.createdAt.toISOString(),
    suspendedAt: row.suspendedAt?.toISOString() ?? null,
    deletedAt: row.deletedAt?.toISOString() ?? null,
  };
}

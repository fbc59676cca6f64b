// Admin API under /v1/agents: create (or fork from a checkpoint), list (paged), get, update, delete, hibernate, wake, keep-awake leases, the event log; checkpoints beside them.
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import type { Context, MiddlewareHandler } from "hono";
import type { z } from "@hono/zod-openapi";
import { apiRouter, badCursor, decodeCursor, errors, json, jsonBody, jsonRequest, pageOf } from "../../lib/api.ts";
import { AppError } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import type { VmState, VmStatus } from "../../contracts/agent.ts";
import { agentSpec, ownAgent as findOwnAgent, type AgentPosition, type AgentRow } from "./repo.ts";
import type { GatewayDeps } from "../deps.ts";
import { requireScope, scopeGate, type Caller, type GatewayEnv } from "../../contracts/caller.ts";
import type { EffectiveLimits, ProxyCore } from "../proxy/core.ts";
import { noOverrides, type AgentSettingsPatch } from "../proxy/agents.ts";
import { effectiveNonWaking } from "../proxy/policy.ts";
import { checkpointRoutes, op, repo, type CheckpointGatewayDeps } from "../checkpoints/routes.ts";
import { ownCheckpoint } from "../checkpoints/repo.ts";
import {
  AddLeaseBody,
  AgentDeletedSchema,
  AgentEventListSchema,
  AgentListQuery,
  AgentListSchema,
  AgentParams,
  AgentSchema,
  AgentStateSchema,
  CreateAgentBody,
  EventListQuery,
  LeaseDroppedSchema,
  LeaseParams,
  LeaseSchema,
  UpdateAgentBody,
  WakeSchema,
} from "./api-schemas.ts";

const tags = ["agents"];

/** The caller must hold `agents:admin`: checked before the body is read or validated. */
const admin = scopeGate("agents:admin");

const createAgentRoute = (body: MiddlewareHandler) =>
  createRoute({
    method: "post",
    path: "/v1/agents",
    operationId: "createAgent",
    summary: "Create an agent (it sleeps until its first call)",
    tags,
    middleware: [admin, body],
    request: jsonRequest(CreateAgentBody),
    // 404: `fromCheckpoint` names no checkpoint of the caller's; 501: this deployment keeps no checkpoints.
    responses: {
      201: json(AgentSchema, "The agent (with `fromCheckpoint`: hibernated on the checkpoint, `forkedFrom` set)"),
      ...errors(400, 404, 413, 501, 502, 504),
    },
  });

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
    summary: "Change what may change on a live agent: idle timeouts, non-waking rules (null = defaults), limits (null = global)",
    tags,
    middleware: [admin, body],
    request: { params: AgentParams, ...jsonRequest(UpdateAgentBody) },
    responses: { 200: json(AgentSchema, "The agent as changed"), ...errors(400, 404, 405, 413) },
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

export function agentRoutes(deps: GatewayDeps & CheckpointGatewayDeps, proxy: ProxyCore): OpenAPIHono<GatewayEnv> {
  const r = apiRouter<GatewayEnv>();
  const { agents, fleet, config, settings } = deps;
  const body = jsonBody(() => config.maxApiBodyBytes);

  /** The agent as the API shows it: with the non-waking rules and the limits in force. */
  async function view(row: AgentRow, status: VmStatus | undefined) {
    const overrides = settings ? await settings.limits(row.id) : noOverrides;
    return agentJson(row, status, proxy.limitsOf(row, overrides));
  }

  const ownAgent = (caller: Caller, id: string) => findOwnAgent(agents, caller, id);

  function audit(c: Context<GatewayEnv>, caller: Caller, action: string, target: string, detail?: Record<string, unknown>) {
    return deps.audit.record({
      tenantId: caller.tenantId,
      actor: caller.subject,
      action,
      target,
      requestId: c.get("requestId"),
      ...(detail ? { detail } : {}),
    });
  }

  r.openapi(createAgentRoute(body), async (c) => {
    const caller = requireScope(c, "agents:admin");
    const b = c.req.valid("json");
    if (b.fromCheckpoint !== undefined) return c.json(await fork(c, caller, b, b.fromCheckpoint), 201);
    const image = b.image ?? "demo";
    const limits = b.limits;
    if (limits && Object.keys(limits).length > 0 && !settings) throw new AppError("bad_request", "this gateway keeps no per-agent limits");
    // A built image is pinned by digest at creation: a later build under the same tag does not change a live agent.
    const built = config.images.includes(image) ? undefined : await deps.imageCatalog?.resolve(caller.tenantId, image);
    if (!config.images.includes(image) && !built) {
      throw new AppError(
        "bad_request",
        `unknown image "${image}" (built-in: ${config.images.join(", ")}${deps.imageCatalog ? "; built images: GET /v1/images" : ""})`,
      );
    }
    const d = config.agentDefaults;
    const row = await agents.create({
      id: newId("agent"),
      tenantId: caller.tenantId,
      name: b.name ?? "agent",
      image: built ? `${built.name}:${built.tag}` : image,
      imageDigest: built?.digest ?? null,
      vcpus: b.vcpus ?? d.vcpus,
      memMiB: b.memMiB ?? d.memMiB,
      diskMiB: b.diskMiB ?? d.diskMiB ?? 1024,
      idleTimeoutMs: b.idleTimeoutMs ?? d.idleTimeoutMs,
      streamIdleMs: b.streamIdleMs ?? d.streamIdleMs,
      public: b.public ?? false,
      allowEgress: b.allowEgress ?? false,
      nonWaking: b.nonWaking ?? null,
    });
    if (limits && Object.keys(limits).length > 0) await settings!.update(row.id, { limits });
    proxy.invalidate(row.id);
    await audit(c, caller, "agent.create", row.id, {
      image: row.image,
      imageDigest: row.imageDigest,
      vcpus: row.vcpus,
      memMiB: row.memMiB,
      diskMiB: row.diskMiB,
    });
    // Placed now, by free capacity, so a burst of creates spreads over the hosts; when no host can take it yet, its first call places it.
    await fleet
      .place?.(agentSpec(row))
      .catch((err: unknown) =>
        deps.log.warn("agent not placed at creation; its first call places it", { agentId: row.id, err: err instanceof Error ? err.message : String(err) }),
      );
    return c.json(await view((await agents.get(row.id)) ?? row, undefined), 201);
  });

  /**
   * A new agent from a checkpoint: the checkpoint's agent's shape (image, vcpus, memory, disk: the snapshot is of them),
   * its settings unless the body gives its own, on the checkpoint's host (`host_id` set now, so placement keeps it
   * there), made a hibernated copy of the checkpoint before it answers. A failed fork leaves no agent behind.
   */
  async function fork(c: Context<GatewayEnv>, caller: Caller, b: CreateAgentInput, fromCheckpoint: string) {
    for (const field of ["image", "vcpus", "memMiB", "diskMiB"] as const) {
      if (b[field] !== undefined) throw new AppError("bad_request", `${field}: a fork's is its checkpoint's (leave it out with fromCheckpoint)`);
    }
    const forkOp = op(fleet, "fork");
    const ckp = await ownCheckpoint(repo(deps), caller, fromCheckpoint, "fromCheckpoint");
    const source = await agents.get(ckp.agentId);
    if (!source) throw new AppError("not_found", `checkpoint ${ckp.id} not found`);
    if (b.limits && Object.keys(b.limits).length > 0 && !settings) throw new AppError("bad_request", "this gateway keeps no per-agent limits");
    const row = await agents.create({
      id: newId("agent"),
      tenantId: caller.tenantId,
      name: b.name ?? source.name,
      image: source.image,
      imageDigest: source.imageDigest,
      vcpus: source.vcpus,
      memMiB: source.memMiB,
      diskMiB: source.diskMiB,
      idleTimeoutMs: b.idleTimeoutMs ?? source.idleTimeoutMs,
      streamIdleMs: b.streamIdleMs ?? source.streamIdleMs,
      public: b.public ?? source.public,
      allowEgress: b.allowEgress ?? source.allowEgress,
      nonWaking: b.nonWaking === undefined ? source.nonWaking : b.nonWaking,
      hostId: ckp.hostId,
      forkedFrom: ckp.id,
    });
    try {
      await forkOp(agentSpec(row), ckp.id, c.get("requestId"));
    } catch (err) {
      await agents.markDeleted(row.id);
      throw err;
    }
    if (b.limits && Object.keys(b.limits).length > 0) await settings!.update(row.id, { limits: b.limits });
    proxy.invalidate(row.id);
    await audit(c, caller, "agent.create", row.id, {
      image: row.image,
      imageDigest: row.imageDigest,
      vcpus: row.vcpus,
      memMiB: row.memMiB,
      diskMiB: row.diskMiB,
      forkedFrom: ckp.id,
      fromAgent: ckp.agentId,
    });
    return view(row, await fleet.status(row.id));
  }

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
    proxy.invalidate(row.id);
    await audit(c, caller, "agent.delete", row.id);
    return c.json({ id: row.id, deleted: true as const }, 200);
  });

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

  r.route("/", checkpointRoutes(deps, view));
  return r;
}

type CreateAgentInput = z.infer<typeof CreateAgentBody>;

/** The position an agent list's cursor holds: [createdAt in µs since the epoch, agent id]. */
function agentPosition(cursor: string): AgentPosition {
  const [createdAtUs, id] = decodeCursor(cursor, ["number", "string"]) as [number, string];
  if (!Number.isSafeInteger(createdAtUs) || createdAtUs < 0 || id.length > 100) throw badCursor();
  return { createdAtUs, id };
}

/** The position an event list's cursor holds: the id of the last event shown. */
function eventPosition(cursor: string): number {
  const [id] = decodeCursor(cursor, ["number"]) as [number];
  if (!Number.isSafeInteger(id) || id < 1) throw badCursor();
  return id;
}

function agentJson(row: AgentRow, status: VmStatus | undefined, limits: EffectiveLimits) {
  return {
    id: row.id,
    tenantId: row.tenantId,
    name: row.name,
    image: row.image,
    imageDigest: row.imageDigest,
    vcpus: row.vcpus,
    memMiB: row.memMiB,
    diskMiB: row.diskMiB,
    idleTimeoutMs: row.idleTimeoutMs,
    streamIdleMs: row.streamIdleMs,
    public: row.public,
    allowEgress: row.allowEgress,
    /** What the gateway answers itself without waking the agent; `nonWakingDefault` says whether these are the defaults. */
    nonWaking: effectiveNonWaking(row.nonWaking),
    nonWakingDefault: row.nonWaking === null,
    limits,
    path: `/a/${row.id}/`,
    state: status?.state ?? (row.state as VmState),
    lastWakeAt: status?.lastWakeAt !== undefined ? new Date(status.lastWakeAt).toISOString() : (row.lastWakeAt?.toISOString() ?? null),
    inFlight: status?.inFlight ?? 0,
    leases: status?.leases ?? 0,
    /** The last failed hibernate (full disk, say) until one succeeds: the agent stays awake meanwhile. */
    lastHibernateError: status?.lastHibernateError ?? null,
    /** The checkpoint it was forked from; null for an agent created fresh. */
    forkedFrom: row.forkedFrom,
    createdAt: row.createdAt.toISOString(),
  };
}

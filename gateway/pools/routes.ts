// Warm pools API under /v1/pools: create (from a checkpoint, or an image booted and checkpointed), list, get, resize, delete, acquire an agent, release it.
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import type { Context, MiddlewareHandler } from "hono";
import { apiRouter, errors, json, jsonBody, jsonRequest } from "../../lib/api.ts";
import { AppError } from "../../lib/errors.ts";
import { isId, newId } from "../../lib/ids.ts";
import type { VmStatus } from "../../contracts/agent.ts";
import { requireScope, scopeGate, type Caller, type GatewayEnv } from "../../contracts/caller.ts";
import { callerAction } from "../../schema/audit-log.ts";
import { agentSpec, ownAgent, type AgentRow } from "../agents/repo.ts";
import { ownCheckpointRef, type CheckpointRow } from "../checkpoints/repo.ts";
import { op, repo, type CheckpointGatewayDeps } from "../checkpoints/routes.ts";
import type { GatewayDeps } from "../deps.ts";
import type { PoolKeeper } from "./keeper.ts";
import { noAgents, type PoolCounts, type PoolRow } from "./store.ts";
import {
  AcquiredSchema,
  AcquireQuery,
  CreatePoolBody,
  defaultAcquireWaitMs,
  PoolDeletedSchema,
  PoolListSchema,
  PoolParams,
  PoolSchema,
  ReleaseBody,
  ReleasedSchema,
  ResizePoolBody,
} from "./api-schemas.ts";

/** What the pool routes need besides the gateway's own parts: the keeper (none: 501 checkpoints_unsupported). */
export type PoolGatewayDeps = GatewayDeps & CheckpointGatewayDeps & { pools?: PoolKeeper };

const tags = ["pools"];
const admin = scopeGate("agents:admin");

const createPoolRoute = (body: MiddlewareHandler) =>
  createRoute({
    method: "post",
    path: "/v1/pools",
    operationId: "createPool",
    summary: "Create a warm pool: `size` hibernated forks of a checkpoint kept ready to hand out, reset to it when given back",
    tags,
    middleware: [admin, body],
    request: jsonRequest(CreatePoolBody),
    // 404: the checkpoint is not the caller's; 409: the name is taken, or the image's agent could not be checkpointed.
    responses: { 201: json(PoolSchema, "The pool (its agents are forked in the background)"), ...errors(400, 404, 409, 413, 501, 502, 504) },
  });

const listPoolsRoute = createRoute({
  method: "get",
  path: "/v1/pools",
  operationId: "listPools",
  summary: "The tenant's pools, oldest first, with their counts",
  tags,
  middleware: [admin],
  responses: { 200: json(PoolListSchema, "The pools"), ...errors(400, 501) },
});

const getPoolRoute = createRoute({
  method: "get",
  path: "/v1/pools/{id}",
  operationId: "getPool",
  summary: "One pool, with how many of its agents are ready, in use and being made ready",
  tags,
  middleware: [admin],
  request: { params: PoolParams },
  responses: { 200: json(PoolSchema, "The pool"), ...errors(400, 404, 501) },
});

const deletePoolRoute = createRoute({
  method: "delete",
  path: "/v1/pools/{id}",
  operationId: "deletePool",
  summary: "Delete a pool: its agents that are not handed out are deleted; handed-out ones stay with their holders as ordinary agents",
  tags,
  middleware: [admin],
  request: { params: PoolParams },
  responses: { 200: json(PoolDeletedSchema, "Deleted"), ...errors(400, 404, 501, 502, 504) },
});

const resizePoolRoute = (body: MiddlewareHandler) =>
  createRoute({
    method: "patch",
    path: "/v1/pools/{id}",
    operationId: "resizePool",
    summary: "Change a pool's size and maxSize: a larger pool is topped up at once; a smaller one deletes its surplus ready agents (never handed-out ones)",
    tags,
    middleware: [admin, body],
    request: { params: PoolParams, ...jsonRequest(ResizePoolBody) },
    responses: { 200: json(PoolSchema, "The pool with its new sizes (its top-up under way)"), ...errors(400, 404, 413, 501) },
  });

const acquireRoute = createRoute({
  method: "post",
  path: "/v1/pools/{id}/acquire",
  operationId: "acquirePoolAgent",
  summary:
    "Hand out one of the pool's agents (never the same one to two callers), woken in the background; one is forked now when none is ready and the pool is below maxSize",
  description:
    "At maxSize with none ready but some being made ready (forked by the top-up, reset after a release), it waits for one of them up to `waitMs` (default 10 s). `409 pool_exhausted` when every agent is handed out (at once), or none became ready in time (with `Retry-After`).",
  tags,
  middleware: [admin],
  request: { params: PoolParams, query: AcquireQuery },
  // 409 pool_exhausted: every agent handed out at maxSize.
  responses: { 200: json(AcquiredSchema, "The agent, awake or waking"), ...errors(400, 404, 409, 501, 502, 504) },
});

const releaseRoute = (body: MiddlewareHandler) =>
  createRoute({
    method: "post",
    path: "/v1/pools/{id}/release",
    operationId: "releasePoolAgent",
    summary: "Give a handed-out agent back: reset to the pool's checkpoint (hibernated on it) and ready for the next acquire",
    tags,
    middleware: [admin, body],
    request: { params: PoolParams, ...jsonRequest(ReleaseBody) },
    // 409: the agent is not handed out by this pool (released already, or another pool's).
    responses: { 200: json(ReleasedSchema, "The agent, ready in the pool"), ...errors(400, 404, 409, 413, 501, 502, 504) },
  });

/**
 * The routes; `view` shows an agent as the agents API does. Every change is audited with the caller as actor
 * (`pool.create`, `pool.resize`, `pool.delete`, `pool.acquire`, `pool.release`); the hosts audit what they did (forks, restores).
 */
export function poolRoutes(deps: PoolGatewayDeps, view: (row: AgentRow, status: VmStatus | undefined) => Promise<unknown>): OpenAPIHono<GatewayEnv> {
  const r = apiRouter<GatewayEnv>();
  const { agents, fleet, config } = deps;
  const body = jsonBody(() => config.maxApiBodyBytes);

  function audit(c: Context<GatewayEnv>, caller: Caller, action: string, target: string, detail: Record<string, unknown>) {
    return deps.audit.record(callerAction(caller, c.get("requestId"), action, target, detail));
  }

  async function ownPool(caller: Caller, id: string): Promise<PoolRow> {
    if (!isId("pool", id)) throw new AppError("invalid_id", `"${id.slice(0, 64)}" is not a pool id`);
    const row = await keeper(deps).store.get(id);
    if (!row || row.tenantId !== caller.tenantId) throw new AppError("not_found", `pool ${id} not found`);
    return row;
  }

  async function poolJson(row: PoolRow, counts?: PoolCounts) {
    const c = counts ?? (await keeper(deps).store.counts([row.id])).get(row.id) ?? noAgents;
    return {
      id: row.id,
      name: row.name,
      fromCheckpoint: row.fromCheckpoint,
      size: row.size,
      maxSize: row.maxSize,
      ready: c.ready,
      inUse: c.inUse,
      resetting: c.resetting,
      state: row.state,
      createdAt: row.createdAt.toISOString(),
    };
  }

  /** The `image` variant: an agent of the image, booted, checkpointed, hibernated; its checkpoint is the pool's. */
  async function checkpointOfImage(c: Context<GatewayEnv>, caller: Caller, image: string, poolId: string): Promise<CheckpointRow> {
    const take = op(fleet, "checkpoint");
    const built = config.images.includes(image) ? undefined : await deps.imageCatalog?.resolve(caller.tenantId, image);
    if (!config.images.includes(image) && !built) throw new AppError("bad_request", `image: unknown image "${image}" (built-in: ${config.images.join(", ")})`);
    const d = config.agentDefaults;
    const row = await agents.create({
      id: newId("agent"),
      tenantId: caller.tenantId,
      name: `pool ${poolId}`,
      image: built ? `${built.name}:${built.tag}` : image,
      imageDigest: built?.digest ?? null,
      vcpus: d.vcpus,
      memMiB: d.memMiB,
      diskMiB: d.diskMiB ?? 1024,
      desktop: built?.config.desktop ?? null,
      idleTimeoutMs: d.idleTimeoutMs,
      streamIdleMs: d.streamIdleMs,
      public: false,
      allowEgress: false,
      nonWaking: null,
    });
    await audit(c, caller, "agent.create", row.id, { image: row.image, imageDigest: row.imageDigest, forPool: poolId });
    try {
      await fleet.wake(agentSpec(row), "api");
      const ckp = await take(agentSpec(row), { name: `pool-${poolId}`, requestId: c.get("requestId") });
      await audit(c, caller, "checkpoint.create", row.id, { checkpointId: ckp.id, name: ckp.name, bytes: ckp.bytes, forPool: poolId });
      // Its own VM is not needed awake: the pool's agents are forks of the checkpoint.
      keeper(deps).after("a pool's image agent was not hibernated", fleet.hibernate(row.id), { agentId: row.id });
      const got = await repo(deps).get(ckp.id);
      if (!got) throw new AppError("conflict", `the checkpoint of image ${image} was deleted before the pool was made`);
      return got;
    } catch (err) {
      await fleet.remove(row.id).catch(() => {});
      await agents.markDeleted(row.id);
      throw err;
    }
  }

  r.openapi(createPoolRoute(body), async (c) => {
    const caller = requireScope(c, "agents:admin");
    const b = c.req.valid("json");
    const keep = keeper(deps);
    if ((b.fromCheckpoint === undefined) === (b.image === undefined)) throw new AppError("bad_request", "give one of fromCheckpoint or image");
    const maxSize = b.maxSize ?? Math.max(b.size, 1);
    if (maxSize < b.size) throw new AppError("bad_request", `maxSize: must be at least size (${b.size})`);
    op(fleet, "fork"); // 501 before anything is made
    const id = newId("pool");
    const name = b.name ?? id;
    // A taken name costs nothing (the unique index checks again).
    if ((await keep.store.list(caller.tenantId)).some((p) => p.name === name)) throw new AppError("conflict", `a pool named "${name}" exists`);
    const ckp =
      b.fromCheckpoint !== undefined
        ? await ownCheckpointRef(repo(deps), agents, caller, b.fromCheckpoint, "fromCheckpoint")
        : await checkpointOfImage(c, caller, b.image!, id);
    const row = await keep.store.create({ id, tenantId: caller.tenantId, name, fromCheckpoint: ckp.id, size: b.size, maxSize });
    await audit(c, caller, "pool.create", row.id, {
      name,
      fromCheckpoint: ckp.id,
      size: row.size,
      maxSize: row.maxSize,
      ...(b.image ? { image: b.image } : {}),
    });
    keep.kick(row.id);
    return c.json(await poolJson(row), 201);
  });

  r.openapi(listPoolsRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const store = keeper(deps).store;
    const rows = await store.list(caller.tenantId);
    const counts = await store.counts(rows.map((p) => p.id));
    return c.json({ pools: await Promise.all(rows.map((p) => poolJson(p, counts.get(p.id) ?? noAgents))) }, 200);
  });

  r.openapi(getPoolRoute, async (c) => {
    const row = await ownPool(requireScope(c, "agents:admin"), c.req.valid("param").id);
    return c.json(await poolJson(row), 200);
  });

  r.openapi(deletePoolRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownPool(caller, c.req.valid("param").id);
    const { removed, leftInUse } = await keeper(deps).remove(row);
    await audit(c, caller, "pool.delete", row.id, { name: row.name, removed, leftInUse });
    return c.json({ id: row.id, deleted: true as const, removed, leftInUse }, 200);
  });

  r.openapi(resizePoolRoute(body), async (c) => {
    const caller = requireScope(c, "agents:admin");
    const pool = await ownPool(caller, c.req.valid("param").id);
    const b = c.req.valid("json");
    if (b.size === undefined && b.maxSize === undefined) throw new AppError("bad_request", "give size, maxSize or both");
    const size = b.size ?? pool.size;
    const maxSize = b.maxSize ?? pool.maxSize;
    if (maxSize < size) throw new AppError("bad_request", `maxSize: must be at least size (${size})`);
    const { row, removed } = await keeper(deps).resize(pool, { size, maxSize });
    await audit(c, caller, "pool.resize", pool.id, { from: { size: pool.size, maxSize: pool.maxSize }, to: { size, maxSize }, removed });
    return c.json(await poolJson(row), 200);
  });

  r.openapi(acquireRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const pool = await ownPool(caller, c.req.valid("param").id);
    const waitMs = c.req.valid("query").waitMs ?? defaultAcquireWaitMs;
    const { row, forked } = await keeper(deps).acquire(pool, c.get("requestId"), { waitMs, signal: c.req.raw.signal });
    // Woken in the background: the caller's first call finds it awake, or waits for the wake under way.
    keeper(deps).after("a pool's agent did not wake", fleet.wake(agentSpec(row), "api"), { poolId: pool.id, agentId: row.id });
    await audit(c, caller, "pool.acquire", pool.id, { agentId: row.id, forked });
    const agent = await view(row, await fleet.status(row.id));
    return c.json({ agent, pool: pool.id, forked } as never, 200);
  });

  r.openapi(releaseRoute(body), async (c) => {
    const caller = requireScope(c, "agents:admin");
    const pool = await ownPool(caller, c.req.valid("param").id);
    const agent = await ownAgent(agents, caller, c.req.valid("json").agentId);
    if (agent.poolId !== pool.id) throw new AppError("conflict", `agent ${agent.id} is not one of pool ${pool.id}'s`);
    const { row, resetMs } = await keeper(deps).release(pool, agent, c.get("requestId"));
    await audit(c, caller, "pool.release", pool.id, { agentId: row.id, resetMs });
    const shown = await view(row, await fleet.status(row.id));
    return c.json({ agent: shown, resetMs } as never, 200);
  });

  return r;
}

/** The pools' keeper, or 501: this gateway was built without one. */
export function keeper(deps: PoolGatewayDeps): PoolKeeper {
  if (!deps.pools) throw new AppError("checkpoints_unsupported", "this gateway keeps no pools");
  return deps.pools;
}

// POST /v1/agents: create an agent, fresh from an image or forked from a checkpoint.
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import type { Context, MiddlewareHandler } from "hono";
import type { z } from "@hono/zod-openapi";
import { errors, json, jsonRequest } from "../../lib/api.ts";
import { AppError } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import { requireScope, type Caller, type GatewayEnv } from "../../contracts/caller.ts";
import { op, repo } from "../checkpoints/routes.ts";
import { ownCheckpointRef } from "../checkpoints/repo.ts";
import { AgentSchema, CreateAgentBody } from "./api-schemas.ts";
import { agentSpec } from "./repo.ts";
import type { DesktopSize } from "../../contracts/agent.ts";
import type { ImageConfig } from "../../contracts/image.ts";
import { admin, tags, type AgentRouteContext } from "./route-context.ts";
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
export function registerCreateAgent(r: OpenAPIHono<GatewayEnv>, ctx: AgentRouteContext): void {
  const { deps, proxy, body, view, audit } = ctx;
  const { agents, fleet, config, settings } = deps;
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
      desktop: desktopFor(image, built?.config, b.desktop),
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
      ...(row.desktop ? { desktop: row.desktop } : {}),
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
    for (const field of ["image", "vcpus", "memMiB", "diskMiB", "desktop"] as const) {
      if (b[field] !== undefined) throw new AppError("bad_request", `${field}: a fork's is its checkpoint's (leave it out with fromCheckpoint)`);
    }
    const forkOp = op(fleet, "fork");
    const ckp = await ownCheckpointRef(repo(deps), agents, caller, fromCheckpoint, "fromCheckpoint");
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
      desktop: source.desktop,
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
}

type CreateAgentInput = z.infer<typeof CreateAgentBody>;

/** The display size an agent of `image` gets: the one asked for, else its image's default; none for an image without a desktop (asking is a 400). */
function desktopFor(image: string, config: ImageConfig | undefined, asked: DesktopSize | undefined): DesktopSize | null {
  if (!config?.desktop) {
    if (asked) throw new AppError("bad_request", `desktop: image "${image}" has no desktop (build it FROM agentvm/desktop:bookworm)`);
    return null;
  }
  return asked ?? config.desktop;
}

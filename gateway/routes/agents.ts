// Admin API under /v1/agents: create, list, get, update, delete, hibernate, wake, keep-awake leases, the event log.
import { Hono, type Context } from "hono";
import { AppError } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import type { VmStatus } from "../../contracts/agent.ts";
import { agentSpec, ownAgent as findOwnAgent, type AgentRow } from "../agent-repo.ts";
import type { GatewayDeps } from "../deps.ts";
import { requireScope, type Caller, type GatewayEnv } from "../../contracts/caller.ts";
import { jsonBody, optBool, optInt, optString, rejectUnknown, type Json } from "../validate.ts";
import type { EffectiveLimits, ProxyCore } from "../proxy-core.ts";
import { noOverrides, type AgentLimitOverrides, type AgentSettingsPatch } from "../proxy-agents.ts";
import { effectiveNonWaking, parseNonWaking } from "../proxy-policy.ts";

const createFields = ["name", "image", "vcpus", "memMiB", "diskMiB", "idleTimeoutMs", "streamIdleMs", "public", "allowEgress", "nonWaking", "limits"] as const;
const patchFields = ["idleTimeoutMs", "streamIdleMs", "nonWaking", "limits"] as const;
const limitFields = ["responseTimeoutMs", "proxyIdleTimeoutMs", "maxBodyBytes"] as const;
const idleRange = { min: 100, max: 7 * 24 * 3600_000 };
/** A built-in image (`demo`), `name[:tag]` of a built one (names as in images/routes.ts), or `sha256:<digest>`. */
const imageRefPattern = /^(?:sha256:[0-9a-f]{64}|[a-z0-9][a-z0-9._/-]{0,127}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?)$/;

/** `limits` in an API body: each field an integer in range, or null for the gateway's global value. */
function parseLimits(body: Json): Partial<AgentLimitOverrides> | undefined {
  const v = body.limits;
  if (v === undefined) return undefined;
  if (typeof v !== "object" || v === null || Array.isArray(v)) throw new AppError("bad_request", `limits must be an object {${limitFields.join(", ")}}`);
  const o = v as Json;
  rejectUnknown(o, limitFields);
  const out: Partial<AgentLimitOverrides> = {};
  const field = (key: (typeof limitFields)[number], range: { min: number; max: number }) => {
    if (o[key] === undefined) return;
    out[key] = o[key] === null ? null : (optInt(o, key, range) ?? null);
  };
  field("responseTimeoutMs", { min: 100, max: 3600_000 });
  field("proxyIdleTimeoutMs", { min: 100, max: 7 * 24 * 3600_000 });
  field("maxBodyBytes", { min: 0, max: 2 ** 50 });
  return out;
}

export function agentRoutes(deps: GatewayDeps, proxy: ProxyCore): Hono<GatewayEnv> {
  const r = new Hono<GatewayEnv>();
  const { agents, fleet, config, settings } = deps;

  /** The agent as the API shows it: with the non-waking rules and the limits in force. */
  async function view(row: AgentRow, status: VmStatus | undefined) {
    const overrides = settings ? await settings.limits(row.id) : noOverrides;
    return agentJson(row, status, proxy.limitsOf(row, overrides));
  }

  const ownAgent = (c: Context<GatewayEnv>, caller: Caller) => findOwnAgent(agents, caller, c.req.param("id") ?? "");

  async function body(c: Context<GatewayEnv>) {
    const declared = Number(c.req.header("content-length") ?? "0");
    if (declared > config.maxApiBodyBytes) throw new AppError("payload_too_large", `body exceeds ${config.maxApiBodyBytes} bytes`);
    return jsonBody(c.req.raw);
  }

  function audit(c: Context<GatewayEnv>, caller: Caller, action: string, target: string, detail?: Record<string, unknown>) {
    return deps.audit.record({ tenantId: caller.tenantId, actor: caller.subject, action, target, requestId: c.get("requestId"), ...(detail ? { detail } : {}) });
  }

  r.post("/v1/agents", async (c) => {
    const caller = requireScope(c, "agents:admin");
    const b = await body(c);
    rejectUnknown(b, createFields);
    const image = optString(b, "image", imageRefPattern, "a built-in image, name[:tag] of a built image, or sha256:<digest>") ?? "demo";
    const nonWaking = parseNonWaking(b, "nonWaking");
    const limits = parseLimits(b);
    if (limits && Object.keys(limits).length > 0 && !settings) throw new AppError("bad_request", "this gateway keeps no per-agent limits");
    // A built image is pinned by digest at creation: a later build under the same tag does not change a live agent.
    const built = config.images.includes(image) ? undefined : await deps.imageCatalog?.resolve(caller.tenantId, image);
    if (!config.images.includes(image) && !built) {
      throw new AppError("bad_request", `unknown image "${image}" (built-in: ${config.images.join(", ")}${deps.imageCatalog ? "; built images: GET /v1/images" : ""})`);
    }
    const d = config.agentDefaults;
    const row = await agents.create({
      id: newId("agent"),
      tenantId: caller.tenantId,
      name: optString(b, "name", /^[\w .:-]{1,100}$/, "1–100 letters, digits, spaces or . _ : -") ?? "agent",
      image: built ? `${built.name}:${built.tag}` : image,
      imageDigest: built?.digest ?? null,
      vcpus: optInt(b, "vcpus", { min: 1, max: 16 }) ?? d.vcpus,
      memMiB: optInt(b, "memMiB", { min: 64, max: 65_536 }) ?? d.memMiB,
      diskMiB: optInt(b, "diskMiB", { min: 64, max: 1024 * 1024 }) ?? d.diskMiB ?? 1024,
      idleTimeoutMs: optInt(b, "idleTimeoutMs", { min: 100, max: 7 * 24 * 3600_000 }) ?? d.idleTimeoutMs,
      streamIdleMs: optInt(b, "streamIdleMs", { min: 100, max: 7 * 24 * 3600_000 }) ?? d.streamIdleMs,
      public: optBool(b, "public") ?? false,
      allowEgress: optBool(b, "allowEgress") ?? false,
      nonWaking: nonWaking ?? null,
    });
    if (limits && Object.keys(limits).length > 0) await settings!.update(row.id, { limits });
    proxy.invalidate(row.id);
    await audit(c, caller, "agent.create", row.id, { image: row.image, imageDigest: row.imageDigest, vcpus: row.vcpus, memMiB: row.memMiB, diskMiB: row.diskMiB });
    return c.json(await view(row, undefined), 201);
  });

  r.get("/v1/agents", async (c) => {
    const caller = requireScope(c, "agents:admin");
    const rows = await agents.list(caller.tenantId);
    const out = await Promise.all(rows.map(async (row) => view(row, await fleet.status(row.id))));
    return c.json({ agents: out });
  });

  r.get("/v1/agents/:id", async (c) => {
    const row = await ownAgent(c, requireScope(c, "agents:admin"));
    return c.json(await view(row, await fleet.status(row.id)));
  });

  /** Changes what may change on a live agent: idle timeouts, non-waking rules (null = defaults), limits (null = global). */
  r.patch("/v1/agents/:id", async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownAgent(c, caller);
    if (!settings) throw new AppError("method_not_allowed", "this gateway cannot change agents");
    const b = await body(c);
    rejectUnknown(b, patchFields);
    const patch: AgentSettingsPatch = {};
    const idle = optInt(b, "idleTimeoutMs", idleRange);
    if (idle !== undefined) patch.idleTimeoutMs = idle;
    const streamIdle = optInt(b, "streamIdleMs", idleRange);
    if (streamIdle !== undefined) patch.streamIdleMs = streamIdle;
    const nonWaking = parseNonWaking(b, "nonWaking");
    if (nonWaking !== undefined) patch.nonWaking = nonWaking;
    const limits = parseLimits(b);
    if (limits) patch.limits = limits;
    await settings.update(row.id, patch);
    proxy.invalidate(row.id);
    await audit(c, caller, "agent.update", row.id, { ...patch });
    const updated = (await agents.get(row.id)) ?? row;
    return c.json(await view(updated, await fleet.status(row.id)));
  });

  r.delete("/v1/agents/:id", async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownAgent(c, caller);
    await fleet.remove(row.id);
    await agents.markDeleted(row.id);
    proxy.invalidate(row.id);
    await audit(c, caller, "agent.delete", row.id);
    return c.json({ id: row.id, deleted: true });
  });

  r.post("/v1/agents/:id/hibernate", async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownAgent(c, caller);
    const state = await fleet.hibernate(row.id);
    await audit(c, caller, "agent.hibernate", row.id, { state });
    return c.json({ id: row.id, state });
  });

  r.post("/v1/agents/:id/wake", async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownAgent(c, caller);
    const info = await fleet.wake(agentSpec(row), "api");
    await audit(c, caller, "agent.wake", row.id, { wake: info.wake, runId: info.runId });
    return c.json({ id: row.id, state: "running", ...info });
  });

  r.post("/v1/agents/:id/leases", async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownAgent(c, caller);
    const b = await body(c);
    rejectUnknown(b, ["ttlMs"]);
    const ttlMs = optInt(b, "ttlMs", { min: 1000, max: 24 * 3600_000 });
    if (ttlMs === undefined) throw new AppError("bad_request", "ttlMs is required (1000 to 86400000)");
    const lease = await fleet.addLease(agentSpec(row), ttlMs);
    await audit(c, caller, "agent.lease", row.id, { leaseId: lease.leaseId, ttlMs });
    return c.json({ leaseId: lease.leaseId, agentId: row.id, expiresAt: new Date(lease.expiresAt).toISOString() }, 201);
  });

  r.delete("/v1/agents/:id/leases/:leaseId", async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownAgent(c, caller);
    const leaseId = c.req.param("leaseId");
    if (!(await fleet.dropLease(row.id, leaseId))) throw new AppError("not_found", `lease ${leaseId.slice(0, 64)} not found`);
    await audit(c, caller, "agent.lease.drop", row.id, { leaseId });
    return c.json({ leaseId, dropped: true });
  });

  r.get("/v1/agents/:id/events", async (c) => {
    const row = await ownAgent(c, requireScope(c, "agents:admin"));
    const limit = Math.min(Math.max(Number(c.req.query("limit") ?? 100) || 100, 1), 1000);
    const events = await agents.events(row.id, limit);
    return c.json({ events });
  });

  return r;
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
    state: status?.state ?? row.state,
    lastWakeAt: status?.lastWakeAt !== undefined ? new Date(status.lastWakeAt).toISOString() : (row.lastWakeAt?.toISOString() ?? null),
    inFlight: status?.inFlight ?? 0,
    leases: status?.leases ?? 0,
    /** The last failed hibernate (full disk, say) until one succeeds: the agent stays awake meanwhile. */
    lastHibernateError: status?.lastHibernateError ?? null,
    createdAt: row.createdAt.toISOString(),
  };
}

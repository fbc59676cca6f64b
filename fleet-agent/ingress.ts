// The host's HTTP API that gateways call: every call carries a gateway-signed token for this host; all logic is the local fleet's.
import type { IncomingMessage } from "node:http";
import type { Duplex } from "node:stream";
import { Hono, type Context } from "hono";
import { AppError, logFailure, toErrorResponse } from "../lib/errors.ts";
import { newId } from "../lib/ids.ts";
import type { Logger } from "../lib/log.ts";
import { metricsPath, metricsResponse, type MetricsEndpoint } from "../lib/metrics-endpoint.ts";
import { readinessResponse, type ReadinessChecks } from "../lib/readiness.ts";
import { upgradeRequestHeaders, withoutHopByHop } from "../lib/http-headers.ts";
import { sendErrorOnSocket } from "../lib/node-respond.ts";
import type { LocalFleet } from "./local-fleet.ts";
import { hostCallMethod, hostErrorHeader, hostOpPaths, hostTokenHeader, verifyHostCall, type HostCall, type HostOp } from "../contracts/host-protocol.ts";

export interface IngressDeps {
  hostId: string;
  /** `componentKey(COMPONENT_SECRET)`: the secret gateways sign host tokens with. */
  key: Uint8Array;
  /** The in-process fleet of this host (`createLocalFleet(host)`): the one code path for waking, forwarding and relaying. */
  fleet: LocalFleet;
  log: Logger;
  /** What `GET /readyz` checks (the database the event log and heartbeat need); none: it answers ready. */
  readiness?: ReadinessChecks;
  /** `GET /metrics` (the operator's scrape, its own bearer token, no host token); none: it answers 404, metrics are off. */
  metrics?: MetricsEndpoint;
}

type IngressEnv = { Variables: { requestId: string } };

export function createIngress(deps: IngressDeps): Hono<IngressEnv> {
  const { fleet, log } = deps;
  const app = new Hono<IngressEnv>();

  app.onError((err, c) => {
    const requestId = c.get("requestId") ?? newId("request");
    logFailure(log, err, { requestId, method: c.req.method, path: c.req.path }, "ingress call");
    return hostError(err, requestId);
  });
  app.notFound((c) => hostError(new AppError("not_found", `no route for ${c.req.method} ${c.req.path}`), c.get("requestId") ?? newId("request")));

  app.use(async (c, next) => {
    // The gateway's request id, so one id follows a call across the hop; a fresh one for anything else.
    const incoming = c.req.header("x-request-id");
    c.set("requestId", incoming && /^req_[0-9a-z]{4,40}$/.test(incoming) ? incoming : newId("request"));
    await next();
  });

  app.get("/healthz", (c) => c.json({ ok: true, hostId: deps.hostId }));
  // No token either, and nothing about agents: 200 {"ok":true,"database":"up"}, or 503 database_unavailable naming
  // {"database":"down"} while Postgres is away (awake and hibernated agents are still served; the event log spools).
  app.get("/readyz", (c) => readinessResponse(deps.readiness ?? {}, c.get("requestId")));
  app.get(metricsPath, (c) => metricsResponse(deps.metrics, c.req.header("authorization")));

  /** The call this request's token allows, if it is the operation (and method) of this route; 401 otherwise. */
  async function authorize<Op extends HostOp>(c: Context<IngressEnv>, op: Op): Promise<Extract<HostCall, { op: Op }>> {
    const call = await verifyHostCall(deps.key, deps.hostId, c.req.header(hostTokenHeader));
    if (call.op !== op) throw new AppError("unauthorized", `component token is for ${call.op}, not ${op}`);
    if (hostCallMethod(call) !== c.req.method) throw new AppError("unauthorized", `component token is for ${hostCallMethod(call)}, not ${c.req.method}`);
    return call as Extract<HostCall, { op: Op }>;
  }

  app.all(hostOpPaths.forward, async (c) => {
    const call = await authorize(c, "forward");
    const raw = c.req.raw;
    const headers = withoutHopByHop(raw.headers);
    headers.delete(hostTokenHeader);
    headers.delete("host");
    const hasBody = raw.body !== null && raw.method !== "GET" && raw.method !== "HEAD";
    const init: RequestInit & { duplex?: "half" } = { method: raw.method, headers };
    if (hasBody) {
      init.body = raw.body;
      init.duplex = "half";
    }
    const req = new Request(new URL(call.path, "http://agent"), init);
    const { responseTimeoutMs, proxyIdleTimeoutMs } = call;
    // The gateway's limits for the agent, applied here where the VM's doze is known (local-fleet.ts).
    const limits = responseTimeoutMs !== undefined && proxyIdleTimeoutMs !== undefined ? { limits: { responseTimeoutMs, proxyIdleTimeoutMs } } : {};
    // The exec server only when the gateway's signed call says so (its exec and files routes).
    const target = call.target === "exec" ? { target: "exec" as const } : {};
    const handOff = call.handOff ? { handOff: true } : {};
    const res = await fleet.forward(call.agent, req, { requestId: call.requestId, reason: call.reason, signal: raw.signal, ...limits, ...target, ...handOff });
    return new Response(res.body, { status: res.status, statusText: res.statusText, headers: withoutHopByHop(res.headers) });
  });

  app.post(hostOpPaths.wake, async (c) => {
    const call = await authorize(c, "wake");
    return c.json(await fleet.wake(call.agent, call.reason, { handOff: call.handOff === true }));
  });

  app.post(hostOpPaths.hibernate, async (c) => {
    const call = await authorize(c, "hibernate");
    return c.json({ state: await fleet.hibernate(call.agentId) });
  });

  app.get(hostOpPaths.status, async (c) => {
    const call = await authorize(c, "status");
    return c.json({ status: (await fleet.status(call.agentId)) ?? null });
  });

  app.get(hostOpPaths.statuses, async (c) => {
    const call = await authorize(c, "statuses");
    return c.json({ statuses: Object.fromEntries(await fleet.statuses(call.agentIds)) });
  });

  app.post(hostOpPaths.lease, async (c) => {
    const call = await authorize(c, "lease");
    return c.json(await fleet.addLease(call.agent, call.ttlMs));
  });

  app.post(hostOpPaths["drop-lease"], async (c) => {
    const call = await authorize(c, "drop-lease");
    return c.json({ dropped: await fleet.dropLease(call.agentId, call.leaseId) });
  });

  // The log streams as it is read (a follow until the gateway goes away); 204: this host has no such agent.
  app.get(hostOpPaths.logs, async (c) => {
    const call = await authorize(c, "logs");
    const body = await fleet.logs(call.agentId, { tailBytes: call.tailBytes, follow: call.follow, signal: c.req.raw.signal });
    if (!body) return c.body(null, 204);
    return new Response(body, { headers: { "content-type": "application/octet-stream", "cache-control": "no-store" } });
  });

  // Checkpoints: the local fleet's, which answers 501 checkpoints_unsupported when this host's driver keeps none.
  app.post(hostOpPaths.checkpoint, async (c) => {
    const call = await authorize(c, "checkpoint");
    return c.json(
      await checkpointOps(fleet).checkpoint!(call.agent, {
        ...(call.name !== undefined ? { name: call.name } : {}),
        ...(call.requestId ? { requestId: call.requestId } : {}),
      }),
    );
  });

  app.post(hostOpPaths["restore-checkpoint"], async (c) => {
    const call = await authorize(c, "restore-checkpoint");
    return c.json({ state: await checkpointOps(fleet).restoreCheckpoint!(call.agent, call.checkpointId, call.requestId) });
  });

  app.post(hostOpPaths.fork, async (c) => {
    const call = await authorize(c, "fork");
    return c.json({ state: await checkpointOps(fleet).fork!(call.agent, call.checkpointId, call.requestId) });
  });

  app.post(hostOpPaths["delete-checkpoint"], async (c) => {
    const call = await authorize(c, "delete-checkpoint");
    await checkpointOps(fleet).deleteCheckpoint!(call.agentId, call.checkpointId);
    return c.json({ deleted: true });
  });

  // This host's warm templates (none when its driver keeps none): a read that wakes nothing.
  app.get(hostOpPaths.templates, async (c) => {
    await authorize(c, "templates");
    return c.json({ templates: (await fleet.templates?.()) ?? [] });
  });

  app.post(hostOpPaths.remove, async (c) => {
    const call = await authorize(c, "remove");
    await fleet.remove(call.agentId);
    return c.json({ removed: true });
  });

  return app;
}

export interface IngressUpgrade {
  /** The ingress server's `upgrade` listener: `/v1/websocket` with a valid token is relayed to the agent; anything else gets the error envelope. */
  handle(req: IncomingMessage, socket: Duplex, head: Buffer): void;
  /** WebSockets open through this host. */
  active(): number;
}

/**
 * WebSockets for gateways that cannot reach the VM (a remote fleet): relayed by this host's fleet, exactly as for a
 * gateway in the same process, so data frames touch the host's ticket and a hibernation closes the socket with
 * 1001. The gateway only joins bytes between its client and this socket.
 */
export function createIngressUpgrade(deps: IngressDeps): IngressUpgrade {
  const { fleet, log } = deps;

  async function handle(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    socket.on("error", () => socket.destroy());
    const incoming = req.headers["x-request-id"];
    let requestId = typeof incoming === "string" && /^req_[0-9a-z]{4,40}$/.test(incoming) ? incoming : newId("request");
    try {
      const path = (req.url ?? "/").split("?")[0];
      if (path !== hostOpPaths.websocket) throw new AppError("not_found", `no upgrade route for ${req.url ?? "/"}`);
      const token = req.headers[hostTokenHeader];
      const call = await verifyHostCall(deps.key, deps.hostId, typeof token === "string" ? token : undefined);
      if (call.op !== "websocket") throw new AppError("unauthorized", `component token is for ${call.op}, not websocket`);
      if (req.method !== "GET") throw new AppError("unauthorized", `component token is for GET, not ${req.method ?? ""}`);
      requestId = call.requestId;
      // The gateway already applied the header rules; the host token is ours, and the agent's host is its endpoint.
      const raw: string[] = [];
      for (let i = 0; i < req.rawHeaders.length; i += 2) {
        if (req.rawHeaders[i]!.toLowerCase() !== hostTokenHeader) raw.push(req.rawHeaders[i]!, req.rawHeaders[i + 1]!);
      }
      const one = (name: string) => (typeof req.headers[name] === "string" ? (req.headers[name] as string) : undefined);
      const headers = upgradeRequestHeaders(
        raw,
        { clientIp: undefined, proto: one("x-forwarded-proto") ?? "http", host: one("x-forwarded-host") ?? "", requestId },
        { stripAuthorization: false, host: "" },
      );
      await fleet.upgrade(call.agent, req, socket, head, {
        requestId,
        reason: call.reason,
        pathInside: call.path,
        headers,
        proxyIdleTimeoutMs: call.proxyIdleTimeoutMs,
        responseTimeoutMs: call.responseTimeoutMs,
      });
    } catch (err) {
      logFailure(log, err, { requestId, method: req.method ?? "GET", path: req.url ?? "" }, "ingress upgrade");
      if (socket.destroyed) return;
      // Marked as the host's own answer, like every error of the ingress.
      sendErrorOnSocket(socket, err, requestId, [[hostErrorHeader, err instanceof AppError ? err.code : "internal"]]);
    }
  }

  return {
    handle(req, socket, head) {
      void handle(req, socket, head);
    },
    active: () => fleet.websockets(),
  };
}

/** The local fleet's checkpoint operations (it has all of them; the port makes them optional for other fleets). */
function checkpointOps(fleet: LocalFleet): Required<Pick<LocalFleet, "checkpoint" | "restoreCheckpoint" | "fork" | "deleteCheckpoint">> {
  const { checkpoint, restoreCheckpoint, fork, deleteCheckpoint } = fleet;
  if (!checkpoint || !restoreCheckpoint || !fork || !deleteCheckpoint) throw new AppError("checkpoints_unsupported", "this host's fleet keeps no checkpoints");
  return { checkpoint, restoreCheckpoint, fork, deleteCheckpoint };
}

/** The one error envelope, marked as the host's own answer (not the agent's). */
function hostError(err: unknown, requestId: string): Response {
  const res = toErrorResponse(err, requestId);
  res.headers.set(hostErrorHeader, err instanceof AppError ? err.code : "internal");
  return res;
}

// The Node fast path: agent traffic (`/a/{id}/…`, `{id}.{domain}`, WebSocket upgrades) handled beside the Hono app.
//
// Same rules as gateway/proxy.ts (through proxy-core.ts and proxy-policy.ts), but no web Request/Response objects
// and no web streams on the way: Node's parser in, a kept-alive raw connection to the agent out, bytes passed
// through with backpressure. Everything that is not agent traffic goes to the Hono app (the control API).
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { pipeline, Readable } from "node:stream";
import type { Duplex } from "node:stream";
import { AppError } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import type { Logger } from "../../lib/log.ts";
import type { Ticket } from "../../fleet-agent/host.ts";
import { bearerToken, type Authenticator } from "../auth.ts";
import type { Caller } from "../auth-context.ts";
import type { ProxyCore, ResolvedAgent } from "../proxy-core.ts";
import { upstreamRequestHeadLines, upstreamRequestHeaders, withoutHopByHop } from "../proxy-headers.ts";
import { agentTarget, type AgentTarget } from "../proxy-policy.ts";
import { upgradeRequestHeaders, WebSocketRelay } from "../websocket-relay.ts";
import { HttpExchange, type ExchangeEnv } from "./exchange.ts";
import { logFailure, sendError, sendErrorOnSocket, sendPlain } from "./respond.ts";
import { UpstreamPool } from "./upstream-pool.ts";
import { ActiveList } from "./active-list.ts";

const kLastCaller = Symbol("agentvm.lastCaller");
type SocketWithCaller = Socket & { [kLastCaller]?: { header: string; caller: Caller; until: number } };

/** The `exp` claim of a JWT the authenticator already verified, ms since the epoch; undefined when absent. */
function tokenExpiry(token: string): number | undefined {
  try {
    const payload = JSON.parse(Buffer.from(token.split(".")[1] ?? "", "base64url").toString("utf8")) as { exp?: unknown };
    return typeof payload.exp === "number" ? payload.exp * 1000 : undefined;
  } catch {
    return undefined;
  }
}

export interface NodeProxyDeps {
  core: ProxyCore;
  auth: Authenticator;
  /** `{agentId}.{domain}` hosts route to agents. */
  domain: string | undefined;
  log: Logger;
  /** Largest response head an agent may send, bytes (502 beyond). */
  maxResponseHeadBytes?: number;
  /** Idle kept-alive connections to an agent are closed after this long (below the agent's keep-alive timeout). */
  upstreamIdleMs?: number;
}

export interface NodeProxy {
  /** Takes the request when it is agent traffic (answers true); otherwise leaves it to the Hono app. */
  handle(req: IncomingMessage, res: ServerResponse, expectContinue: boolean): boolean;
  /** A WebSocket (or other) upgrade: relayed to the agent, or refused with the error envelope. */
  upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void;
  /** Calls and sockets in progress (exchanges + WebSockets). */
  active(): { exchanges: number; websockets: number };
  /** Stops the timeout sweep, ends WebSockets, closes kept-alive agent connections. */
  close(): void;
}

export function createNodeProxy(deps: NodeProxyDeps): NodeProxy {
  const { core, auth, log } = deps;
  const domain = deps.domain?.toLowerCase();
  const env: ExchangeEnv = { log, active: new ActiveList<HttpExchange>(), maxResponseHeadBytes: deps.maxResponseHeadBytes ?? 65_536 };
  const relays = new Set<WebSocketRelay>();
  const pools = new Map<string, { runId: string; pool: UpstreamPool }>();
  const upstreamIdleMs = deps.upstreamIdleMs ?? 4_000;

  let tick = 0;
  const sweeper = setInterval(() => {
    const now = performance.now();
    env.active.forEach((ex) => ex.sweep(now));
    for (const r of relays) r.sweep(now);
    if (++tick % 10 === 0) {
      for (const [id, p] of pools) {
        p.pool.sweep(now);
        if (p.pool.size === 0) pools.delete(id);
      }
    }
  }, 100);
  sweeper.unref();

  /** One pool per VM run: a woken VM may be a new process, kept-alive connections of the old one are dropped. */
  function poolFor(agentId: string, ticket: Ticket): UpstreamPool {
    const current = pools.get(agentId);
    if (current && current.runId === ticket.wake.runId) return current.pool;
    current?.pool.close();
    const pool = new UpstreamPool(ticket.endpoint.host, ticket.endpoint.port, { connectTimeoutMs: core.config.connectTimeoutMs, idleTimeoutMs: upstreamIdleMs, maxIdle: 256 });
    pools.set(agentId, { runId: ticket.wake.runId, pool });
    return pool;
  }

  // Verified callers by token, until the token's own expiry (at most a minute): the warm path then never awaits.
  const callers = new Map<string, { caller: Caller; until: number }>();

  async function verify(token: string): Promise<Caller> {
    const caller = await auth.verify(token);
    const exp = tokenExpiry(token);
    if (exp !== undefined) {
      if (callers.size >= 10_000) callers.delete(callers.keys().next().value!);
      callers.set(token, { caller, until: Math.min(exp, Date.now() + 60_000) });
    }
    return caller;
  }

  function cachedCaller(token: string): Caller | undefined {
    const hit = callers.get(token);
    if (!hit) return undefined;
    if (hit.until > Date.now()) return hit.caller;
    callers.delete(token);
    return undefined;
  }

  function forwardedFrom(req: IncomingMessage, requestId: string) {
    return {
      clientIp: req.socket.remoteAddress,
      proto: (req.socket as Socket & { encrypted?: boolean }).encrypted ? "https" : "http",
      host: req.headers.host ?? "",
      requestId,
    };
  }

  function failed(req: IncomingMessage, res: ServerResponse, target: AgentTarget, requestId: string, err: unknown): void {
    logFailure(log, err, { requestId, method: req.method ?? "", path: req.url ?? "", agentId: target.agentId });
    const hasBody = req.headers["content-length"] !== undefined || req.headers["transfer-encoding"] !== undefined;
    void sendError(res, err, requestId, { closeConnection: hasBody && !req.complete });
  }

  /** A call to an agent: synchronous up to the wake when the caller's token and the agent are in memory. */
  function run(req: IncomingMessage, res: ServerResponse, target: AgentTarget, expectContinue: boolean): void {
    const requestId = newId("request");
    const header = req.headers.authorization;
    // A kept-alive connection usually repeats its Authorization header: comparing it with the last one costs less
    // than parsing and hashing a token of several hundred bytes on every call.
    const socket = req.socket as SocketWithCaller;
    const last = socket[kLastCaller];
    if (header !== undefined && last !== undefined && last.header === header && last.until > Date.now()) {
      const agent = core.peek(target.agentId);
      if (agent) return admit(req, res, target, requestId, last.caller, agent, expectContinue);
    }
    let token: string | undefined;
    try {
      token = bearerToken(header);
    } catch (err) {
      return failed(req, res, target, requestId, err);
    }
    const caller = token === undefined ? undefined : cachedCaller(token);
    if (caller && header !== undefined) socket[kLastCaller] = { header, caller, until: callers.get(token!)!.until };
    const agent = core.peek(target.agentId);
    if (agent && (token === undefined || caller)) return admit(req, res, target, requestId, caller, agent, expectContinue);
    void (async () => {
      try {
        const c = token === undefined ? undefined : (caller ?? (await verify(token)));
        const a = agent ?? (await core.resolve(target.agentId));
        admit(req, res, target, requestId, c, a, expectContinue);
      } catch (err) {
        failed(req, res, target, requestId, err);
      }
    })();
  }

  function admit(req: IncomingMessage, res: ServerResponse, target: AgentTarget, requestId: string, caller: Caller | undefined, agent: ResolvedAgent, expectContinue: boolean): void {
    let leave: () => void;
    const method = req.method ?? "GET";
    try {
      core.authorize(agent, caller);
      const match = agent.matchNonWaking(method, target.pathInside, req.headers["user-agent"]);
      if (match) {
        core.nonWakingAnswer(agent, match, method, target.pathInside, requestId).then(
          (answer) => {
            if (expectContinue) res.setHeader("connection", "close");
            sendPlain(res, answer);
          },
          (err: unknown) => failed(req, res, target, requestId, err),
        );
        return;
      }
      core.checkDeclaredBody(agent, req.headers["content-length"]);
      leave = core.enter(agent);
    } catch (err) {
      return failed(req, res, target, requestId, err);
    }
    if (!core.fleet.acquire) {
      forwardThroughFleet(req, res, agent, target, caller, requestId, leave).catch((err: unknown) => {
        leave();
        failed(req, res, target, requestId, err);
      });
      return;
    }
    core.fleet.acquire(agent.spec, { requestId, reason: "request" }).then(
      (ticket) => {
        if (!res.socket || res.socket.destroyed) {
          // The client left while the agent woke: nothing to send.
          ticket.release();
          leave();
          return;
        }
        const ep = ticket.endpoint;
        const head = `${method} ${target.pathInside} HTTP/1.1\r\n${upstreamRequestHeadLines(req.rawHeaders, forwardedFrom(req, requestId), { stripAuthorization: caller !== undefined, host: `${ep.host}:${ep.port}` })}`;
        new HttpExchange({ req, res, requestId, agentId: agent.row.id, ticket, pool: poolFor(agent.row.id, ticket), head, limits: agent.limits, done: leave, expectContinue }, env).start();
      },
      (err: unknown) => {
        leave();
        failed(req, res, target, requestId, err);
      },
    );
  }

  /** For a Fleet without `acquire` (a remote one): the same call through `fleet.forward`, with web streams. */
  async function forwardThroughFleet(req: IncomingMessage, res: ServerResponse, agent: ResolvedAgent, target: AgentTarget, caller: Caller | undefined, requestId: string, leave: () => void): Promise<void> {
    const abort = new AbortController();
    let finished = false;
    res.on("close", () => {
      if (!finished) abort.abort();
      leave();
    });
    const headers = upstreamRequestHeaders(new Headers(req.headers as Record<string, string>), forwardedFrom(req, requestId), { stripAuthorization: caller !== undefined });
    headers.delete("host");
    const method = req.method ?? "GET";
    const hasBody = method !== "GET" && method !== "HEAD" && (req.headers["content-length"] !== undefined || req.headers["transfer-encoding"] !== undefined);
    const init: RequestInit & { duplex?: "half" } = { method, headers, signal: abort.signal };
    if (hasBody) {
      init.body = Readable.toWeb(req) as ReadableStream<Uint8Array>;
      init.duplex = "half";
    }
    const timer = setTimeout(() => abort.abort(new AppError("gateway_timeout", `agent ${agent.row.id} sent no response within ${agent.limits.responseTimeoutMs} ms`)), agent.limits.responseTimeoutMs);
    let r: Response;
    try {
      r = await core.fleet.forward(agent.spec, new Request(new URL(target.pathInside, "http://agent"), init), { requestId, reason: "request", signal: abort.signal });
    } catch (err) {
      throw abort.signal.reason instanceof AppError ? abort.signal.reason : err;
    } finally {
      clearTimeout(timer);
    }
    const out: string[] = [];
    withoutHopByHop(r.headers).forEach((v, k) => out.push(k, v));
    out.push("x-request-id", requestId);
    res.writeHead(r.status, out);
    if (!r.body) {
      finished = true;
      res.end();
      return;
    }
    const body = Readable.fromWeb(r.body as import("node:stream/web").ReadableStream).on("end", () => (finished = true));
    // An error here is the client leaving (our abort) or the host's stream breaking: either way the response just ends.
    pipeline(body, res, () => undefined);
  }

  async function upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    const requestId = newId("request");
    socket.on("error", () => socket.destroy());
    const target = agentTarget(req.url ?? "/", req.headers.host, domain);
    let leave: (() => void) | undefined;
    let ticket: Ticket | undefined;
    try {
      if (!target) throw new AppError("not_found", `no WebSocket route for ${req.url ?? "/"}`);
      if ((req.headers.upgrade ?? "").toLowerCase() !== "websocket") throw new AppError("bad_request", "only WebSocket upgrades are relayed");
      const token = bearerToken(req.headers.authorization);
      const caller = token === undefined ? undefined : (cachedCaller(token) ?? (await verify(token)));
      const agent = await core.resolve(target.agentId);
      core.authorize(agent, caller);
      leave = core.enter(agent);
      if (!core.fleet.acquire) {
        // A remote fleet: its host wakes the agent and relays the frames; the tenant slot is held until the handshake is over.
        if (!core.fleet.upgrade) throw new AppError("bad_gateway", "this gateway's fleet cannot relay WebSockets");
        const headers = upgradeRequestHeaders(req.rawHeaders, forwardedFrom(req, requestId), { stripAuthorization: caller !== undefined, host: "" });
        const { proxyIdleTimeoutMs, responseTimeoutMs } = agent.limits;
        await core.fleet.upgrade(agent.spec, req, socket, head, { requestId, reason: "request", pathInside: target.pathInside, headers, proxyIdleTimeoutMs, responseTimeoutMs });
        const done = leave;
        leave = undefined;
        done();
        return;
      }
      ticket = await core.fleet.acquire(agent.spec, { requestId, reason: "request" });
      if (socket.destroyed) {
        ticket.release();
        leave();
        return;
      }
      const ep = ticket.endpoint;
      const relay = new WebSocketRelay(
        {
          req,
          socket,
          head,
          requestId,
          agentId: agent.row.id,
          pathInside: target.pathInside,
          ticket,
          headers: upgradeRequestHeaders(req.rawHeaders, forwardedFrom(req, requestId), { stripAuthorization: caller !== undefined, host: `${ep.host}:${ep.port}` }),
          proxyIdleTimeoutMs: agent.limits.proxyIdleTimeoutMs,
          responseTimeoutMs: agent.limits.responseTimeoutMs,
          handshakeDone: leave,
        },
        { log, active: relays },
      );
      relay.start();
    } catch (err) {
      leave?.();
      if (socket.destroyed) return; // the client went away during the handshake: nobody to answer
      logFailure(log, err, { requestId, method: req.method ?? "GET", path: req.url ?? "", ...(target ? { agentId: target.agentId } : {}) });
      await sendErrorOnSocket(socket, err, requestId);
    }
  }

  return {
    handle(req, res, expectContinue) {
      const target = agentTarget(req.url ?? "/", req.headers.host, domain);
      if (!target) return false;
      run(req, res, target, expectContinue);
      return true;
    },
    upgrade(req, socket, head) {
      void upgrade(req, socket, head);
    },
    active() {
      return { exchanges: env.active.size, websockets: relays.size };
    },
    close() {
      clearInterval(sweeper);
      for (const r of relays) r.goingAway("gateway shutting down");
      for (const p of pools.values()) p.pool.close();
      pools.clear();
    },
  };
}

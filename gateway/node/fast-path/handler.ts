// The Node fast path: agent traffic (`/a/{id}/…`, `{id}.{domain}`, WebSocket upgrades) handled beside the Hono app.
//
// Same rules as gateway/proxy/route.ts (through proxy/core.ts and proxy/policy.ts), but no web Request/Response objects
// and no web streams on the way: Node's parser in, a kept-alive raw connection to the agent out, bytes passed
// through with backpressure. Everything that is not agent traffic goes to the Hono app (the control API).
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { pipeline, Readable, type Duplex } from "node:stream";
import { newId } from "../../../lib/ids.ts";
import type { Logger } from "../../../lib/log.ts";
import { bearerToken, type Authenticator } from "../../auth.ts";
import type { Caller } from "../../../contracts/caller.ts";
import { PerRunPools } from "../../../lib/per-run.ts";
import { AppError, logFailure } from "../../../lib/errors.ts";
import { proxiedCalls } from "../../../lib/metrics.ts";
import { sendError, sendErrorOnSocket } from "../../../lib/node-respond.ts";
import type { ProxyCore, ResolvedAgent } from "../../proxy/core.ts";
import { upgradeRequestHeaders, upstreamRequestHeadLines, upstreamRequestHeaders } from "../../../lib/http-headers.ts";
import { forwardCall } from "../../proxy/forward.ts";
import { agentTarget, type AgentTarget } from "../../proxy/policy.ts";
import type { AgentHold, NodeFleet } from "../fleet.ts";
import { HttpExchange, type ExchangeEnv } from "./exchange.ts";
import { sendPlain } from "./respond.ts";
import { UpstreamPool } from "./upstream-pool.ts";
import { ActiveList } from "./active-list.ts";
import { watchAnswerStatus } from "./upgrade-status.ts";

const kLastCaller = Symbol("agentvm.lastCaller");
type SocketWithCaller = Socket & { [kLastCaller]?: { header: string; caller: Caller; until: number } };

export interface NodeProxyDeps {
  core: ProxyCore;
  /** The fleet behind \`core\`, with what it can do on Node (\`withHold\`, \`upgrade\`). */
  fleet: NodeFleet;
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
  /** Calls in progress on raw connections to agents (WebSockets are the fleet's: see its relays). */
  active(): { exchanges: number };
  /** Stops the timeout sweep, closes kept-alive agent connections. */
  close(): void;
}

export function createNodeProxy(deps: NodeProxyDeps): NodeProxy {
  const { core, auth, log } = deps;
  const domain = deps.domain?.toLowerCase();
  const env: ExchangeEnv = { log, active: new ActiveList<HttpExchange>(), maxResponseHeadBytes: deps.maxResponseHeadBytes ?? 65_536 };
  const upstreamIdleMs = deps.upstreamIdleMs ?? 4_000;
  // Every call this entry takes is counted once, when its response closes, by the status it was answered with.
  const counted = proxiedCalls(core.metrics);
  const countAnswer = function (this: ServerResponse): void {
    counted(this.headersSent ? this.statusCode : undefined);
  };
  const { fleet } = deps;
  const pools = new PerRunPools<UpstreamPool>(
    (ep) => new UpstreamPool(ep.host, ep.port, { connectTimeoutMs: core.config.connectTimeoutMs, idleTimeoutMs: upstreamIdleMs, maxIdle: 256 }),
    (pool) => pool.close(),
  );

  let tick = 0;
  const sweeper = setInterval(() => {
    const now = performance.now();
    env.active.forEach((ex) => ex.sweep(now));
    if (++tick % 10 === 0) {
      pools.sweep((pool) => {
        pool.sweep(now);
        return pool.size > 0;
      });
    }
  }, 100);
  sweeper.unref();

  // Tokens the authenticator already verified are answered from its memory: the warm path then never awaits.
  const cachedCaller = (token: string): Caller | undefined => auth.peek?.(token)?.caller;
  const verify = (token: string): Promise<Caller> => auth.verify(token);

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
    sendError(res, err, requestId, { closeConnection: hasBody && !req.complete });
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
      if (agent && core.callerReady(last.caller)) return admit(req, res, target, requestId, last.caller, agent, expectContinue);
    }
    let token: string | undefined;
    try {
      token = bearerToken(header);
    } catch (err) {
      return failed(req, res, target, requestId, err);
    }
    const known = token === undefined ? undefined : auth.peek?.(token);
    const caller = known?.caller;
    if (known && header !== undefined) socket[kLastCaller] = { header, caller: known.caller, until: known.until };
    const agent = core.peek(target.agentId);
    if (agent && (token === undefined || (caller && core.callerReady(caller)))) return admit(req, res, target, requestId, caller, agent, expectContinue);
    void (async () => {
      try {
        const c = token === undefined ? undefined : (caller ?? (await verify(token)));
        // The token's tenant must be active (as on every route); its status is then in memory for `authorize`.
        if (c) await core.admitCaller(c, requestId);
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
    if (!fleet.withHold) {
      forwardThroughFleet(req, res, agent, target, caller, requestId, leave).catch((err: unknown) => failed(req, res, target, requestId, err));
      return;
    }
    fleet
      .withHold(agent.spec, { requestId, reason: "request" }, (hold) => {
        if (!res.socket || res.socket.destroyed) {
          // The client left while the agent woke: nothing to send.
          leave();
          return Promise.resolve();
        }
        return new Promise<void>((over) => {
          const ep = hold.endpoint;
          const head = `${method} ${target.pathInside} HTTP/1.1\r\n${upstreamRequestHeadLines(req.rawHeaders, forwardedFrom(req, requestId), { stripAuthorization: caller !== undefined, host: `${ep.host}:${ep.port}` })}`;
          const done = () => {
            leave();
            over();
          };
          new HttpExchange({ req, res, requestId, agentId: agent.row.id, ticket: hold, pool: poolFor(agent.row.id, hold), head, limits: agent.limits, done, expectContinue }, env).start();
        });
      })
      .catch((err: unknown) => {
        leave();
        failed(req, res, target, requestId, err);
      });
  }

  function poolFor(agentId: string, hold: AgentHold): UpstreamPool {
    return pools.get(agentId, hold.wake.runId, hold.endpoint);
  }

  /**
   * For a fleet the gateway cannot reach the VMs of (remote hosts): the same call through `fleet.forward`, under the
   * same limits as every web entry (forwardCall: body limit without a declared length, response and idle timeouts).
   */
  async function forwardThroughFleet(req: IncomingMessage, res: ServerResponse, agent: ResolvedAgent, target: AgentTarget, caller: Caller | undefined, requestId: string, leave: () => void): Promise<void> {
    const clientGone = new AbortController();
    let finished = false;
    res.on("close", () => {
      if (!finished) clientGone.abort();
    });
    const headers = upstreamRequestHeaders(new Headers(req.headers as Record<string, string>), forwardedFrom(req, requestId), { stripAuthorization: caller !== undefined });
    headers.delete("host");
    const method = req.method ?? "GET";
    const hasBody = method !== "GET" && method !== "HEAD" && (req.headers["content-length"] !== undefined || req.headers["transfer-encoding"] !== undefined);
    const body = hasBody ? (Readable.toWeb(req) as ReadableStream<Uint8Array>) : null;
    const r = await forwardCall(core, agent, { method, pathInside: target.pathInside, headers, body, requestId, clientSignal: clientGone.signal, done: leave });
    const out: string[] = [];
    r.headers.forEach((v, k) => out.push(k, v));
    res.writeHead(r.status, out);
    if (!r.body) {
      finished = true;
      res.end();
      return;
    }
    const stream = Readable.fromWeb(r.body as import("node:stream/web").ReadableStream).on("end", () => (finished = true));
    // An error here is the client leaving (our abort), the host's stream breaking or the idle timeout: the response just ends.
    pipeline(stream, res, () => undefined);
  }

  async function upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    const requestId = newId("request");
    socket.on("error", () => socket.destroy());
    const target = agentTarget(req.url ?? "/", req.headers.host, domain);
    // Counted once it is over, by what it was answered (101, a refusal, an error), like every call of this entry;
    // only agent traffic is a proxied call (an upgrade of another path is refused, not counted).
    if (target) {
      const answered = watchAnswerStatus(socket);
      socket.once("close", () => counted(answered()));
    }
    let leave: (() => void) | undefined;
    try {
      if (!target) throw new AppError("not_found", `no WebSocket route for ${(req.url ?? "/").slice(0, 200)}`);
      if ((req.headers.upgrade ?? "").toLowerCase() !== "websocket") throw new AppError("bad_request", "only WebSocket upgrades are relayed");
      const token = bearerToken(req.headers.authorization);
      const caller = token === undefined ? undefined : (cachedCaller(token) ?? (await verify(token)));
      if (caller) await core.admitCaller(caller, requestId);
      const agent = await core.resolve(target.agentId);
      core.authorize(agent, caller);
      if (!fleet.upgrade) throw new AppError("bad_gateway", "this gateway's fleet cannot relay WebSockets");
      // The agent's host wakes it and relays the frames; the tenant slot is held until the handshake is over.
      leave = core.enter(agent);
      const headers = upgradeRequestHeaders(req.rawHeaders, forwardedFrom(req, requestId), { stripAuthorization: caller !== undefined, host: "" });
      const { proxyIdleTimeoutMs, responseTimeoutMs } = agent.limits;
      await fleet.upgrade(agent.spec, req, socket, head, { requestId, reason: "request", pathInside: target.pathInside, headers, proxyIdleTimeoutMs, responseTimeoutMs });
      leave();
    } catch (err) {
      leave?.();
      if (socket.destroyed) return; // the client went away during the handshake: nobody to answer
      logFailure(log, err, { requestId, method: req.method ?? "GET", path: req.url ?? "", ...(target ? { agentId: target.agentId } : {}) });
      sendErrorOnSocket(socket, err, requestId);
    }
  }

  return {
    handle(req, res, expectContinue) {
      const target = agentTarget(req.url ?? "/", req.headers.host, domain);
      if (!target) return false;
      res.on("close", countAnswer);
      run(req, res, target, expectContinue);
      return true;
    },
    upgrade(req, socket, head) {
      void upgrade(req, socket, head);
    },
    active() {
      return { exchanges: env.active.size };
    },
    close() {
      clearInterval(sweeper);
      pools.close();
    },
  };
}

// The Node fast path: agent traffic (`/a/{id}/…`, `{id}.{domain}`, WebSocket upgrades) handled beside the Hono app.
//
// Admitted like gateway/proxy/route.ts's calls, by the one admission (proxy/admission.ts), but no web Request/Response
// objects and no web streams on the way: Node's parser in, a kept-alive raw connection to the agent out, bytes passed
// through with backpressure. Everything that is not agent traffic goes to the Hono app (the control API).
import { IncomingMessage, ServerResponse } from "node:http";
import type { ClientRequest, ClientResponse } from "./client-side.ts";
import type { Socket } from "node:net";
import { pipeline, Readable, type Duplex } from "node:stream";
import { newId } from "../../../lib/ids.ts";
import type { Logger } from "../../../lib/log.ts";
import type { Authenticator } from "../../auth.ts";
import type { Caller } from "../../../contracts/caller.ts";
import { PerRunPools } from "../../../lib/per-run.ts";
import { AppError, logFailure } from "../../../lib/errors.ts";
import { proxiedCalls } from "../../../lib/metrics.ts";
import { sendError, sendErrorOnSocket } from "../../../lib/node-respond.ts";
import type { ProxyCore, ResolvedAgent } from "../../proxy/core.ts";
import { upgradeRequestHeaders, upstreamRequestHeadLines, upstreamRequestHeaders } from "../../../lib/http-headers.ts";
import { forwardCall } from "../../proxy/forward.ts";
import { agentTarget } from "../../proxy/policy.ts";
import { createAdmission, type ProxyCall, type ProxyEntry } from "../../proxy/admission.ts";
import type { AgentHold, NodeFleet } from "../fleet.ts";
import { HttpExchange, type ExchangeEnv } from "./exchange.ts";
import { plainResponseText, sendPlain } from "./respond.ts";
import { UpstreamPool } from "./upstream-pool.ts";
import { ActiveList } from "./active-list.ts";
import { watchAnswerStatus } from "./upgrade-status.ts";
import { lazySweeper } from "../../../lib/node-sweeper.ts";

const kLastCaller = Symbol("agentvm.lastCaller");
type SocketWithCaller = Socket & { [kLastCaller]?: { header: string; caller: Caller; until: number } };

/** A call on this entry: what admission reads, and where it is answered. */
interface FastCall extends ProxyCall {
  req: ClientRequest;
  res: ClientResponse;
  /** `Expect: 100-continue`: the 100 goes out once the agent is awake and reachable. */
  expectContinue: boolean;
}

/** A WebSocket upgrade on this entry. */
interface UpgradeCall extends ProxyCall {
  req: IncomingMessage;
  socket: Duplex;
  head: Buffer;
}

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
  handle(req: ClientRequest, res: ClientResponse, expectContinue: boolean): boolean;
  /** A WebSocket (or other) upgrade: relayed to the agent, or refused with the error envelope. */
  upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void;
  /** Calls of the raw front (gateway/node/fast-path/raw-front.ts) can be taken: the fleet gives holds on its VMs. */
  readonly takesRaw: boolean;
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
  const countAnswer = function (this: ClientResponse): void {
    counted(this.headersSent ? this.statusCode : undefined);
  };
  const { fleet } = deps;
  const admission = createAdmission(core, auth);
  const pools = new PerRunPools<UpstreamPool>(
    (ep) => new UpstreamPool(ep, { connectTimeoutMs: core.config.connectTimeoutMs, idleTimeoutMs: upstreamIdleMs, maxIdle: 256 }),
    (pool) => pool.close(),
  );

  // Exchanges' deadlines every 100 ms, idle upstream connections every second; only while there are any.
  let tick = 0;
  const sweeper = lazySweeper(100, (now) => {
    env.active.forEach((ex) => ex.sweep(now));
    if (++tick % 10 === 0) {
      pools.sweep((pool) => {
        pool.sweep(now);
        return pool.size > 0;
      });
    }
    return env.active.size > 0 || pools.size > 0;
  });

  function forwardedFrom(req: ClientRequest | IncomingMessage, requestId: string) {
    return {
      clientIp: req.socket.remoteAddress,
      proto: (req.socket as Socket & { encrypted?: boolean }).encrypted ? "https" : "http",
      host: req.headers.host ?? "",
      requestId,
    };
  }

  function failed(call: FastCall, err: unknown): void {
    const { req, res, requestId } = call;
    logFailure(log, err, { requestId, method: req.method ?? "", path: req.url ?? "", agentId: call.agentId });
    const hasBody = req.headers["content-length"] !== undefined || req.headers["transfer-encoding"] !== undefined;
    sendError(res, err, requestId, { closeConnection: hasBody && !req.complete });
  }

  /** What this entry does with an admitted call (admission.ts decides; synchronously up to the wake when the token and the agent are in memory). */
  const httpEntry: ProxyEntry<FastCall> = {
    relaysUpgrades: false,
    rememberedCaller(call) {
      const last = (call.req.socket as SocketWithCaller)[kLastCaller];
      return last !== undefined && last.header === call.authorization && last.until > Date.now() ? last.caller : undefined;
    },
    remember(call, known) {
      (call.req.socket as SocketWithCaller)[kLastCaller] = { header: call.authorization!, caller: known.caller, until: known.until };
    },
    answer(call, answer) {
      if (call.expectContinue) call.res.setHeader("connection", "close");
      sendPlain(call.res, answer);
    },
    fail: failed,
    forward(call, agent, caller) {
      return fleet.withHold ? forwardHeld(call, agent, caller) : forwardThroughFleet(call, agent, caller);
    },
  };

  /** Beside the agent's host: the VM held while a raw connection carries the exchange; over when the exchange is. */
  function forwardHeld(call: FastCall, agent: ResolvedAgent, caller: Caller | undefined): Promise<void> {
    const { req, res, requestId } = call;
    return fleet.withHold!(agent.spec, { requestId, reason: "request" }, (hold) => {
      // The client left while the agent woke: nothing to send.
      if (!res.socket || res.socket.destroyed) return Promise.resolve();
      return new Promise<void>((over) => {
        const ep = hold.endpoint;
        const head = `${call.method} ${call.pathInside} HTTP/1.1\r\n${upstreamRequestHeadLines(req.rawHeaders, forwardedFrom(req, requestId), { stripAuthorization: caller !== undefined, host: `${ep.host}:${ep.port}` })}`;
        new HttpExchange(
          {
            req,
            res,
            requestId,
            agentId: agent.row.id,
            ticket: hold,
            pool: poolFor(agent.row.id, hold),
            head,
            limits: agent.limits,
            done: over,
            expectContinue: call.expectContinue,
          },
          env,
        ).start();
        sweeper.wake();
      });
    });
  }

  function poolFor(agentId: string, hold: AgentHold): UpstreamPool {
    return pools.get(agentId, hold.wake.runId, hold.endpoint);
  }

  /**
   * For a fleet the gateway cannot reach the VMs of (remote hosts): the same call through `fleet.forward`, under the
   * same limits as every web entry (forwardCall: body limit without a declared length, response and idle timeouts).
   */
  function forwardThroughFleet(call: FastCall, agent: ResolvedAgent, caller: Caller | undefined): Promise<void> {
    const { req, res, requestId, method } = call;
    // Only Node's own requests come this way: the raw front is offered only where the fleet holds (`takesRaw`).
    if (!(req instanceof IncomingMessage) || !(res instanceof ServerResponse))
      return Promise.reject(new AppError("internal", "a raw call reached the web-stream path"));
    const clientGone = new AbortController();
    let finished = false;
    res.on("close", () => {
      if (!finished) clientGone.abort();
    });
    const headers = upstreamRequestHeaders(new Headers(req.headers as Record<string, string>), forwardedFrom(req, requestId), {
      stripAuthorization: caller !== undefined,
    });
    headers.delete("host");
    const hasBody = method !== "GET" && method !== "HEAD" && (req.headers["content-length"] !== undefined || req.headers["transfer-encoding"] !== undefined);
    const body = hasBody ? (Readable.toWeb(req) as ReadableStream<Uint8Array>) : null;
    return forwardCall(core, agent, { method, pathInside: call.pathInside, headers, body, requestId, clientSignal: clientGone.signal }, (r) => {
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
    });
  }

  /** WebSocket upgrades: the agent's host wakes it and relays the frames; the tenant slot is held until the handshake is over. */
  const upgradeEntry: ProxyEntry<UpgradeCall> = {
    get relaysUpgrades() {
      return fleet.upgrade !== undefined;
    },
    answer(call, answer) {
      // Admission relays every upgrade (no non-waking answer): should one come, it ends the handshake as on a plain call.
      if (!call.socket.destroyed) call.socket.end(plainResponseText(answer));
    },
    fail(call, err) {
      const { req, socket, requestId } = call;
      if (socket.destroyed) return; // the client went away during the handshake: nobody to answer
      logFailure(log, err, { requestId, method: req.method ?? "GET", path: req.url ?? "", agentId: call.agentId });
      sendErrorOnSocket(socket, err, requestId);
    },
    forward(call, agent, caller) {
      const { req, requestId } = call;
      const headers = upgradeRequestHeaders(req.rawHeaders, forwardedFrom(req, requestId), { stripAuthorization: caller !== undefined, host: "" });
      const { proxyIdleTimeoutMs, responseTimeoutMs } = agent.limits;
      return fleet.upgrade!(agent.spec, req, call.socket, call.head, {
        requestId,
        reason: "request",
        pathInside: call.pathInside,
        headers,
        proxyIdleTimeoutMs,
        responseTimeoutMs,
      });
    },
  };

  function upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    const requestId = newId("request");
    socket.on("error", () => socket.destroy());
    const target = agentTarget(req.url ?? "/", req.headers.host, domain);
    // Counted once it is over, by what it was answered (101, a refusal, an error), like every call of this entry;
    // only agent traffic is a proxied call (an upgrade of another path is refused, not counted).
    if (target) {
      const answered = watchAnswerStatus(socket);
      socket.once("close", () => counted(answered()));
    }
    try {
      if (!target) throw new AppError("not_found", `no WebSocket route for ${(req.url ?? "/").slice(0, 200)}`);
      if ((req.headers.upgrade ?? "").toLowerCase() !== "websocket") throw new AppError("bad_request", "only WebSocket upgrades are relayed");
    } catch (err) {
      logFailure(log, err, { requestId, method: req.method ?? "GET", path: req.url ?? "", ...(target ? { agentId: target.agentId } : {}) });
      return sendErrorOnSocket(socket, err, requestId);
    }
    const { authorization, "user-agent": userAgent, "content-length": contentLength } = req.headers;
    admission.admit<UpgradeCall>(
      {
        agentId: target.agentId,
        method: req.method ?? "GET",
        pathInside: target.pathInside,
        authorization,
        userAgent,
        contentLength,
        requestId,
        upgrade: true,
        req,
        socket,
        head,
      },
      upgradeEntry,
    );
  }

  return {
    takesRaw: fleet.withHold !== undefined,
    handle(req, res, expectContinue) {
      const target = agentTarget(req.url ?? "/", req.headers.host, domain);
      if (!target) return false;
      res.on("close", countAnswer);
      const { authorization, "user-agent": userAgent, "content-length": contentLength } = req.headers;
      admission.admit<FastCall>(
        {
          agentId: target.agentId,
          method: req.method ?? "GET",
          pathInside: target.pathInside,
          authorization,
          userAgent,
          contentLength,
          requestId: newId("request"),
          upgrade: false,
          req,
          res,
          expectContinue,
        },
        httpEntry,
      );
      return true;
    },
    upgrade(req, socket, head) {
      upgrade(req, socket, head);
    },
    active() {
      return { exchanges: env.active.size };
    },
    close() {
      sweeper.stop();
      pools.close();
    },
  };
}

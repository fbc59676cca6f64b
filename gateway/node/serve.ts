// Node entry of the gateway: one node:http server; agent traffic and WebSockets take the fast path, the rest the Hono app.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { getRequestListener } from "@hono/node-server";
import { getConnInfo } from "@hono/node-server/conninfo";
import type { Context, Hono } from "hono";
import { AppError } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import type { GatewayEnv } from "../../contracts/caller.ts";
import type { NodeProxy } from "./fast-path/handler.ts";
import { createRawFront, type RawFront } from "./fast-path/raw-front.ts";
import { sendError, sendErrorOnSocket } from "../../lib/node-respond.ts";
import { createConnPolicy, defaultClientLimits, headCheckIntervalMs, type BodyRule, type ClientLimits } from "../../lib/node-conn-policy.ts";
import { silentLogger, type Logger } from "../../lib/log.ts";
import { metricsApp, metricsPath, type MetricsEndpoint } from "../../lib/metrics-endpoint.ts";
import { agentTarget } from "../proxy/policy.ts";
import { agentFilesPath } from "../exec/paths.ts";
import { createExecTtyUpgrades, isExecTtyUpgrade } from "./exec-tty.ts";

export const nodeClientIp = (c: Context<GatewayEnv>): string | undefined => getConnInfo(c).remote.address;

export interface NodeServer {
  server: Server;
  port: number;
  /**
   * From now on every new call (request or upgrade) is answered `503 shutting_down` with `Retry-After` and
   * `Connection: close`, on a listener that stays open: clients are told to come back instead of being refused.
   */
  refuseNew(): void;
  /** Resolves when no call taken before `refuseNew` is in flight any more (WebSockets count until they close). */
  idle(): Promise<void>;
  /** Stops accepting connections and ends idle kept-alive ones; in-flight requests finish. */
  close(): Promise<void>;
}

/** What a draining server answers new calls with. */
const shuttingDown = () => new AppError("shutting_down", "the gateway is shutting down; retry shortly", { retryAfterS: 5 });

export interface ServeNodeOptions {
  port: number;
  hostname?: string;
  /** The fast path for agent traffic; without it every request goes through the Hono app (no WebSockets). */
  proxy?: NodeProxy;
  /**
   * Simple bodiless agent calls answered off the socket, without node:http (gateway/node/fast-path/raw-front.ts);
   * on by default where the proxy can take them. False: every request through node:http.
   */
  rawFront?: boolean;
  /** Largest request head a client may send, bytes; beyond it the answer is 431. */
  maxHeaderBytes?: number;
  /** Connection bounds, head and body deadlines; unset fields take `defaultClientLimits`. */
  clients?: Partial<ClientLimits>;
  /** `{agentId}.{domain}` hosts are agent traffic (their bodies are held to the agent rule without the fast path too). */
  domain?: string | undefined;
  /** Where refused connections and cut bodies are told (`info` lines). */
  log?: Logger;
  /**
   * `GET /metrics`, answered beside the app (not through its tenant auth or the proxy): the operator's scrape, off
   * (404) without a token. `domain`: an agent's own `/metrics` on `{agentId}.{domain}` stays the agent's.
   */
  metrics?: { endpoint: MetricsEndpoint; domain: string | undefined };
}

export function serveNode(app: Hono<GatewayEnv>, opts: ServeNodeOptions): Promise<NodeServer> {
  const hono = getRequestListener(app.fetch);
  // Exec on a terminal: the API's own WebSocket, through the app (gateway/exec/tty.ts).
  const execTty = createExecTtyUpgrades(app, opts.log ?? silentLogger);
  const proxy = opts.proxy;
  const metrics = opts.metrics ? getRequestListener(metricsApp(opts.metrics.endpoint).fetch) : undefined;
  const metricsDomain = opts.metrics?.domain?.toLowerCase();
  const isMetrics = (req: IncomingMessage) => {
    const url = req.url ?? "/";
    return (url === metricsPath || url.startsWith(`${metricsPath}?`)) && !agentTarget(url, req.headers.host, metricsDomain);
  };
  const clients = { ...defaultClientLimits, ...opts.clients };
  const log = opts.log ?? silentLogger;
  const policy = createConnPolicy(clients, log);
  const domain = opts.domain?.toLowerCase();
  // Agent traffic: the floor while the body is uploaded, no total deadline (a stream may be long); once the agent
  // answers, the exchange is a stream bounded by the proxy's idle timeout.
  const agentRule: BodyRule = { floorUntilAnswered: true };
  const apiRule: BodyRule = { totalMs: clients.bodyTimeoutMs };
  const webhookRule: BodyRule = { totalMs: clients.webhookBodyTimeoutMs };
  // Image uploads are up to IMAGE_MAX_UPLOAD_BYTES (GiBs): the floor only.
  const uploadRule: BodyRule = {};
  const ruleFor = (req: IncomingMessage): BodyRule => {
    const url = req.url ?? "/";
    if (agentTarget(url, req.headers.host, domain)) return agentRule; // (without the fast path: through the Hono app)
    if (url.startsWith("/hooks/")) return webhookRule;
    if (req.method === "POST" && (url === "/v1/images" || url.startsWith("/v1/images?"))) return uploadRule;
    // Files written into an agent (gateway/exec/: up to 4 GiB, a tar of a tree): the floor only too.
    if (req.method === "PUT" && agentFilesPath.test(url)) return uploadRule;
    return apiRule;
  };
  let refusing = false;
  let inFlight = 0;
  const onIdle: (() => void)[] = [];
  // One listener shared by every call (no closure per request); a response or socket emits 'close' once.
  const untrack = () => {
    if (--inFlight === 0) for (const fn of onIdle.splice(0)) fn();
  };
  const track = (closer: { on(event: "close", fn: () => void): unknown }) => {
    inFlight++;
    closer.on("close", untrack);
  };
  const refused = (req: IncomingMessage, res: ServerResponse): boolean => {
    if (!refusing) return false;
    sendError(res, shuttingDown(), newId("request"), { closeConnection: true });
    req.resume();
    return true;
  };
  /** Two `Host` headers name two targets (Node keeps the first): refused, so no layer routes by one and checks the other. */
  const ambiguous = (req: IncomingMessage, res: ServerResponse): boolean => {
    if (hostHeaders(req) <= 1) return false;
    sendError(res, new AppError("bad_request", "more than one Host header"), newId("request"), { closeConnection: true });
    req.resume();
    return true;
  };
  /** `*` (asterisk form) or any target that is neither a path nor an absolute URL names nothing we serve. */
  const unroutable = (req: IncomingMessage, res: ServerResponse): boolean => {
    const url = req.url ?? "";
    if (url.startsWith("/") || /^https?:\/\//i.test(url)) return false;
    sendError(res, new AppError("bad_request", "the request target must be a path"), newId("request"), { closeConnection: true });
    req.resume();
    return true;
  };
  const onRequest = (req: IncomingMessage, res: ServerResponse) => {
    if (refused(req, res) || ambiguous(req, res) || unroutable(req, res)) return;
    track(res);
    if (proxy?.handle(req, res, false)) return policy.watchBody(req, res, agentRule);
    policy.watchBody(req, res, ruleFor(req));
    if (metrics && isMetrics(req)) return void metrics(req, res);
    void hono(req, res);
  };
  const server = createServer(
    {
      maxHeaderSize: opts.maxHeaderBytes ?? 16_384,
      // No total request timeout: long streams are bounded by idle rules, bodies by the policy's progress floor.
      requestTimeout: 0,
      headersTimeout: clients.headTimeoutMs,
      connectionsCheckingInterval: headCheckIntervalMs(clients.headTimeoutMs),
      keepAliveTimeout: 5_000,
      noDelay: true,
    },
    onRequest,
  );
  // The raw front sees every admitted connection first and hands to Node's parser what it does not answer itself.
  let raw: RawFront | undefined;
  if (proxy?.takesRaw && opts.rawFront !== false) {
    const nodeListeners = server.listeners("connection") as ((this: Server, socket: Socket) => void)[];
    server.removeAllListeners("connection");
    const front = createRawFront({
      maxHeadBytes: opts.maxHeaderBytes ?? 16_384,
      headTimeoutMs: clients.headTimeoutMs,
      keepAliveTimeoutMs: server.keepAliveTimeout,
      take(req, res) {
        if (refusing || !proxy.handle(req, res, false)) return false;
        track(res);
        return true;
      },
      handOff(socket) {
        for (const listener of nodeListeners) listener.call(server, socket);
      },
      headTimedOut(socket) {
        const requestId = newId("request");
        log.info("request head too slow: connection closed", { requestId, clientIp: socket.remoteAddress, limitMs: clients.headTimeoutMs });
        sendErrorOnSocket(socket, new AppError("request_timeout", `the request head did not arrive within ${clients.headTimeoutMs} ms`), requestId);
      },
    });
    server.on("connection", (socket: Socket) => front.connection(socket));
    raw = front;
  }
  policy.attach(server);
  // `Expect: 100-continue`: agent traffic gets its 100 once the agent is awake and reachable; the rest at once.
  server.on("checkContinue", (req: IncomingMessage, res: ServerResponse) => {
    if (refused(req, res) || ambiguous(req, res) || unroutable(req, res)) return;
    track(res);
    if (proxy?.handle(req, res, true)) return policy.watchBody(req, res, agentRule);
    policy.watchBody(req, res, ruleFor(req));
    res.writeContinue();
    if (metrics && isMetrics(req)) return void metrics(req, res);
    void hono(req, res);
  });
  server.on("upgrade", (req: IncomingMessage, socket: Socket, head: Buffer) => {
    if (refusing) return sendErrorOnSocket(socket, shuttingDown(), newId("request"));
    if (hostHeaders(req) > 1) return sendErrorOnSocket(socket, new AppError("bad_request", "more than one Host header"), newId("request"));
    track(socket);
    if (isExecTtyUpgrade(req.url ?? "") && !agentTarget(req.url ?? "/", req.headers.host, domain)) return execTty.upgrade(req, socket, head);
    if (proxy) return proxy.upgrade(req, socket, head);
    sendErrorOnSocket(socket, new AppError("not_found", "this gateway relays no upgrades"), newId("request"));
  });
  // Requests Node's parser refuses never reach a handler: answer them with the same envelope.
  server.on("clientError", (err: Error & { code?: string }, socket: Socket) => {
    if (err.code === "ECONNRESET" || !socket.writable) return void socket.destroy();
    const requestId = newId("request");
    if (err.code === "ERR_HTTP_REQUEST_TIMEOUT") {
      log.info("request head too slow: connection closed", { requestId, clientIp: socket.remoteAddress, limitMs: clients.headTimeoutMs });
      return sendErrorOnSocket(socket, new AppError("request_timeout", `the request head did not arrive within ${clients.headTimeoutMs} ms`), requestId);
    }
    const appErr =
      err.code === "HPE_HEADER_OVERFLOW"
        ? new AppError("headers_too_large", `request headers exceed ${opts.maxHeaderBytes ?? 16_384} bytes`)
        : new AppError("bad_request", `malformed request (${err.code ?? "parse error"})`);
    sendErrorOnSocket(socket, appErr, requestId);
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port, opts.hostname ?? "0.0.0.0", () => {
      server.off("error", reject);
      const info = server.address() as AddressInfo;
      resolve({
        server,
        port: info.port,
        refuseNew() {
          // Kept-alive connections stay open too: their next request is answered (and the connection closed after it).
          refusing = true;
          execTty.goingAway();
        },
        idle: () => (inFlight === 0 ? Promise.resolve() : new Promise<void>((done) => onIdle.push(done))),
        close: () =>
          new Promise<void>((done) => {
            server.close(() => done());
            server.closeIdleConnections();
            raw?.closeIdle();
          }),
      });
    });
  });
}

/** How many `Host` headers the request carried (its raw headers: the parsed ones keep only the first). */
function hostHeaders(req: IncomingMessage): number {
  let n = 0;
  for (let i = 0; i < req.rawHeaders.length; i += 2) if (req.rawHeaders[i]!.toLowerCase() === "host") n++;
  return n;
}

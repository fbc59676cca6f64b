// One policy for every connection and every request body on a node:http server: connection bounds, head and body deadlines.
//
// - Connections: at most `maxConnectionsPerIp` open per client address and `maxConnections` in total; the one beyond
//   is answered `429 too_many_connections` / `503 server_busy` + `Retry-After` straight on the socket and closed: it
//   never reaches Node's HTTP parser, let alone the app. O(1) per connection (a counter and a map entry per address).
// - Heads: Node's own `headersTimeout`, checked every `headCheckIntervalMs(headTimeoutMs)` (not Node's 30 s), so a
//   head that has not arrived `headTimeoutMs` after the connection opened (or after the first byte of a kept-alive
//   connection's next request) is cut at most a twentieth of the deadline (≤ 0.5 s) late, plus timer jitter; the
//   server's `clientError` answers it 408.
// - Bodies (`watchBody`): while a body is being received it must bring `bodyMinBytes` per `bodyWindowMs` window,
//   and, when the rule has one, all of it within `totalMs` of its head. Windows where the server is the one not
//   reading (bytes wait in the request's buffer: backpressure from a slow handler or agent) or where the client
//   waits for `100 Continue` do not count against it. A stalled body is answered 408 when nothing was answered yet,
//   the connection is closed, and the handler's read of the body fails with that same 408 `AppError`.
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { AppError } from "./errors.ts";
import { newId } from "./ids.ts";
import type { Logger } from "./log.ts";
import { errorResponseText } from "./node-respond.ts";

export interface ConnPolicyConfig {
  /** A request head must be complete this long after its first byte (a new connection: after it opened), ms. */
  headTimeoutMs: number;
  /** The progress floor: a body being received brings at least this many bytes… */
  bodyMinBytes: number;
  /** …in every window of this length, ms. */
  bodyWindowMs: number;
  /** Open connections one client address may hold (WebSockets included); 0: no bound. */
  maxConnectionsPerIp: number;
  /** Open connections in total; 0: no bound. */
  maxConnections: number;
}

/** What every client of a Node server is held to: the policy, with the body deadlines per kind of route (the server picks the kind). */
export interface ClientLimits extends ConnPolicyConfig {
  /** A body of the control API (admin, billing's meter ingest, …) must arrive whole within this long of its head, ms. */
  bodyTimeoutMs: number;
  /** A webhook's body (`POST /hooks/…`, no credentials needed) must arrive whole within this long, ms. */
  webhookBodyTimeoutMs: number;
}

export const defaultClientLimits: ClientLimits = {
  headTimeoutMs: 10_000,
  bodyMinBytes: 1024,
  bodyWindowMs: 10_000,
  bodyTimeoutMs: 60_000,
  webhookBodyTimeoutMs: 10_000,
  maxConnectionsPerIp: 256,
  maxConnections: 10_000,
};

/** How one request's body is held to the policy (the caller knows the route; this module does not). */
export interface BodyRule {
  /** The whole body within this long of its head, ms; undefined: no total deadline (uploads, agent traffic). */
  totalMs?: number | undefined;
  /**
   * The progress floor holds only until the response starts (agent traffic: once the agent answers, the exchange is
   * a stream, bounded by the proxy's idle timeout instead); false: until the body's end.
   */
  floorUntilAnswered?: boolean;
}

export interface ConnPolicy {
  /** Gates `server`'s connections and sets its head deadline; call once, before it listens. */
  attach(server: Server): void;
  /** Holds the body of `req` (if it has one) to the progress floor and `rule`. */
  watchBody(req: IncomingMessage, res: ServerResponse, rule: BodyRule): void;
}

/** Seconds a client turned away for its own address's connections is told to wait. */
const perIpRetryAfterS = 1;
/** Seconds a client turned away because the server is full is told to wait. */
const busyRetryAfterS = 5;
/** A refused connection that does not close its side is destroyed after this long, ms. */
const refusedLingerMs = 1000;
/** At most one log line per this long about refused connections (a flood must not flood the log), ms. */
const refusedLogEveryMs = 1000;

/**
 * How often Node checks its head deadline: a twentieth of it, at least 10 ms, at most 500 ms (a pass over the
 * connections still receiving a head, in C++: cheap even with thousands open).
 */
export function headCheckIntervalMs(headTimeoutMs: number): number {
  return Math.max(10, Math.min(500, Math.floor(headTimeoutMs / 20)));
}

/** The address connections are counted under: IPv4 clients of a dual-stack listener count as their IPv4 address. */
function addressKey(socket: Socket): string {
  const a = socket.remoteAddress ?? "unknown";
  return a.startsWith("::ffff:") ? a.slice(7) : a;
}

const kWatch = Symbol("agentvm.bodyWatch");
type WatchedSocket = Socket & { [kWatch]?: BodyWatch | undefined };
type WatchedRequest = IncomingMessage & { [kWatch]?: BodyWatch | undefined };
/** Shared by every watched request (no closure per request): its body was read to the end. */
function onBodyEnd(this: WatchedRequest): void {
  const w = this[kWatch];
  if (w) w.stop();
}
type Sent100 = ServerResponse & { _sent100?: boolean };

interface BodyWatch {
  req: IncomingMessage;
  res: ServerResponse;
  rule: BodyRule;
  /** `socket.bytesRead` when the head was taken, and at the start of the current window. */
  startBytes: number;
  windowBytes: number;
  declared: number | undefined;
  window: NodeJS.Timeout;
  total: NodeJS.Timeout | undefined;
  stop(): void;
}

export function createConnPolicy(cfg: ConnPolicyConfig, log: Logger): ConnPolicy {
  let total = 0;
  const perIp = new Map<string, number>();
  let refusedUnlogged = 0;
  let lastRefusedLog = 0;

  function refuse(socket: Socket, err: AppError, key: string): void {
    refusedUnlogged++;
    const now = Date.now();
    if (now - lastRefusedLog >= refusedLogEveryMs) {
      log.info("connection refused", {
        code: err.code,
        clientIp: key,
        refused: refusedUnlogged,
        open: total,
        limit: err.code === "server_busy" ? cfg.maxConnections : cfg.maxConnectionsPerIp,
      });
      lastRefusedLog = now;
      refusedUnlogged = 0;
    }
    socket.on("error", () => socket.destroy());
    // Whatever the client sends is read and dropped: closing with unread bytes would reset the connection and
    // could lose the answer on the client's side.
    socket.resume();
    socket.end(errorResponseText(err, newId("request")));
    setTimeout(() => socket.destroy(), refusedLingerMs).unref();
  }

  function admit(socket: Socket): AppError | undefined {
    if (cfg.maxConnections > 0 && total >= cfg.maxConnections) {
      return new AppError("server_busy", `the server holds its ${cfg.maxConnections} connections; retry shortly`, { retryAfterS: busyRetryAfterS });
    }
    const key = addressKey(socket);
    const mine = perIp.get(key) ?? 0;
    if (cfg.maxConnectionsPerIp > 0 && mine >= cfg.maxConnectionsPerIp) {
      return new AppError(
        "too_many_connections",
        `this address holds ${cfg.maxConnectionsPerIp} open connections, the most it may; close some or retry shortly`,
        {
          retryAfterS: perIpRetryAfterS,
        },
      );
    }
    total++;
    perIp.set(key, mine + 1);
    socket.once("close", () => {
      total--;
      const left = (perIp.get(key) ?? 1) - 1;
      if (left <= 0) perIp.delete(key);
      else perIp.set(key, left);
      const w = (socket as WatchedSocket)[kWatch];
      if (w) unwatch(socket as WatchedSocket, w);
    });
    return undefined;
  }

  function unwatch(socket: WatchedSocket, w: BodyWatch): void {
    clearTimeout(w.window);
    if (w.total) clearTimeout(w.total);
    if (socket[kWatch] === w) socket[kWatch] = undefined;
    const req = w.req as WatchedRequest;
    if (req[kWatch] === w) {
      req[kWatch] = undefined;
      req.off("end", onBodyEnd);
    }
  }

  /** Cuts a body that broke the rules: 408 if nothing was answered, the connection closed, the handler's read failed. */
  function cut(socket: WatchedSocket, w: BodyWatch, err: AppError, fields: Record<string, unknown>): void {
    unwatch(socket, w);
    const requestId = newId("request");
    log.info("request body too slow: connection closed", {
      requestId,
      clientIp: addressKey(socket),
      method: w.req.method,
      path: (w.req.url ?? "/").split("?")[0],
      bodyBytes: socket.bytesRead - w.startBytes,
      reason: err.message,
      ...fields,
    });
    // Written on the socket, not through the response: the handler may still answer (its write then goes nowhere,
    // the response being destroyed with the socket, rather than failing on headers already sent).
    if (!w.res.headersSent && !socket.destroyed) socket.write(errorResponseText(err, requestId));
    socket.destroy();
    w.req.destroy(err);
  }

  function onWindow(socket: WatchedSocket, w: BodyWatch, settled = false): void {
    if (w.req.complete || socket.destroyed) return unwatch(socket, w);
    if (w.rule.floorUntilAnswered && w.res.headersSent) return unwatch(socket, w);
    const now = socket.bytesRead;
    const got = now - w.windowBytes;
    const waitingForContinue = w.req.headers.expect?.toLowerCase() === "100-continue" && !(w.res as Sent100)._sent100 && !w.res.headersSent;
    // Bytes wait in the request's buffer: the reader (handler, agent) is behind, not the client.
    const serverBehind = w.req.readableLength > 0;
    const left = w.declared === undefined ? cfg.bodyMinBytes : w.declared - (now - w.startBytes);
    const needed = Math.max(1, Math.min(cfg.bodyMinBytes, left));
    if (!waitingForContinue && !serverBehind && got < needed) {
      // A timer that fired late (the event loop was busy) runs before the bytes that arrived meanwhile are read:
      // judged again once they are (setImmediate runs after the poll phase), so a stall of ours is not the client's.
      if (!settled) return void setImmediate(onWindow, socket, w, true);
      return cut(
        socket,
        w,
        new AppError("request_timeout", `the request body brought ${got} bytes in ${cfg.bodyWindowMs} ms, below the ${cfg.bodyMinBytes}-byte floor`),
        {
          windowMs: cfg.bodyWindowMs,
          windowBytes: got,
        },
      );
    }
    w.windowBytes = now;
    w.window.refresh();
  }

  function onTotal(socket: WatchedSocket, w: BodyWatch, settled = false): void {
    if (w.req.complete || socket.destroyed) return unwatch(socket, w);
    if (!settled) return void setImmediate(onTotal, socket, w, true);
    const ms = w.rule.totalMs ?? 0;
    cut(socket, w, new AppError("request_timeout", `the request body did not arrive within ${ms} ms`), { limitMs: ms });
  }

  return {
    attach(server) {
      server.headersTimeout = cfg.headTimeoutMs;
      // Read when the server starts listening (Node's default is 30 s: heads would be cut up to 30 s late).
      // (a documented createServer option; @types/node lacks the property it is kept in).
      (server as Server & { connectionsCheckingInterval: number }).connectionsCheckingInterval = headCheckIntervalMs(cfg.headTimeoutMs);
      if (cfg.maxConnections <= 0 && cfg.maxConnectionsPerIp <= 0) return;
      // Node's own listener (its HTTP parser) sees only the connections admitted here.
      const nodeListeners = server.listeners("connection") as ((this: Server, socket: Socket) => void)[];
      server.removeAllListeners("connection");
      server.on("connection", (socket: Socket) => {
        const refused = admit(socket);
        if (refused) return refuse(socket, refused, addressKey(socket));
        for (const listener of nodeListeners) listener.call(server, socket);
      });
    },
    watchBody(req, res, rule) {
      if (req.complete) return;
      const cl = req.headers["content-length"];
      const chunked = req.headers["transfer-encoding"] !== undefined;
      if (!chunked && (cl === undefined || cl === "0")) return;
      const socket = req.socket as WatchedSocket;
      const previous = socket[kWatch];
      if (previous) unwatch(socket, previous);
      const w: BodyWatch = {
        req,
        res,
        rule,
        startBytes: socket.bytesRead,
        windowBytes: socket.bytesRead,
        declared: !chunked && cl !== undefined && /^\d+$/.test(cl) ? Number(cl) : undefined,
        window: setTimeout(() => onWindow(socket, w), cfg.bodyWindowMs),
        total: rule.totalMs === undefined ? undefined : setTimeout(() => onTotal(socket, w), rule.totalMs),
        stop: () => unwatch(socket, w),
      };
      w.window.unref();
      w.total?.unref();
      socket[kWatch] = w;
      (req as WatchedRequest)[kWatch] = w;
      // A body read to its end (by the handler, or dumped by Node after the answer) needs no timers any more.
      req.on("end", onBodyEnd);
    },
  };
}

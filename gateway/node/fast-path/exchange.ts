// One proxied HTTP exchange on the fast path: the client's request streamed to the agent, its response streamed back.
//
// Backpressure both ways (a slow reader pauses the other side's socket, so memory stays flat for bodies of any
// size); the agent hold is touched for every chunk either way and given back exactly once (`done`); a client that goes away
// closes the agent's connection at once; timeouts are checked by the owner's sweep, not a timer per request.
import type { ClientRequest, ClientResponse } from "./client-side.ts";
import { AppError, logFailure } from "../../../lib/errors.ts";
import type { Logger } from "../../../lib/log.ts";
import { serverTiming } from "../../../contracts/fleet.ts";
import { rollbackHeader } from "../../../contracts/agent.ts";
import type { AgentHold } from "../fleet.ts";
import type { EffectiveLimits } from "../../proxy/core.ts";
import { downstreamHeaderList } from "../../../lib/http-headers.ts";
import { ResponseParseError, ResponseParser, type ParserSink, type ResponseHead } from "./response-parser.ts";
import { UpstreamConnectError, type ConnOwner, type UpstreamConn, type UpstreamPool } from "./upstream-pool.ts";
import { sendError } from "../../../lib/node-respond.ts";
import type { ActiveList, Linked } from "./active-list.ts";

export interface ExchangeEnv {
  log: Logger;
  /** Exchanges in progress, for the timeout sweep. */
  active: ActiveList<HttpExchange>;
  maxResponseHeadBytes: number;
}

export interface ExchangeInit {
  req: ClientRequest;
  res: ClientResponse;
  requestId: string;
  agentId: string;
  ticket: AgentHold;
  pool: UpstreamPool;
  /** The request head for the agent, up to (not including) the body framing header and the blank line. */
  head: string;
  limits: EffectiveLimits;
  /** Called once when the exchange is over, however it ended: the hold is released, the tenant slot freed. */
  done: () => void;
  /** The client sent `Expect: 100-continue`: tell it to send the body once the agent is reachable. */
  expectContinue: boolean;
}

type Phase = "connecting" | "sending" | "waiting" | "streaming" | "done";

// Listeners shared by all exchanges (no closure per request): Node calls them with the emitter as `this`,
// which carries its exchange under this symbol.
const kExchange = Symbol("agentvm.exchange");
type Tagged<T> = T & { [kExchange]?: HttpExchange | undefined };
function onResClose(this: Tagged<ClientResponse>): void {
  this[kExchange]?.clientClosed();
}
function onResDrain(this: Tagged<ClientResponse>): void {
  this[kExchange]?.clientDrained();
}
function onReqData(this: Tagged<ClientRequest>, chunk: Buffer): void {
  this[kExchange]?.requestData(chunk);
}
function onReqEnd(this: Tagged<ClientRequest>): void {
  this[kExchange]?.requestEnded();
}

const idempotent = new Set(["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"]);

export class HttpExchange implements ConnOwner, ParserSink, Linked<HttpExchange> {
  prev: HttpExchange | undefined = undefined;
  next: HttpExchange | undefined = undefined;
  linked = false;
  phase: Phase = "connecting";
  /** performance.now() when bytes last moved either way. */
  lastByteAt: number;
  /** performance.now() when the request was completely sent (the response timeout counts from here). */
  sentAt = 0;
  private readonly i: ExchangeInit;
  private readonly env: ExchangeEnv;
  /** The connection's parser (one per connection, reused by its exchanges). */
  private parser!: ResponseParser;
  private conn: UpstreamConn | undefined;
  private bodyFraming: "none" | "length" | "chunked";
  private bodySent = false;
  private bytesIn = 0;
  private bytesOut = 0;
  private responseBytes = 0;
  private completed = false;
  private retried = false;
  private waitingDrain = false;
  /** The pool handed out a kept-alive connection (which the agent may have closed meanwhile). */
  private reusedConn = false;
  private hibernateHook: { ex: HttpExchange | undefined } | undefined;
  /** The hold's dozed ms at the last sweep: the timeouts' clocks move forward by what it grew (the VM dozed). */
  private dozedSeen = 0;

  constructor(init: ExchangeInit, env: ExchangeEnv) {
    this.i = init;
    this.env = env;
    this.lastByteAt = performance.now();
    const h = init.req.headers;
    this.bodyFraming = h["transfer-encoding"] !== undefined ? "chunked" : h["content-length"] !== undefined && h["content-length"] !== "0" ? "length" : "none";
  }

  start(): void {
    this.dozedSeen = this.i.ticket.dozedMs?.() ?? 0;
    this.env.active.add(this);
    const { req, res } = this.i;
    (res as Tagged<ClientResponse>)[kExchange] = this;
    (req as Tagged<ClientRequest>)[kExchange] = this;
    res.on("close", onResClose);
    this.connect(false);
  }

  private connect(fresh: boolean): void {
    const pool = this.i.pool;
    const idle = fresh ? undefined : pool.take(this);
    if (idle) return this.connected(idle);
    pool.open(this, (err, conn) => {
      if (this.phase === "done") {
        if (conn) pool.release(conn, !err);
        return;
      }
      if (err || !conn) return this.fail(this.connectError(err));
      this.connected(conn);
    });
  }

  private connected(conn: UpstreamConn): void {
    this.conn = conn;
    this.reusedConn = conn.uses > 0;
    this.parser = (conn.parser ??= new ResponseParser(this, { maxHeadBytes: this.env.maxResponseHeadBytes })) as ResponseParser;
    this.send();
  }

  private send(): void {
    const conn = this.conn!;
    const { req, head } = this.i;
    this.parser.start(req.method ?? "GET", this);
    // Header values are Node's latin1 view of the client's bytes: latin1 puts the same bytes back on the wire.
    if (this.bodyFraming === "none") {
      const cl = req.headers["content-length"];
      conn.socket.write(cl === "0" ? `${head}content-length: 0\r\n\r\n` : `${head}\r\n`, "latin1");
      this.requestSent();
      return;
    }
    conn.socket.write(
      `${head}${this.bodyFraming === "chunked" ? "transfer-encoding: chunked\r\n" : `content-length: ${req.headers["content-length"]}\r\n`}\r\n`,
      "latin1",
    );
    this.phase = "sending";
    req.on("data", onReqData);
    req.on("end", onReqEnd);
    if (this.i.expectContinue) this.i.res.writeContinue();
  }

  private requestSent(): void {
    this.bodySent = true;
    if (this.phase === "connecting" || this.phase === "sending") {
      this.phase = "waiting";
      this.sentAt = performance.now();
    }
  }

  requestData(chunk: Buffer): void {
    if (this.phase === "done" || !this.conn) return;
    this.bytesIn += chunk.length;
    if (this.bytesIn > this.i.limits.maxBodyBytes) {
      this.fail(new AppError("payload_too_large", `request body exceeds the limit of ${this.i.limits.maxBodyBytes} bytes`), true);
      return;
    }
    this.lastByteAt = performance.now();
    this.i.ticket.touch();
    const s = this.conn.socket;
    let ok: boolean;
    if (this.bodyFraming === "chunked") {
      // Every piece of the chunk must be written, whatever the first write answers.
      s.cork();
      s.write(`${chunk.length.toString(16)}\r\n`, "latin1");
      s.write(chunk);
      ok = s.write("\r\n", "latin1");
      s.uncork();
    } else ok = s.write(chunk);
    if (!ok) this.i.req.pause();
  }

  requestEnded(): void {
    if (this.phase === "done" || !this.conn) return;
    if (this.bodyFraming === "chunked") this.conn.socket.write("0\r\n\r\n", "latin1");
    this.requestSent();
  }

  onDrain(): void {
    if (this.phase === "sending") this.i.req.resume();
  }

  onData(chunk: Buffer): void {
    this.responseBytes += chunk.length;
    try {
      this.parser.execute(chunk);
    } catch (err) {
      return this.upstreamBroke(err);
    }
    if (this.completed) this.finish(this.parser.reusable && this.bodySent);
  }

  onClose(err: Error | undefined): void {
    this.conn = undefined;
    if (this.phase === "done") return;
    if (this.phase === "streaming") {
      try {
        this.parser.finish(); // a close-delimited body ends here
      } catch (e) {
        return this.upstreamBroke(e);
      }
      if (this.completed) this.finish(false);
      return;
    }
    // A kept-alive connection the agent closed just before our request: safe to send once more on a new one.
    if (!this.retried && this.responseBytes === 0 && this.bodyFraming === "none" && this.reusedConn && idempotent.has(this.i.req.method ?? "")) {
      this.retried = true;
      this.reusedConn = false;
      this.phase = "connecting";
      this.connect(true);
      return;
    }
    this.fail(new AppError("bad_gateway", `agent ${this.i.agentId} closed the connection before answering${err ? ` (${err.message})` : ""}`));
  }

  onHead(h: ResponseHead): void {
    const { res, ticket, requestId } = this.i;
    this.phase = "streaming";
    this.lastByteAt = performance.now();
    ticket.streaming();
    ticket.firstByte();
    // Through a hook cleared at the end: a ticket the host still holds must not keep a finished exchange
    // (and its request and response) reachable.
    const hook: { ex: HttpExchange | undefined } = { ex: this };
    this.hibernateHook = hook;
    ticket.onHibernate(() => hook.ex?.hibernated());
    const out = downstreamHeaderList(h.headers);
    out.push("x-request-id", requestId, "x-wake", ticket.wake.wake);
    if (ticket.wake.timings.rollbackMs) out.push(rollbackHeader, String(ticket.wake.timings.rollbackMs));
    if (ticket.wake.wake !== "warm") {
      const timing = serverTiming(ticket.wake.timings);
      if (timing) out.push("server-timing", timing);
    }
    if (res.destroyed) return;
    try {
      if (h.reason) res.writeHead(h.status, h.reason, out);
      else res.writeHead(h.status, out);
    } catch (err) {
      // Node refused what the agent sent (a reason phrase or header it will not write): the agent answered badly.
      this.phase = "waiting";
      throw new ResponseParseError(err instanceof Error ? err.message : String(err));
    }
  }

  onBody(chunk: Buffer): void {
    this.lastByteAt = performance.now();
    this.i.ticket.touch();
    this.bytesOut += chunk.length;
    const res = this.i.res;
    if (res.destroyed) return;
    // The last piece of a sized body goes out with end(): one write instead of two.
    if (this.parser.complete) {
      res.end(chunk);
      return;
    }
    if (!res.write(chunk) && !this.waitingDrain && this.conn) {
      this.waitingDrain = true;
      this.conn.socket.pause();
      res.once("drain", onResDrain);
    }
  }

  onEnd(): void {
    this.completed = true;
    if (!this.i.res.writableEnded) this.i.res.end();
  }

  clientDrained(): void {
    this.waitingDrain = false;
    this.conn?.socket.resume();
  }

  clientClosed(): void {
    if (this.phase === "done") return;
    // The client went away before the end: the agent must see it at once (its socket closes).
    this.env.log.info("client went away", {
      requestId: this.i.requestId,
      agentId: this.i.agentId,
      phase: this.phase,
      bytesIn: this.bytesIn,
      bytesOut: this.bytesOut,
    });
    this.finish(false);
  }

  private hibernated(): void {
    if (this.phase === "done") return;
    this.env.log.info("stream ended: agent hibernating", { requestId: this.i.requestId, agentId: this.i.agentId, bytesOut: this.bytesOut });
    this.i.res.destroy();
    this.finish(false);
  }

  /**
   * Checked by the owner's sweep: the response timeout while waiting, the idle timeout while bytes should move. Time
   * the agent's VM dozed (every call it had open waited on an outbound call) counts towards neither: both start points
   * move forward by it, read here once per sweep and not per request.
   */
  sweep(now: number): void {
    const dozed = this.i.ticket.dozedMs?.();
    if (dozed !== undefined && dozed !== this.dozedSeen) {
      this.sentAt += dozed - this.dozedSeen;
      this.lastByteAt += dozed - this.dozedSeen;
      this.dozedSeen = dozed;
    }
    if (this.phase === "waiting") {
      const waited = now - this.sentAt;
      if (waited > this.i.limits.responseTimeoutMs) {
        this.fail(new AppError("gateway_timeout", `agent ${this.i.agentId} sent no response within ${this.i.limits.responseTimeoutMs} ms`));
      }
      return;
    }
    if ((this.phase === "sending" || this.phase === "streaming") && now - this.lastByteAt > this.i.limits.proxyIdleTimeoutMs) {
      this.env.log.warn("stream idle timeout: ended", {
        requestId: this.i.requestId,
        agentId: this.i.agentId,
        phase: this.phase,
        idleMs: Math.round(now - this.lastByteAt),
        limitMs: this.i.limits.proxyIdleTimeoutMs,
        bytesIn: this.bytesIn,
        bytesOut: this.bytesOut,
      });
      this.i.res.destroy();
      this.finish(false);
    }
  }

  private upstreamBroke(err: unknown): void {
    const message = err instanceof ResponseParseError ? `answered badly: ${err.message}` : `failed: ${err instanceof Error ? err.message : String(err)}`;
    if (this.phase === "streaming") {
      this.env.log.warn("agent response cut short", { requestId: this.i.requestId, agentId: this.i.agentId, err: message, bytesOut: this.bytesOut });
      this.i.res.destroy();
      this.finish(false);
      return;
    }
    this.fail(new AppError("bad_gateway", `agent ${this.i.agentId} ${message}`, { cause: err }));
  }

  private connectError(err: Error | undefined): AppError {
    if (err instanceof UpstreamConnectError && err.timedOut)
      return new AppError("gateway_timeout", `agent ${this.i.agentId} did not accept the connection in time`, { cause: err });
    return new AppError("bad_gateway", `agent ${this.i.agentId} could not be reached: ${err?.message ?? "no connection"}`, { cause: err });
  }

  /** Ends the exchange with an error: the envelope when nothing was sent yet, else a cut connection. */
  private fail(err: AppError, closeClient = false): void {
    if (this.phase === "done") return;
    const { res, req, requestId, agentId } = this.i;
    logFailure(this.env.log, err, { requestId, method: req.method ?? "", path: req.url ?? "", agentId });
    this.finish(false);
    sendError(res, err, requestId, { closeConnection: closeClient || (this.bodyFraming !== "none" && !req.complete) });
  }

  /** The one way out: stop pumping, give back or close the agent's connection, end the hold and the tenant slot (`done`). */
  private finish(reusable: boolean): void {
    if (this.phase === "done") return;
    this.phase = "done";
    this.env.active.delete(this);
    const { req, res } = this.i;
    if (this.bodyFraming !== "none") {
      req.off("data", onReqData);
      req.off("end", onReqEnd);
    }
    res.off("close", onResClose);
    if (this.waitingDrain) res.off("drain", onResDrain);
    (res as Tagged<ClientResponse>)[kExchange] = undefined;
    (req as Tagged<ClientRequest>)[kExchange] = undefined;
    const conn = this.conn;
    this.conn = undefined;
    this.parser?.detach();
    if (this.hibernateHook) this.hibernateHook.ex = undefined;
    if (conn) {
      if (this.waitingDrain) conn.socket.resume();
      this.i.pool.release(conn, reusable);
    }
    this.i.done();
  }
}

// The raw front: simple bodiless requests to agents answered straight off the socket, everything else left to node:http.
//
// Node's HTTP server (llhttp, IncomingMessage, ServerResponse) costs about as much CPU per request as nginx's whole
// proxy path. Most agent traffic is a kept-alive GET whose head arrives in one read: for those the front reads the
// head (simple-request.ts), hands the call to the fast path with a small request and response of its own, and writes
// the response head and body itself. The first read that is anything else — a body, a split head, pipelining, an
// upgrade, the control API, a request the fast path does not take — hands the connection, with its unread bytes, to
// Node's own parser for good (so Node's rules and error answers apply to it exactly as before).
//
// Per connection: one call at a time (bytes that arrive meanwhile wait); a silent new connection is answered 408
// after the head timeout, an idle kept-alive one closed after the keep-alive timeout, as Node does.
import { EventEmitter } from "node:events";
import { STATUS_CODES } from "node:http";
import type { Socket } from "node:net";
import type { ClientRequest, ClientResponse } from "./client-side.ts";
import { simpleRequest, type SimpleRequest } from "./simple-request.ts";
import { lazySweeper } from "../../../lib/node-sweeper.ts";

export interface RawFrontOptions {
  /** Largest request head taken here, bytes (larger ones go to Node, which answers 431 past its own limit). */
  maxHeadBytes: number;
  /** A new connection that sends nothing for this long is answered `headTimedOut`, ms. */
  headTimeoutMs: number;
  /** A kept-alive connection idle for this long is closed, ms. */
  keepAliveTimeoutMs: number;
  /** Takes the call (answers true) or leaves it, untouched, to Node. */
  take(req: ClientRequest, res: ClientResponse): boolean;
  /** Node's own handling of a connection (its HTTP parser), for a connection the front leaves. */
  handOff(socket: Socket): void;
  /** A new connection sent no request within the head timeout: answer it and close it. */
  headTimedOut(socket: Socket): void;
}

export interface RawFront {
  /** A new client connection (admitted by the connection policy). */
  connection(socket: Socket): void;
  /** Closes idle kept-alive connections; busy ones close after their response (the server stops). */
  closeIdle(): void;
}

const kConn = Symbol("agentvm.rawConn");
type TaggedSocket = Socket & { [kConn]?: RawConn };

/** One connection the front holds. */
class RawConn {
  readonly socket: Socket;
  readonly front: FrontState;
  res: RawResponse | undefined = undefined;
  /** Responses written on this connection. */
  served = 0;
  /** Bytes that arrived during a call (a pipelined request): looked at once the call is over. */
  pending: Buffer | undefined = undefined;
  /** The client half-closed or asked for `Connection: close`, or the server stops: end after the current response. */
  closing = false;
  /** performance.now() when the connection last became idle (opened, or a response ended): the sweep's timeouts count from here. */
  idleSince = performance.now();

  constructor(socket: Socket, front: FrontState) {
    this.socket = socket;
    this.front = front;
  }
}

interface FrontState {
  opts: RawFrontOptions;
  /** The `keep-alive` response header's value, as Node writes it. */
  keepAliveHeader: string;
  conns: Set<RawConn>;
  stopping: boolean;
}

// Listeners shared by every connection (`this` is the socket).
function onData(this: TaggedSocket, chunk: Buffer): void {
  const conn = this[kConn];
  if (!conn) return;
  if (conn.closing) return; // the connection ends after the response in progress
  if (conn.res) {
    // A request while one is answered: kept (and reading paused) until the answer is out.
    conn.pending = conn.pending ? Buffer.concat([conn.pending, chunk]) : chunk;
    this.pause();
    return;
  }
  dispatch(conn, chunk);
}

/** The client half-closed: as Node's server does (no half-open HTTP), the call in progress is over and the connection ends. */
function onEnd(this: TaggedSocket): void {
  const conn = this[kConn];
  if (!conn) return;
  conn.closing = true;
  if (conn.res)
    this.end(); // closes once flushed: the response sees 'close' there
  else this.destroy();
}

function onDrain(this: TaggedSocket): void {
  this[kConn]?.res?.emit("drain");
}

function onClose(this: TaggedSocket): void {
  const conn = this[kConn];
  if (!conn) return;
  conn.front.conns.delete(conn);
  const res = conn.res;
  conn.res = undefined;
  res?.socketClosed();
}

function onError(): void {
  // 'close' follows; the call in progress sees it there.
}

function detach(socket: TaggedSocket): void {
  socket.off("data", onData);
  socket.off("end", onEnd);
  socket.off("drain", onDrain);
  socket.off("close", onClose);
  socket.off("error", onError);
  socket[kConn] = undefined;
}

function dispatch(conn: RawConn, chunk: Buffer): void {
  const { opts } = conn.front;
  const head = conn.front.stopping ? undefined : simpleRequest(chunk, opts.maxHeadBytes);
  if (head) {
    const req = new RawRequest(head, conn.socket);
    const res = new RawResponse(conn, head.method === "HEAD", head.close);
    conn.res = res;
    let taken: boolean;
    try {
      taken = opts.take(req, res);
    } catch {
      // A bug on the way in must not take the process down from a socket's event: this connection ends instead.
      conn.socket.destroy();
      return;
    }
    if (taken) return;
    conn.res = undefined;
  }
  handOff(conn, chunk);
}

/** The connection goes to Node's parser for good, the unread bytes first. */
function handOff(conn: RawConn, chunk: Buffer | undefined): void {
  const socket = conn.socket as TaggedSocket;
  conn.front.conns.delete(conn);
  detach(socket);
  socket.pause();
  if (chunk) socket.unshift(chunk);
  conn.front.opts.handOff(socket);
  socket.resume();
}

/** After a response: its 'close', then the next request if one is waiting (out of the writer's call stack). */
function afterResponse(conn: RawConn, res: RawResponse): void {
  res.emit("close");
  const socket = conn.socket;
  if (socket.destroyed || conn.res || conn.closing) return;
  const pending = conn.pending;
  if (!pending) return;
  conn.pending = undefined;
  socket.resume();
  dispatch(conn, pending);
}

function responseEnded(conn: RawConn, res: RawResponse): void {
  conn.res = undefined;
  conn.served++;
  conn.idleSince = performance.now();
  const socket = conn.socket;
  if (res.closeAfter || conn.closing || conn.front.stopping) {
    conn.closing = true;
    socket.destroySoon(); // ends our side once the response is written, then closes
  }
  process.nextTick(afterResponse, conn, res);
}

/**
 * Idle connections past their limit: a new one that sent nothing within the head timeout is answered `headTimedOut`,
 * a kept-alive one is closed after the keep-alive timeout. One sweep instead of a timer per socket (which every read
 * and write would refresh); a call in progress has its own timeouts. Answers whether any connection is left to watch.
 */
function sweep(front: FrontState, now: number): boolean {
  const { headTimeoutMs, keepAliveTimeoutMs } = front.opts;
  for (const conn of front.conns) {
    if (conn.res || conn.closing) continue;
    const idle = now - conn.idleSince;
    if (conn.served === 0) {
      if (idle >= headTimeoutMs) {
        front.conns.delete(conn);
        conn.closing = true;
        front.opts.headTimedOut(conn.socket);
      }
    } else if (idle >= keepAliveTimeoutMs) conn.socket.destroy();
  }
  return front.conns.size > 0;
}

export function createRawFront(opts: RawFrontOptions): RawFront {
  const front: FrontState = { opts, keepAliveHeader: `timeout=${Math.floor(opts.keepAliveTimeoutMs / 1000)}`, conns: new Set(), stopping: false };
  // As often as Node checks its head deadline (a twentieth of the shorter limit, 10–500 ms).
  const sweepMs = Math.max(10, Math.min(500, Math.floor(Math.min(opts.headTimeoutMs, opts.keepAliveTimeoutMs) / 20)));
  const sweeper = lazySweeper(sweepMs, (now) => sweep(front, now));
  return {
    connection(socket) {
      const conn = new RawConn(socket, front);
      (socket as TaggedSocket)[kConn] = conn;
      front.conns.add(conn);
      sweeper.wake();
      socket.on("data", onData);
      socket.on("end", onEnd);
      socket.on("drain", onDrain);
      socket.on("close", onClose);
      socket.on("error", onError);
    },
    closeIdle() {
      sweeper.stop();
      front.stopping = true;
      for (const conn of front.conns) if (!conn.res) conn.socket.destroy();
    },
  };
}

/** A simple request as the fast path reads it: the head only, no body. */
class RawRequest implements ClientRequest {
  readonly method: string;
  readonly url: string;
  readonly headers: Record<string, string>;
  readonly rawHeaders: string[];
  readonly socket: Socket;
  readonly complete = true;

  constructor(head: SimpleRequest, socket: Socket) {
    this.method = head.method;
    this.url = head.url;
    this.headers = head.headers;
    this.rawHeaders = head.rawHeaders;
    this.socket = socket;
  }

  on(): this {
    return this; // no body: no events
  }
  off(): this {
    return this;
  }
  pause(): this {
    return this;
  }
  resume(): this {
    return this;
  }
}

// The `Date` header, once per second (as Node does).
let dateSecond = -1;
let dateValue = "";
function httpDate(): string {
  const s = Math.floor(Date.now() / 1000);
  if (s !== dateSecond) {
    dateSecond = s;
    dateValue = new Date(s * 1000).toUTCString();
  }
  return dateValue;
}

const badReasonRe = /[^\t\x20-\x7e\x80-\xff]/;
const chunkEnd = Buffer.from("\r\n", "latin1");
const lastChunk = Buffer.from("0\r\n\r\n", "latin1");
/** Bodies up to this size go out in one buffer with the head (one write, no writev). */
const coalesceBytes = 16_384;

/** A response written straight to the socket: head and framing as Node's ServerResponse writes them for HTTP/1.1. */
class RawResponse extends EventEmitter implements ClientResponse {
  statusCode = 200;
  headersSent = false;
  writableEnded = false;
  /** The connection ends after this response (the client asked, or an answer said `connection: close`). */
  closeAfter: boolean;
  private readonly conn: RawConn;
  private readonly headRequest: boolean;
  private noBody = false;
  private chunked = false;
  private head: string | undefined = undefined;
  private gone = false;

  constructor(conn: RawConn, headRequest: boolean, closeAfter: boolean) {
    super();
    this.conn = conn;
    this.headRequest = headRequest;
    this.closeAfter = closeAfter;
  }

  get socket(): Socket {
    return this.conn.socket;
  }

  get destroyed(): boolean {
    return this.gone || this.conn.socket.destroyed;
  }

  setHeader(name: string, value: string): this {
    // The one header set before writeHead on this path: `connection: close`.
    if (name.toLowerCase() === "connection" && value.toLowerCase() === "close") this.closeAfter = true;
    return this;
  }

  writeContinue(): void {
    throw new Error("a raw request never expects 100-continue");
  }

  writeHead(status: number, reasonOrHeaders: string | string[], maybeHeaders?: string[]): this {
    if (this.headersSent) throw new Error("headers already sent");
    const reason = typeof reasonOrHeaders === "string" ? reasonOrHeaders : (STATUS_CODES[status] ?? "unknown");
    const headers = typeof reasonOrHeaders === "string" ? (maybeHeaders ?? []) : reasonOrHeaders;
    if (status < 100 || status > 999 || !Number.isInteger(status)) throw new RangeError(`invalid status code ${status}`);
    if (badReasonRe.test(reason)) throw new TypeError("invalid character in the reason phrase");
    let text = `HTTP/1.1 ${status} ${reason}\r\n`;
    let length = false;
    let chunked = false;
    let date = false;
    let connection = false;
    for (let i = 0; i < headers.length; i += 2) {
      const name = headers[i]!;
      const value = headers[i + 1]!;
      // Only these names matter here; compare lengths before lower-casing.
      const len = name.length;
      if (len === 14 || len === 17 || len === 10 || len === 4) {
        const k = name.toLowerCase();
        if (k === "content-length") length = true;
        else if (k === "transfer-encoding") chunked = true;
        else if (k === "connection") {
          connection = true;
          if (/\bclose\b/i.test(value)) this.closeAfter = true;
        } else if (k === "date") date = true;
      }
      text += `${name}: ${value}\r\n`;
    }
    this.noBody = this.headRequest || status === 204 || status === 304 || status < 200;
    if (!this.noBody && !length && !chunked) {
      text += "transfer-encoding: chunked\r\n";
      chunked = true;
    }
    this.chunked = chunked && !this.noBody;
    if (!date) text += `date: ${httpDate()}\r\n`;
    if (!connection) text += this.closeAfter ? "connection: close\r\n" : `connection: keep-alive\r\nkeep-alive: ${this.conn.front.keepAliveHeader}\r\n`;
    this.head = `${text}\r\n`;
    this.statusCode = status;
    this.headersSent = true;
    return this;
  }

  write(chunk: Buffer | string): boolean {
    if (this.writableEnded) return false;
    if (!this.headersSent) this.writeHead(this.statusCode, []);
    const body = typeof chunk === "string" ? Buffer.from(chunk) : chunk;
    return this.send(this.noBody || body.length === 0 ? undefined : body, false);
  }

  end(chunk?: Buffer | string): this {
    if (this.writableEnded) return this;
    if (!this.headersSent) this.writeHead(this.statusCode, []);
    const body = chunk === undefined ? undefined : typeof chunk === "string" ? Buffer.from(chunk) : chunk;
    this.writableEnded = true;
    this.send(this.noBody || !body || body.length === 0 ? undefined : body, true);
    if (!this.gone) responseEnded(this.conn, this);
    return this;
  }

  destroy(): this {
    this.conn.socket.destroy();
    return this;
  }

  /** The connection closed: the response ends here (a 'close' for whoever waits on it). */
  socketClosed(): void {
    if (this.gone) return;
    this.gone = true;
    if (!this.writableEnded) this.emit("close");
  }

  /** Puts the head (if not out yet), a piece of body (framed) and, at the end, the last chunk on the socket. */
  private send(body: Buffer | undefined, last: boolean): boolean {
    const socket = this.conn.socket;
    if (this.gone || !socket.writable) return false;
    const head = this.head;
    this.head = undefined;
    const tail = last && this.chunked;
    if (!this.chunked) {
      if (head === undefined) return body ? socket.write(body) : true;
      if (!body) return socket.write(head, "latin1");
      if (body.length <= coalesceBytes) {
        const headBytes = Buffer.byteLength(head, "latin1");
        const out = Buffer.allocUnsafe(headBytes + body.length);
        out.write(head, 0, "latin1");
        body.copy(out, headBytes);
        return socket.write(out);
      }
      socket.cork();
      socket.write(head, "latin1");
      const ok = socket.write(body);
      socket.uncork();
      return ok;
    }
    // chunked: [head] [size CRLF body CRLF] [0 CRLF CRLF]
    socket.cork();
    if (head !== undefined) socket.write(head, "latin1");
    let ok = true;
    if (body) {
      socket.write(`${body.length.toString(16)}\r\n`, "latin1");
      socket.write(body);
      ok = socket.write(chunkEnd);
    }
    if (tail) ok = socket.write(lastChunk);
    socket.uncork();
    return ok;
  }
}

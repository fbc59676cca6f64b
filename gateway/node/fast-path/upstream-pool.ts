// Kept-alive TCP connections to one agent endpoint for the fast path: LIFO reuse, bounded idle time, one owner at a time.
import { connect, type Socket } from "node:net";
import { connectOptions, type PortEndpoint } from "../../../lib/node-net.ts";

/** Whoever uses a connection for one exchange: its events go there, and nowhere else. */
export interface ConnOwner {
  onData(chunk: Buffer): void;
  /** The connection closed (or failed) while owned. */
  onClose(err: Error | undefined): void;
  onDrain(): void;
}

export class UpstreamConnectError extends Error {
  readonly timedOut: boolean;
  constructor(message: string, timedOut: boolean, cause?: unknown) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = "UpstreamConnectError";
    this.timedOut = timedOut;
  }
}

export interface UpstreamPoolOptions {
  connectTimeoutMs: number;
  /** Idle connections are closed after this long: below the agents' keep-alive timeout (Node's default is 5 s). */
  idleTimeoutMs: number;
  /** Idle connections kept at most. */
  maxIdle: number;
}

export class UpstreamConn {
  readonly socket: Socket;
  owner: ConnOwner | undefined;
  /** Exchanges this connection carried before the current one (0 = fresh). */
  uses = 0;
  idleSince = 0;
  closed = false;
  /** The response parser of this connection, kept across its exchanges. */
  parser: unknown;
  private error: Error | undefined;

  constructor(socket: Socket, onGone: (c: UpstreamConn) => void) {
    this.socket = socket;
    socket.on("data", (chunk: Buffer) => {
      if (this.owner) this.owner.onData(chunk);
      else socket.destroy(); // unsolicited bytes on an idle connection: it cannot be trusted again
    });
    socket.on("drain", () => this.owner?.onDrain());
    socket.on("error", (err) => {
      this.error = err;
    });
    socket.on("close", () => {
      this.closed = true;
      onGone(this);
      const owner = this.owner;
      this.owner = undefined;
      owner?.onClose(this.error);
    });
  }
}

export class UpstreamPool {
  /** TCP, or a unix socket (a QEMU's port relayed out of its network namespace). */
  readonly endpoint: PortEndpoint;
  private readonly opts: UpstreamPoolOptions;
  private idle: UpstreamConn[] = [];
  private readonly all = new Set<UpstreamConn>();
  private closed = false;

  constructor(endpoint: PortEndpoint, opts: UpstreamPoolOptions) {
    this.endpoint = endpoint;
    this.opts = opts;
  }

  get size(): number {
    return this.all.size;
  }

  /** The most recently used idle connection, now owned by `owner`; undefined when there is none. */
  take(owner: ConnOwner): UpstreamConn | undefined {
    if (this.closed) return undefined;
    for (let c = this.idle.pop(); c; c = this.idle.pop()) {
      if (c.closed || c.socket.destroyed) continue;
      c.owner = owner;
      c.uses++;
      return c;
    }
    return undefined;
  }

  /** A new connection owned by `owner`, or the reason there is none (refused, timed out). */
  open(owner: ConnOwner, cb: (err: Error | undefined, conn: UpstreamConn | undefined) => void): void {
    if (this.closed) return cb(new UpstreamConnectError("the agent's connection pool is closed", false), undefined);
    const socket = connect({ ...connectOptions(this.endpoint), noDelay: true });
    let settled = false;
    const timer = setTimeout(() => {
      if (settled) return;
      settled = true;
      socket.destroy();
      cb(new UpstreamConnectError(`no connection to the agent within ${this.opts.connectTimeoutMs} ms`, true), undefined);
    }, this.opts.connectTimeoutMs);
    const failed = (err: Error) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      cb(new UpstreamConnectError(`cannot connect to the agent: ${err.message}`, false, err), undefined);
    };
    socket.once("error", failed);
    socket.once("connect", () => {
      socket.off("error", failed);
      if (settled) return socket.destroy();
      settled = true;
      clearTimeout(timer);
      const conn = new UpstreamConn(socket, (gone) => this.forget(gone));
      this.all.add(conn);
      conn.owner = owner;
      cb(undefined, conn);
    });
  }

  /** Gives a connection back after an exchange: kept when the exchange left it clean, else closed. */
  release(conn: UpstreamConn, reusable: boolean): void {
    conn.owner = undefined;
    if (!reusable || this.closed || conn.closed || this.idle.length >= this.opts.maxIdle) {
      conn.socket.destroy();
      return;
    }
    conn.idleSince = performance.now();
    this.idle.push(conn);
  }

  /** Closes connections idle for longer than the idle timeout. */
  sweep(now: number): void {
    if (this.idle.length === 0) return;
    const keep: UpstreamConn[] = [];
    for (const c of this.idle) {
      if (now - c.idleSince > this.opts.idleTimeoutMs) c.socket.destroy();
      else keep.push(c);
    }
    this.idle = keep;
  }

  /** Closes every connection, owned or not (a VM run ended, or the gateway stops). */
  close(): void {
    this.closed = true;
    for (const c of this.all) c.socket.destroy();
    this.idle = [];
  }

  private forget(c: UpstreamConn): void {
    this.all.delete(c);
    const i = this.idle.indexOf(c);
    if (i >= 0) this.idle.splice(i, 1);
  }
}

// The host's egress proxy: one HTTP proxy listener per VM on a unix socket (QEMU's guestfwd relay connects to it,
// drivers/qemu/args.ts), answering `CONNECT host:port` (a tunnel, for TLS and any TCP) and absolute-form plain HTTP
// (`GET http://host/path`) for VMs that may reach out, and for every VM, egress or not, its tenant's upstreams at
// `/u/<name>/…` (upstreams.ts). It resolves the destination itself, asks policy.ts about
// every address, and connects only to an address it checked (a name resolved again later could point elsewhere: DNS
// rebinding); a destination with no allowed address is refused with 403 and the error envelope.
import { lookup } from "node:dns/promises";
import { rmSync } from "node:fs";
import { createServer, request as httpRequest, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { connect, isIP, type Socket } from "node:net";
import { networkInterfaces } from "node:os";
import type { Duplex } from "node:stream";
import { AppError } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import { silentLogger, type Logger } from "../../lib/log.ts";
import { sendError, sendErrorOnSocket } from "../../lib/node-respond.ts";
import type { EgressConfig } from "./config.ts";
import { noExchangeObserver, type ExchangeObserver } from "./exchanges.ts";
import { decide } from "./policy.ts";
import { UpstreamSlot, upstreamTarget, type UpstreamPath } from "./upstreams.ts";
import { EGRESS_PROXY_GUEST_IP, EGRESS_PROXY_GUEST_PORT, hopByHopHeaders, upstreamsGuestUrl } from "../../lib/upstreams.ts";

export interface ResolvedAddress {
  address: string;
  family: number;
}

export interface EgressProxyDeps {
  log?: Logger;
  /** Name → addresses (default: the system resolver, every address). */
  resolve?: (host: string) => Promise<ResolvedAddress[]>;
  /** The host's own addresses, asked at every decision (default: every interface's). */
  hostAddresses?: () => string[];
  /** Told what each exchange of a VM is doing (waiting on its answer, answering, over): the host's doze. Default: nobody. */
  exchanges?: ExchangeObserver;
  /** Calls to `/u/<name>/…` (upstreams.ts); default: answered 503 until a path is bound to the slot. */
  upstreams?: UpstreamPath;
}

/** Where a connection of a VM may go: the checked address to connect to, or why not. */
type Destination = { ok: true; address: string; port: number; host: string } | { ok: false; error: AppError };

interface VmListener {
  server: Server;
  path: string;
  /** The VM's connections to the proxy (each one relayed guest connection); what each carries ends with it. */
  open: Set<Duplex>;
  /** The VM may reach out (`allowEgress`); without, only its tenant's upstreams answer. */
  egress: boolean;
}

export class EgressProxy {
  private readonly config: EgressConfig;
  private readonly log: Logger;
  private readonly resolve: (host: string) => Promise<ResolvedAddress[]>;
  private readonly hostAddresses: () => string[];
  private readonly exchanges: ExchangeObserver;
  private readonly listeners = new Map<string, VmListener>();
  /** The upstream path (`/u/<name>/…`); the names a booting VM's environment gets are asked of it too. */
  readonly upstreams: UpstreamPath;

  constructor(config: EgressConfig, deps: EgressProxyDeps = {}) {
    this.config = config;
    this.log = (deps.log ?? silentLogger).child({ component: "egress" });
    this.resolve = deps.resolve ?? ((host) => lookup(host, { all: true, verbatim: true }));
    this.hostAddresses = deps.hostAddresses ?? interfaceAddresses;
    this.exchanges = deps.exchanges ?? noExchangeObserver;
    this.upstreams = deps.upstreams ?? new UpstreamSlot();
  }

  /**
   * Listens for `vmId` on the unix socket `path` (a stale file there is replaced); a second call for the VM keeps the
   * first listener. `egress: false`: the VM reaches only its tenant's upstreams (CONNECT and absolute-form are 403).
   */
  async listen(vmId: string, path: string, opts: { egress?: boolean } = {}): Promise<void> {
    if (this.listeners.has(vmId)) return;
    rmSync(path, { force: true });
    const entry: VmListener = { server: createServer(), path, open: new Set(), egress: opts.egress ?? true };
    const { server } = entry;
    server.on("connection", (socket: Socket) => {
      if (entry.open.size >= this.config.maxConnectionsPerVm) {
        this.log.warn("egress connection refused: too many open", { vmId, open: entry.open.size });
        sendErrorOnSocket(
          socket,
          new AppError("too_many_connections", `this agent holds ${entry.open.size} egress connections, the most it may`, { retryAfterS: 1 }),
          newId("request"),
        );
        return;
      }
      this.track(entry, socket);
      socket.setTimeout(this.config.idleTimeoutMs, () => socket.destroy());
    });
    server.on("connect", (req: IncomingMessage, socket: Duplex, head: Buffer) => {
      if (entry.egress) return void this.tunnel(vmId, req, socket, head);
      this.log.info("egress refused: the agent has no egress", { vmId, target: req.url?.slice(0, 200) });
      sendErrorOnSocket(socket, noEgress(), newId("request"));
    });
    server.on("request", (req: IncomingMessage, res: ServerResponse) => void this.dispatch(vmId, entry, req, res));
    server.on("clientError", (_err, socket: Duplex) => socket.destroy());
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(path, () => {
        server.off("error", reject);
        resolve();
      });
    });
    this.listeners.set(vmId, entry);
  }

  /** Stops listening for `vmId` and cuts its open connections (its VM stopped, hibernated or was destroyed). */
  async release(vmId: string): Promise<void> {
    const entry = this.listeners.get(vmId);
    if (!entry) return;
    this.listeners.delete(vmId);
    for (const s of entry.open) s.destroy();
    await new Promise<void>((resolve) => entry.server.close(() => resolve()));
    rmSync(entry.path, { force: true });
  }

  /** Open connections (from the VM, through its relay) of `vmId`. */
  openConnections(vmId: string): number {
    return this.listeners.get(vmId)?.open.size ?? 0;
  }

  async close(): Promise<void> {
    await Promise.all([...this.listeners.keys()].map((id) => this.release(id)));
  }

  /** Where `host:port` may be reached: the first resolved address policy.ts allows, or the refusal. */
  async destination(host: string, port: number): Promise<Destination> {
    const bare = host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host;
    if (!bare || !Number.isInteger(port) || port < 1 || port > 65535)
      return { ok: false, error: new AppError("bad_request", "the target must be host:port with a port 1..65535") };
    let addresses: ResolvedAddress[];
    if (isIP(bare)) addresses = [{ address: bare, family: isIP(bare) }];
    else {
      try {
        addresses = await withTimeout(this.resolve(bare), this.config.connectTimeoutMs, `resolving ${bare}`);
      } catch (err) {
        return { ok: false, error: new AppError("bad_gateway", `cannot resolve ${bare}: ${(err as Error).message}`.slice(0, 300)) };
      }
    }
    const own = this.hostAddresses();
    const refusals: string[] = [];
    for (const a of addresses) {
      const d = decide(a.address, port, this.config.rules, own);
      if (d.allowed) return { ok: true, address: a.address, port, host: bare };
      refusals.push(d.why);
    }
    return { ok: false, error: new AppError("forbidden", `egress to ${bare}:${port} refused: ${refusals.join("; ").slice(0, 300) || "no address"}`) };
  }

  private track(entry: VmListener, s: Duplex): void {
    entry.open.add(s);
    s.once("close", () => entry.open.delete(s));
  }

  /**
   * A plain request: an async call's outcome (`GET /operations/<id>`) or a call to an upstream (`/u/<name>/…`), egress or
   * not; else out through `forward` when the VM has egress.
   */
  private async dispatch(vmId: string, entry: VmListener, req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = ownPath(req.url ?? "");
    const operation = /^\/operations\/([a-z0-9_]{1,64})$/.exec(path);
    if (operation && (req.method === "GET" || req.method === "HEAD"))
      return this.upstreams.operation({ vmId, requestId: newId("request"), res, id: operation[1]! });
    const target = upstreamTarget(path);
    if (target) {
      const requestId = newId("request");
      return this.upstreams.handle({
        vmId,
        requestId,
        req,
        res,
        ...target,
        destination: (host, port) => this.destination(host, port),
        exchanges: this.exchanges,
        idleTimeoutMs: this.config.idleTimeoutMs,
      });
    }
    if (!entry.egress) {
      this.log.info("egress refused: the agent has no egress", { vmId, target: req.url?.slice(0, 200) });
      return sendError(res, noEgress(), newId("request"), { closeConnection: true });
    }
    return this.forward(vmId, req, res);
  }

  /** CONNECT host:port → a TCP tunnel to the checked address. */
  private async tunnel(vmId: string, req: IncomingMessage, client: Duplex, head: Buffer): Promise<void> {
    const requestId = newId("request");
    const target = parseAuthority(req.url ?? "");
    const dest = target
      ? await this.destination(target.host, target.port)
      : { ok: false as const, error: new AppError("bad_request", "CONNECT needs host:port") };
    if (!dest.ok) {
      this.log.info("egress refused", { vmId, target: req.url?.slice(0, 200), status: dest.error.status, why: dest.error.message });
      sendErrorOnSocket(client, dest.error, requestId);
      return;
    }
    const upstream = connect({ host: dest.address, port: dest.port });
    let connected = false;
    const timer = setTimeout(
      () => upstream.destroy(new AppError("gateway_timeout", `connecting to ${dest.host}:${dest.port} took over ${this.config.connectTimeoutMs} ms`)),
      this.config.connectTimeoutMs,
    );
    upstream.once("connect", () => {
      connected = true;
      clearTimeout(timer);
      this.log.debug("egress tunnel", { vmId, host: dest.host, address: dest.address, port: dest.port });
      upstream.setTimeout(this.config.idleTimeoutMs, () => upstream.destroy());
      client.write("HTTP/1.1 200 Connection Established\r\n\r\n");
      this.relayTunnel(vmId, requestId, client, upstream, head);
    });
    upstream.once("error", (err) => {
      clearTimeout(timer);
      if (!connected) {
        const e =
          err instanceof AppError
            ? err
            : new AppError("bad_gateway", `cannot connect to ${dest.host}:${dest.port}: ${(err as NodeJS.ErrnoException).code ?? err.message}`);
        this.log.info("egress connect failed", { vmId, host: dest.host, address: dest.address, port: dest.port, why: e.message });
        sendErrorOnSocket(client, e, requestId);
      } else client.destroy();
    });
    client.once("error", () => upstream.destroy());
    client.once("close", () => upstream.destroy());
    upstream.once("close", () => client.destroy());
  }

  /**
   * Carries a tunnel's bytes both ways, telling the observer what the exchange does. The proxy cannot read TLS, so the
   * rule is the direction of the last bytes: a tunnel waits when the guest spoke last (its request is out, no answer
   * yet), and each chunk from the far end is an answer, written to the guest once the observer lets it (a dozing VM
   * runs again first; the far socket is paused meanwhile, so order and backpressure hold). A token stream (the far end
   * speaking, with gaps of 50 ms) keeps its exchange answering, never waiting, so it never dozes the VM; the guest's
   * own bytes in between (a TLS record, an HTTP/2 window update) make it wait again only until the next chunk.
   * `waiting` is told only when the direction changes, and nothing is allocated per chunk unless the VM dozes.
   */
  private relayTunnel(vmId: string, id: string, client: Duplex, upstream: Socket, head: Buffer): void {
    const exchanges = this.exchanges;
    let guestSpokeLast = false;
    /** The write of a chunk held until the VM runs (at most one: the far socket is paused meanwhile). */
    let held: Promise<void> | undefined;
    const toFar = (chunk: Buffer) => {
      if (!guestSpokeLast) {
        guestSpokeLast = true;
        exchanges.waiting(vmId, id);
      }
      if (!upstream.write(chunk)) client.pause();
    };
    const toGuest = (chunk: Buffer) => {
      guestSpokeLast = false;
      const resumed = exchanges.answer(vmId, id);
      if (resumed === undefined) {
        if (!client.write(chunk)) upstream.pause();
        return;
      }
      upstream.pause();
      held = resumed.then(() => {
        held = undefined;
        if (client.destroyed) return;
        if (client.write(chunk)) upstream.resume(); // else the guest's drain resumes it
      });
    };
    upstream.on("drain", () => client.resume());
    client.on("drain", () => {
      if (held === undefined) upstream.resume();
    });
    upstream.on("data", toGuest);
    client.on("data", toFar);
    upstream.once("end", () => {
      if (held === undefined) client.end();
      else void held.then(() => client.end()); // after the last chunk
    });
    client.once("end", () => upstream.end());
    let over = false;
    const ended = () => {
      if (over) return;
      over = true;
      exchanges.ended(vmId, id);
    };
    client.once("close", ended);
    upstream.once("close", ended);
    if (head.length) toFar(head);
  }

  /** An absolute-form plain HTTP request → the same request, in origin form, to the checked address. */
  private async forward(vmId: string, req: IncomingMessage, res: ServerResponse): Promise<void> {
    const requestId = newId("request");
    let url: URL | undefined;
    try {
      url = new URL(req.url ?? "");
    } catch {
      url = undefined;
    }
    if (url?.protocol !== "http:") {
      sendError(
        res,
        new AppError("bad_request", "this is an egress proxy: send `CONNECT host:port`, or a plain HTTP request in absolute form (http://host/path)"),
        requestId,
        { closeConnection: true },
      );
      return;
    }
    const dest = await this.destination(url.hostname, url.port ? Number(url.port) : 80);
    if (!dest.ok) {
      this.log.info("egress refused", { vmId, target: `${url.host}`.slice(0, 200), status: dest.error.status, why: dest.error.message });
      sendError(res, dest.error, requestId, { closeConnection: true });
      return;
    }
    const headers: Record<string, string | string[]> = {};
    for (const [k, v] of Object.entries(req.headers)) if (v !== undefined && !hopByHopHeaders.has(k)) headers[k] = v;
    headers.host = url.host;
    const upstream = httpRequest({
      host: dest.address,
      port: dest.port,
      method: req.method,
      path: `${url.pathname}${url.search}`,
      headers,
      setHost: false,
      agent: false,
      timeout: this.config.connectTimeoutMs,
    });
    const exchanges = this.exchanges;
    res.once("close", () => {
      upstream.destroy(); // the guest went away (or the answer is complete): nothing more to carry
      exchanges.ended(vmId, requestId);
    });
    upstream.once("timeout", () =>
      upstream.destroy(new AppError("gateway_timeout", `${dest.host}:${dest.port} did not answer within ${this.config.connectTimeoutMs} ms`)),
    );
    // Plain HTTP is read, not guessed: the exchange waits once the guest's request body has ended, and its answer is
    // the response's head and every chunk after it, each written once the observer lets it (a dozing VM runs first).
    req.once("end", () => exchanges.waiting(vmId, requestId));
    upstream.once("response", (up) => {
      upstream.setTimeout(this.config.idleTimeoutMs);
      const out: string[] = [];
      for (let i = 0; i < up.rawHeaders.length; i += 2)
        if (!hopByHopHeaders.has(up.rawHeaders[i]!.toLowerCase())) out.push(up.rawHeaders[i]!, up.rawHeaders[i + 1]!);
      const writeHead = () => {
        if (res.destroyed) return;
        res.writeHead(up.statusCode ?? 502, out);
        relayBody(up, res, () => exchanges.answer(vmId, requestId));
      };
      const resumed = exchanges.answer(vmId, requestId);
      if (resumed === undefined) writeHead();
      else {
        up.pause();
        void resumed.then(writeHead);
      }
    });
    upstream.once("error", (err) => {
      const e =
        err instanceof AppError
          ? err
          : new AppError("bad_gateway", `cannot reach ${dest.host}:${dest.port}: ${(err as NodeJS.ErrnoException).code ?? err.message}`);
      sendError(res, e, requestId, { closeConnection: true });
    });
    req.pipe(upstream);
  }
}

/** The 403 of a VM without egress for anything but its upstreams. */
const noEgress = () => new AppError("forbidden", `this agent has no egress: it reaches only its tenant's upstreams, at ${upstreamsGuestUrl}/<name>/…`);

/**
 * A request's path on the proxy itself: origin form as sent, or an absolute-form URL naming the proxy's own guest
 * address (a client that sent it through HTTP_PROXY anyway); anything else is "" (not the proxy's own).
 */
function ownPath(url: string): string {
  if (url.startsWith("/")) return url;
  const own = `http://${EGRESS_PROXY_GUEST_IP}:${EGRESS_PROXY_GUEST_PORT}/`;
  return url.startsWith(own) ? url.slice(own.length - 1) : "";
}

/**
 * A response body to the guest, as `pipe` would (backpressure, end) but each chunk first through `answer`: undefined,
 * write it now; a promise, hold it (the far side paused) and write it once that resolves.
 */
function relayBody(up: IncomingMessage, res: ServerResponse, answer: () => Promise<void> | undefined): void {
  /** The write of a chunk held until the VM runs (at most one: the far side is paused meanwhile). */
  let held: Promise<void> | undefined;
  up.on("data", (chunk: Buffer) => {
    const resumed = answer();
    if (resumed === undefined) {
      if (!res.write(chunk)) up.pause();
      return;
    }
    up.pause();
    held = resumed.then(() => {
      held = undefined;
      if (res.destroyed) return;
      if (res.write(chunk)) up.resume();
    });
  });
  res.on("drain", () => {
    if (held === undefined) up.resume();
  });
  up.once("end", () => {
    if (held === undefined) res.end();
    else void held.then(() => res.end()); // after the last chunk
  });
  up.once("close", () => {
    if (!up.complete) res.destroy(); // the far end cut the answer short
  });
  up.resume();
}

/** `host:port` or `[v6]:port` → its parts; undefined when it is not that. */
export function parseAuthority(text: string): { host: string; port: number } | undefined {
  const m = /^(\[[0-9a-fA-F:.%\w]+\]|[^:[\]\s]+):(\d{1,5})$/.exec(text);
  if (!m) return undefined;
  return { host: m[1]!, port: Number(m[2]) };
}

/** Every address of every interface of this host (loopback included). */
export function interfaceAddresses(): string[] {
  return Object.values(networkInterfaces()).flatMap((list) => (list ?? []).map((i) => i.address));
}

function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what} took over ${ms} ms`)), ms);
    p.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      (err: unknown) => {
        clearTimeout(timer);
        reject(err instanceof Error ? err : new Error(String(err)));
      },
    );
  });
}

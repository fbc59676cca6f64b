// The remote fleet on Node: hosts reached with undici (pooled keep-alive, no total body timeout, bodies left as the agent encoded them) and WebSockets joined through hosts.
// (Node's fetch would decode gzip yet keep Content-Encoding, and adds request headers of its own; Workers' fetch needs neither fix.)
import type { IncomingMessage } from "node:http";
import { connect as netConnect, type Socket } from "node:net";
import { Readable, type Duplex } from "node:stream";
import { connect as tlsConnect } from "node:tls";
import { Agent, errors as undiciErrors } from "undici";
import { AppError } from "../../lib/errors.ts";
import type { Logger } from "../../lib/log.ts";
import type { NodeFleet, UpgradeContext } from "./fleet.ts";
import { hostErrorFrom, hostErrorHeader, hostOpPaths, hostTokenHeader, signHostCall } from "../../contracts/host-protocol.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import type { Placement } from "../placement.ts";
import { createRemoteFleet, leased, type HostFetch } from "../remote-fleet.ts";

export interface NodeHostFetchOptions {
  /** Time to connect to a host's ingress. */
  connectTimeoutMs: number;
  /** Time from sending a call to the host's response headers (covers a wake's queue and restore). */
  headersTimeoutMs: number;
}

export function createNodeHostFetch(opts: NodeHostFetchOptions): HostFetch & { close(): Promise<void> } {
  const agent = new Agent({
    connections: 1024,
    pipelining: 1,
    keepAliveTimeout: 30_000,
    connect: { timeout: opts.connectTimeoutMs },
    headersTimeout: opts.headersTimeoutMs,
    bodyTimeout: 0, // streams of any length: idle rules are the host's, not a total timeout
  });

  const hostFetch = async (req: Request): Promise<Response> => {
    const url = new URL(req.url);
    const headers: Record<string, string> = {};
    req.headers.forEach((value, name) => {
      headers[name] = value;
    });
    let upstream: Awaited<ReturnType<Agent["request"]>>;
    try {
      upstream = await agent.request({
        origin: url.origin,
        path: url.pathname + url.search,
        method: req.method as "GET",
        headers,
        body: req.body ? Readable.fromWeb(req.body as import("node:stream/web").ReadableStream) : null,
        signal: req.signal,
      });
    } catch (err) {
      if (err instanceof undiciErrors.HeadersTimeoutError)
        throw new AppError("gateway_timeout", `host ${url.host} did not answer within ${opts.headersTimeoutMs} ms`, { cause: err });
      throw err;
    }
    const out = new Headers();
    for (const [name, value] of Object.entries(upstream.headers)) {
      if (Array.isArray(value)) for (const v of value) out.append(name, v);
      else if (value !== undefined) out.set(name, value);
    }
    const status = upstream.statusCode;
    if (status === 204 || status === 205 || status === 304 || req.method === "HEAD") {
      upstream.body.resume();
      return new Response(null, { status, headers: out });
    }
    return new Response(webStream(upstream.body), { status, headers: out });
  };

  return Object.assign(hostFetch, { close: () => agent.close() });
}

/** A pull-based web stream over a Node stream: nothing is read ahead of the client, cancel destroys the source. */
function webStream(body: Readable): ReadableStream<Uint8Array> {
  const chunks = body[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        try {
          const next = await chunks.next();
          if (next.done) controller.close();
          else controller.enqueue(new Uint8Array(next.value.buffer, next.value.byteOffset, next.value.byteLength));
        } catch (err) {
          controller.error(err);
        }
      },
      cancel() {
        body.destroy();
      },
    },
    { highWaterMark: 0 },
  );
}

export interface NodeHostUpgradeDeps {
  placement: Placement;
  /** `componentKey(COMPONENT_SECRET)`, shared with the hosts. */
  key: Uint8Array;
  log: Logger;
  connectTimeoutMs: number;
  /** Time from the upgrade sent to the host's answer (covers a wake's queue and restore, and the agent's handshake). */
  headersTimeoutMs: number;
  tokenTtlS?: number;
}

export type NodeHostUpgrade = NonNullable<NodeFleet["upgrade"]> & {
  /** Sockets joined through hosts now. */
  active(): number;
  /** Cuts the joined sockets still open. */
  close(): void;
};

/**
 * `Fleet.upgrade` for a Node gateway over remote hosts: the upgrade goes to the agent's host (`/v1/websocket`, with a
 * signed token), which wakes the agent and relays frames (activity, 1001 before hibernating). Once the host answers
 * `101` this side only joins bytes, closing both sockets when either ends.
 */
export function createNodeHostUpgrade(deps: NodeHostUpgradeDeps): NodeHostUpgrade {
  const { placement, key, log } = deps;
  const open = new Set<{ client: Duplex; host: Socket }>();

  async function upgrade(spec: AgentSpec, req: IncomingMessage, client: Duplex, head: Buffer, ctx: UpgradeContext): Promise<void> {
    const host = await placement.hostFor(spec);
    const agent = leased(spec, host);
    const call = {
      op: "websocket" as const,
      agent,
      reason: ctx.reason,
      path: ctx.pathInside,
      requestId: ctx.requestId,
      proxyIdleTimeoutMs: ctx.proxyIdleTimeoutMs,
      responseTimeoutMs: ctx.responseTimeoutMs,
    };
    const token = await signHostCall(key, host.id, call, deps.tokenTtlS ?? 30);
    const url = new URL(hostOpPaths.websocket.slice(1), host.url.endsWith("/") ? host.url : `${host.url}/`);
    let lines = `${req.method ?? "GET"} ${url.pathname} HTTP/1.1\r\nhost: ${url.host}\r\n`;
    for (let i = 0; i < ctx.headers.length; i += 2) {
      const name = ctx.headers[i]!.toLowerCase();
      if (name === "host" || name === hostTokenHeader) continue; // a client's own copy of the header never reaches the host
      lines += `${ctx.headers[i]}: ${ctx.headers[i + 1]}\r\n`;
    }
    lines += `${hostTokenHeader}: ${token}\r\n\r\n`;

    const port = Number(url.port) || (url.protocol === "https:" ? 443 : 80);
    const socket: Socket =
      url.protocol === "https:" ? tlsConnect({ host: url.hostname, port, servername: url.hostname }) : netConnect({ host: url.hostname, port });
    socket.setNoDelay(true);
    const answer = await new Promise<{ head: Buffer; rest: Buffer }>((resolve, reject) => {
      let buffered = Buffer.alloc(0);
      let connected = false;
      const fail = (err: AppError) => {
        cleanup();
        socket.destroy();
        reject(err);
      };
      const unreachable = (why: string) => {
        placement.forget(agent.id);
        log.warn("host unreachable", { hostId: host.id, url: host.url, op: "websocket", agentId: agent.id, err: why });
        placement.unreachable?.(host);
        fail(new AppError("host_unavailable", `host ${host.id} unreachable: ${why}`, { retryAfterS: 2 }));
      };
      const connectTimer = setTimeout(() => unreachable(`no connection within ${deps.connectTimeoutMs} ms`), deps.connectTimeoutMs);
      const headersTimer = setTimeout(
        () => fail(new AppError("gateway_timeout", `host ${host.id} did not answer the WebSocket upgrade within ${deps.headersTimeoutMs} ms`)),
        deps.headersTimeoutMs,
      );
      const onConnect = () => {
        connected = true;
        clearTimeout(connectTimer);
        socket.write(lines, "latin1");
      };
      const onData = (chunk: Buffer) => {
        buffered = Buffer.concat([buffered, chunk]);
        const end = buffered.indexOf("\r\n\r\n");
        if (end === -1) {
          if (buffered.length > 65_536) fail(new AppError("bad_gateway", `host ${host.id} sent an upgrade answer head over 64 KiB`));
          return;
        }
        cleanup();
        socket.pause();
        resolve({ head: buffered.subarray(0, end + 4), rest: buffered.subarray(end + 4) });
      };
      const onError = (err: Error) =>
        connected
          ? fail(new AppError("bad_gateway", `host ${host.id} failed the WebSocket upgrade: ${err.message}`, { cause: err }))
          : unreachable(err.message);
      const onClose = () => fail(new AppError("bad_gateway", `host ${host.id} closed the connection before answering the WebSocket upgrade`));
      // The client went away while the agent woke: the host sees the close and releases its ticket.
      const onClientClose = () => fail(new AppError("bad_gateway", "client went away"));
      function cleanup() {
        clearTimeout(connectTimer);
        clearTimeout(headersTimer);
        socket.off(url.protocol === "https:" ? "secureConnect" : "connect", onConnect);
        socket.off("data", onData);
        socket.off("error", onError);
        socket.off("close", onClose);
        client.off("close", onClientClose);
      }
      socket.on(url.protocol === "https:" ? "secureConnect" : "connect", onConnect);
      socket.on("data", onData);
      socket.on("error", onError);
      socket.on("close", onClose);
      client.on("close", onClientClose);
    });

    const statusLine = answer.head.subarray(0, answer.head.indexOf("\r\n")).toString("latin1");
    const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(statusLine)?.[1] ?? 0);
    if (status !== 101 && new RegExp(`\\r\\n${hostErrorHeader}:`, "i").test(answer.head.toString("latin1"))) {
      // The host's own answer (a bad token, a full wake queue): the same AppError codes as a forward.
      const res = parseSmallResponse(status, answer.head);
      const body = await readBody(socket, answer.rest, Number(res.headers.get("content-length")));
      socket.destroy();
      const error = await hostErrorFrom(new Response(new Uint8Array(body), { status, headers: res.headers }), host.id);
      if (error.code === "bad_gateway" && status === 401) log.error("host refused the gateway's component token", { hostId: host.id, err: error.message });
      throw error;
    }
    if (status === 0) {
      socket.destroy();
      throw new AppError("bad_gateway", `host ${host.id} answered the WebSocket upgrade with ${JSON.stringify(statusLine.slice(0, 100))}`);
    }
    // 101 (the host's relay added x-request-id, x-wake), or the agent's refusal passed on as it came: from here on bytes only.
    join(client, socket, answer.head, answer.rest, status === 101 ? head : Buffer.alloc(0));
  }

  function join(client: Duplex, host: Socket, answerHead: Buffer, rest: Buffer, clientHead: Buffer): void {
    const pair = { client, host };
    open.add(pair);
    (client as Socket).setNoDelay?.(true);
    let ended = false;
    const end = () => {
      if (ended) return;
      ended = true;
      open.delete(pair);
      // Bytes still arriving from one side have nowhere to go once the other is ending.
      host.unpipe(client);
      client.unpipe(host);
      client.end();
      host.end();
      setTimeout(() => {
        client.destroy();
        host.destroy();
      }, 2000).unref();
    };
    client.write(answerHead);
    if (rest.length > 0) client.write(rest);
    if (clientHead.length > 0) host.write(clientHead);
    host.pipe(client, { end: false });
    client.pipe(host, { end: false });
    host.resume();
    for (const s of [client, host]) {
      s.on("end", end);
      s.on("close", end);
      s.on("error", () => {
        client.destroy();
        host.destroy();
        end();
      });
    }
  }

  return Object.assign(upgrade, {
    active: () => open.size,
    close() {
      for (const { client, host } of open) {
        client.destroy();
        host.destroy();
      }
      open.clear();
    },
  });
}

/** A host's answer head as a Response without body (status and headers). */
function parseSmallResponse(status: number, head: Buffer): Response {
  const headers = new Headers();
  for (const line of head.toString("latin1").split("\r\n").slice(1)) {
    const colon = line.indexOf(":");
    if (colon > 0) headers.append(line.slice(0, colon).trim(), line.slice(colon + 1).trim());
  }
  return new Response(null, { status: status === 101 ? 200 : status, headers });
}

/** The rest of a small body: `length` bytes when declared (at most 64 KiB), else until the host closes; 2 s at most. */
function readBody(socket: Socket, first: Buffer, length: number): Promise<Buffer> {
  const want = Number.isInteger(length) && length >= 0 ? Math.min(length, 65_536) : 65_536;
  return new Promise((resolve) => {
    let body = first;
    const done = () => {
      clearTimeout(timer);
      socket.off("data", onData);
      socket.off("close", done);
      resolve(body.subarray(0, want));
    };
    const onData = (chunk: Buffer) => {
      body = Buffer.concat([body, chunk]);
      if (body.length >= want) done();
    };
    const timer = setTimeout(done, 2000);
    if (body.length >= want) return done();
    socket.on("data", onData);
    socket.on("close", done);
    socket.on("error", () => undefined);
    socket.resume();
  });
}

export interface NodeRemoteFleetDeps {
  placement: Placement;
  /** `componentKey(COMPONENT_SECRET)`, shared with the hosts. */
  key: Uint8Array;
  log: Logger;
  connectTimeoutMs: number;
  headersTimeoutMs: number;
}

/** The fleet of a Node gateway in front of remote hosts: the web fleet over undici, plus WebSockets relayed by the hosts. */
export function createNodeRemoteFleet(deps: NodeRemoteFleetDeps): NodeFleet & { close(): Promise<void> } {
  const hostFetch = createNodeHostFetch(deps);
  const upgrade = createNodeHostUpgrade(deps);
  return {
    ...createRemoteFleet({ placement: deps.placement, key: deps.key, fetch: hostFetch, log: deps.log }),
    upgrade,
    async close() {
      upgrade.close(); // joined WebSockets are the server's sockets too: closing waits for them
      await hostFetch.close();
    },
  };
}

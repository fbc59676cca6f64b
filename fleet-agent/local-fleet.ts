// The in-process fleet of one host: wake the VM, stream the call to it, relay its WebSockets; every hold ends with its call.
//
// It is the web-only `Fleet` port, plus what a Node gateway in the same process can use (`withHold`, `upgrade`; the
// shape of `NodeFleet` in gateway/node/fleet.ts). The host ingress serves remote gateways through this same object.
import type { IncomingMessage } from "node:http";
import type { Duplex } from "node:stream";
import { Readable } from "node:stream";
import { Pool, errors as undiciErrors } from "undici";
import { rollbackHeader, type AgentSpec, type VmStatus } from "../contracts/agent.ts";
import type { Fleet, ForwardContext, SocketLimits } from "../contracts/fleet.ts";
import { serverTiming } from "../contracts/fleet.ts";
import { execKeyHeader } from "../contracts/exec-wire.ts";
import { AppError } from "../lib/errors.ts";
import type { Logger } from "../lib/log.ts";
import { PerRunPools } from "../lib/per-run.ts";
import { defaultUpstreamTimeouts } from "../lib/shared-env.ts";
import type { Host } from "./host.ts";
import { checkpointView } from "./checkpoints.ts";
import { WebSocketRelay } from "./relay/websocket-relay.ts";
import type { Ticket } from "./tickets.ts";
import { lazySweeper } from "../lib/node-sweeper.ts";

export interface LocalFleetOptions {
  /** Time to connect to the VM's port. */
  connectTimeoutMs: number;
  /** Time from sending the request to the agent's response headers. */
  headersTimeoutMs: number;
}

export const defaultLocalFleetOptions: LocalFleetOptions = { ...defaultUpstreamTimeouts };

/** A call's hold on an awake VM as callers see it: the ticket, without the release (that is `withHold`'s). */
export type Hold = Omit<Ticket, "release">;

/** A WebSocket upgrade for the host to relay (gateway in this process, or the ingress for a remote one). */
export interface RelayContext extends ForwardContext, SocketLimits {
  pathInside: string;
  /** The handshake's headers for the agent, flat, header rules applied; the `host` pair is replaced by the VM's. */
  headers: string[];
}

export interface LocalFleet extends Fleet {
  /** Wakes the agent, runs `use` with a hold on it, and releases the hold when `use` settles, however it does. */
  withHold<T>(agent: AgentSpec, ctx: ForwardContext, use: (hold: Hold) => Promise<T>): Promise<T>;
  /**
   * Relays a WebSocket to the agent from this host: data frames keep it awake, a hibernation closes the socket with 1001.
   * Resolves once the handshake is over (the agent's 101 or refusal passed on); rejects, with nothing written, when
   * the agent cannot be woken.
   */
  upgrade(agent: AgentSpec, req: IncomingMessage, socket: Duplex, head: Buffer, ctx: RelayContext): Promise<void>;
  /** WebSockets relayed now. */
  websockets(): number;
  /** Closes the relayed WebSockets (1001) and the pooled connections. */
  close(): Promise<void>;
}

export function createLocalFleet(host: Host, log: Logger, opts: LocalFleetOptions = defaultLocalFleetOptions): LocalFleet {
  const pools = new PerRunPools<Pool>(
    (ep) =>
      new Pool(`http://${ep.host}:${ep.port}`, {
        ...(ep.socketPath ? { socketPath: ep.socketPath } : {}), // a QEMU's relayed port (host:port then names it only)
        connections: 256,
        pipelining: 1,
        keepAliveTimeout: 30_000,
        connectTimeout: opts.connectTimeoutMs,
        // The response timeout is this fleet's sweep's (`CallWatch`): time the VM dozes does not count towards it.
        headersTimeout: 0,
        bodyTimeout: 0, // streams of any length: idle limits are the gateway's (or the sweep's, when given), not a total timeout
      }),
    (pool) => void pool.destroy().catch(() => undefined),
  );
  // The VMs' exec servers (one request per connection: they answer `Connection: close`), pooled apart from the workloads'.
  const execPools = new PerRunPools<Pool>(
    (ep) =>
      new Pool(`http://${ep.host}:${ep.port}`, {
        ...(ep.socketPath ? { socketPath: ep.socketPath } : {}),
        connections: 64,
        pipelining: 1,
        connectTimeout: opts.connectTimeoutMs,
        headersTimeout: 0,
        bodyTimeout: 0,
      }),
    (pool) => void pool.destroy().catch(() => undefined),
  );
  const relays = new Set<WebSocketRelay>();
  const watches = new Set<CallWatch>();
  // Calls' and WebSockets' deadlines every 100 ms, only while there are any.
  const sweeper = lazySweeper(100, (now) => {
    for (const r of relays) r.sweep(now);
    for (const w of watches) w.sweep(now);
    return relays.size > 0 || watches.size > 0;
  });

  // On every proxied call: a warm VM is held at once (no promise until `use`'s own); otherwise after the wake.
  function withHold<T>(agent: AgentSpec, ctx: ForwardContext, use: (hold: Hold) => Promise<T>): Promise<T> {
    const warm = host.acquireWarm(agent, ctx.reason);
    if (warm) return holdWhile(warm, use);
    return host.acquire(agent, ctx.reason, ctx.requestId).then((ticket) => holdWhile(ticket, use));
  }

  /** Runs `use` with the ticket and releases it when `use` settles, however it does. */
  function holdWhile<T>(ticket: Ticket, use: (hold: Hold) => Promise<T>): Promise<T> {
    let used: Promise<T>;
    try {
      used = use(ticket);
    } catch (err) {
      ticket.release();
      return Promise.reject(err);
    }
    return used.then(
      (value) => {
        ticket.release();
        return value;
      },
      (err: unknown) => {
        ticket.release();
        throw err;
      },
    );
  }

  return {
    async forward(agent: AgentSpec, req: Request, ctx: ForwardContext): Promise<Response> {
      const ticket = await host.acquire(agent, ctx.reason, ctx.requestId, { handOff: ctx.handOff === true });
      const abort = new AbortController();
      const onClientAbort = () => abort.abort(ctx.signal?.reason);
      ctx.signal?.addEventListener("abort", onClientAbort, { once: true });
      const watch = new CallWatch(ticket, ctx.limits?.responseTimeoutMs ?? opts.headersTimeoutMs, ctx.limits?.proxyIdleTimeoutMs, () => {
        abort.abort(new AppError("gateway_timeout", `agent ${agent.id} sent no response within ${watch.responseMs} ms`));
        watches.delete(watch);
      });
      watches.add(watch);
      sweeper.wake();
      const exec = ctx.target === "exec";
      try {
        const url = new URL(req.url);
        const reqHeaders = headerRecord(req.headers);
        let pool: Pool;
        if (exec) {
          // The VM's exec server, with its key added here: it never leaves this host.
          const target = await host.execTarget(agent.id);
          reqHeaders[execKeyHeader] = target.key;
          pool = execPools.get(agent.id, ticket.wake.runId, target);
        } else {
          delete reqHeaders[execKeyHeader];
          pool = pools.get(agent.id, ticket.wake.runId, ticket.endpoint);
        }
        const upstream = await pool.request({
          path: url.pathname + url.search,
          method: req.method,
          headers: reqHeaders,
          body: req.body ? Readable.fromWeb(touching(req.body, ticket) as import("node:stream/web").ReadableStream) : null,
          signal: abort.signal,
        });
        ctx.signal?.removeEventListener("abort", onClientAbort);
        // A running command is work however long it is quiet: its hold stays in flight (the VM is not hibernated under
        // it) until its answer is over. A workload's answer counts only while its bytes move.
        if (!exec) ticket.streaming();
        ticket.firstByte();
        const headers = new Headers();
        for (const [k, v] of Object.entries(upstream.headers)) {
          if (Array.isArray(v)) for (const item of v) headers.append(k, item);
          else if (v !== undefined) headers.set(k, v);
        }
        headers.set("x-wake", ticket.wake.wake);
        if (ticket.wake.timings.rollbackMs) headers.set(rollbackHeader, String(ticket.wake.timings.rollbackMs));
        const timing = serverTiming(ticket.wake.timings);
        if (timing) headers.append("server-timing", timing);
        const nullBody = upstream.statusCode === 204 || upstream.statusCode === 304 || req.method === "HEAD";
        if (nullBody) {
          watches.delete(watch);
          upstream.body.resume();
          ticket.release();
          return new Response(null, { status: upstream.statusCode, headers });
        }
        // The body's idle limit, when the caller gave one, is watched by the sweep too; otherwise the caller's.
        const idleCut = () => {
          watches.delete(watch);
          log.warn("stream idle timeout: ended", { requestId: ctx.requestId, agentId: agent.id, limitMs: ctx.limits?.proxyIdleTimeoutMs });
          upstream.body.destroy(new Error("stream idle timeout"));
        };
        if (!watch.streaming(idleCut)) watches.delete(watch);
        return new Response(
          streamBody(upstream.body, ticket, watch, () => watches.delete(watch)),
          { status: upstream.statusCode, headers },
        );
      } catch (err) {
        watches.delete(watch);
        ctx.signal?.removeEventListener("abort", onClientAbort);
        ticket.release();
        if (abort.signal.reason instanceof AppError) throw abort.signal.reason;
        // The caller went away: nobody reads the answer, and nothing failed on the agent's side.
        if (ctx.signal?.aborted) throw new AppError("client_gone", `the caller of agent ${agent.id} closed its connection`, { cause: err });
        // Its VM was stopped under the call because the agent is being deleted: that, not a bad answer, is what failed.
        if (!(err instanceof AppError) && host.deleted(agent.id)) throw new AppError("not_found", `agent ${agent.id} was deleted`, { cause: err });
        throw upstreamError(err, agent.id);
      }
    },
    withHold,
    async upgrade(agent, req, socket, head, ctx) {
      let handshakeOver!: () => void;
      const handshake = new Promise<void>((resolve) => (handshakeOver = resolve));
      const relayed = withHold(agent, ctx, (hold) => {
        if (socket.destroyed) return Promise.resolve(); // the client went away while the agent woke
        const ep = hold.endpoint;
        const headers =
          ctx.headers[0]?.toLowerCase() === "host"
            ? ["host", `${ep.host}:${ep.port}`, ...ctx.headers.slice(2)]
            : ["host", `${ep.host}:${ep.port}`, ...ctx.headers];
        return new Promise<void>((closed) => {
          new WebSocketRelay(
            {
              req,
              socket,
              head,
              requestId: ctx.requestId,
              agentId: agent.id,
              pathInside: ctx.pathInside,
              ticket: hold,
              headers,
              proxyIdleTimeoutMs: ctx.proxyIdleTimeoutMs,
              responseTimeoutMs: ctx.responseTimeoutMs,
              handshakeDone: handshakeOver,
              closed,
            },
            { log, active: relays },
          ).start();
          sweeper.wake();
        });
      });
      // Until the handshake is over, a failed wake is the caller's to answer; after it, the relay has answered.
      await Promise.race([handshake, relayed]);
      relayed.catch(() => undefined);
    },
    wake: (agent, reason, opts) => host.wake(agent, reason, opts),
    // A call whose client has its answer may hold the VM a moment longer (its stream's end not yet seen): waited for.
    hibernate: (agentId) => host.hibernateNow(agentId, { settleMs: apiHibernateSettleMs }),
    status: async (agentId) => host.status(agentId),
    async statuses(agentIds) {
      const out = new Map<string, VmStatus>();
      for (const id of agentIds) {
        const status = host.status(id);
        if (status) out.set(id, status);
      }
      return out;
    },
    addLease: (agent, ttlMs) => host.addLease(agent, ttlMs),
    dropLease: async (agentId, leaseId) => host.dropLease(agentId, leaseId),
    logs: async (agentId, opts) => host.logs(agentId, opts),
    checkpoint: async (agent, opts) => checkpointView(await host.checkpoint(agent, { ...opts, origin: "api" })),
    restoreCheckpoint: (agent, checkpointId, requestId) => host.restoreCheckpoint(agent, checkpointId, requestId),
    fork: (agent, checkpointId, requestId) => host.fork(agent, checkpointId, requestId),
    deleteCheckpoint: (agentId, checkpointId) => host.deleteCheckpoint(agentId, checkpointId),
    templates: () => host.templates(),
    async remove(agentId) {
      await host.remove(agentId);
      pools.drop(agentId);
      execPools.drop(agentId);
    },
    websockets: () => relays.size,
    async close() {
      sweeper.stop();
      for (const r of relays) r.goingAway("host shutting down");
      pools.close();
      execPools.close();
    },
  };
}

/** How long an explicit hibernate lets the calls in flight end before it refuses (409), ms. */
export const apiHibernateSettleMs = 2000;

function headerRecord(headers: Headers): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  headers.forEach((value, key) => {
    out[key] = value;
  });
  return out;
}

/** The request body as it flows to the agent: every chunk is a sign of life for the idle rule. */
function touching(body: ReadableStream<Uint8Array>, ticket: Ticket): ReadableStream<Uint8Array> {
  return body.pipeThrough(
    new TransformStream<Uint8Array, Uint8Array>({
      transform(chunk, controller) {
        ticket.touch();
        controller.enqueue(chunk);
      },
    }),
  );
}

/**
 * One forwarded call's timeouts, checked by the fleet's sweep (no timer per call): the response timeout until the
 * agent's headers, then (when the caller gave one) the idle timeout of its body. Time the VM dozed while they ran
 * (the hold's `dozedMs` grew: it waited on an outbound call) counts towards neither: their start moves forward by it.
 */
class CallWatch {
  private readonly ticket: Pick<Ticket, "dozedMs">;
  readonly responseMs: number;
  private readonly idleMs: number | undefined;
  private readonly timedOut: () => void;
  private cut: (() => void) | undefined;
  private dozedSeen: number;
  /** performance.now() the wait for the answer began, then when the body last moved. */
  lastByteAt: number;

  constructor(ticket: Pick<Ticket, "dozedMs">, responseMs: number, idleMs: number | undefined, timedOut: () => void) {
    this.ticket = ticket;
    this.responseMs = responseMs;
    this.idleMs = idleMs;
    this.timedOut = timedOut;
    this.dozedSeen = ticket.dozedMs();
    this.lastByteAt = performance.now();
  }

  /** The answer's head came: from now the idle limit applies, `cut` ending the body. False: there is none to watch. */
  streaming(cut: () => void): boolean {
    if (this.idleMs === undefined) return false;
    this.cut = cut;
    this.lastByteAt = performance.now();
    return true;
  }

  sweep(now: number): void {
    const dozed = this.ticket.dozedMs();
    if (dozed !== this.dozedSeen) {
      this.lastByteAt += dozed - this.dozedSeen;
      this.dozedSeen = dozed;
    }
    if (this.cut === undefined) {
      if (now - this.lastByteAt > this.responseMs) this.timedOut();
    } else if (now - this.lastByteAt > this.idleMs!) this.cut();
  }
}

/** The agent's response body as a web stream that keeps the ticket alive while it flows and releases it at the end. */
function streamBody(body: Readable, ticket: Ticket, watch: CallWatch, unwatch: () => void): ReadableStream<Uint8Array> {
  const chunks = body[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  const over = () => {
    unwatch();
    ticket.release();
  };
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        try {
          const next = await chunks.next();
          if (next.done) {
            over();
            controller.close();
            return;
          }
          ticket.touch();
          watch.lastByteAt = performance.now();
          controller.enqueue(new Uint8Array(next.value.buffer, next.value.byteOffset, next.value.byteLength));
        } catch (err) {
          over();
          controller.error(err);
        }
      },
      cancel() {
        body.on("error", () => undefined); // undici reports the abort we cause as an error: nothing to handle
        body.destroy();
        over();
      },
    },
    { highWaterMark: 0 },
  );
}

/** Maps a failure to reach the agent onto the error envelope's codes: 502 answered badly, 504 too slow. */
export function upstreamError(err: unknown, agentId: string): unknown {
  if (err instanceof AppError) return err;
  if (err instanceof undiciErrors.HeadersTimeoutError) return new AppError("gateway_timeout", `agent ${agentId} did not answer in time`, { cause: err });
  if (err instanceof undiciErrors.ConnectTimeoutError)
    return new AppError("gateway_timeout", `agent ${agentId} did not accept the connection in time`, { cause: err });
  if (err instanceof undiciErrors.RequestAbortedError || (err instanceof Error && err.name === "AbortError")) return err;
  const message = err instanceof Error ? err.message : String(err);
  return new AppError("bad_gateway", `agent ${agentId} answered badly: ${message}`, { cause: err });
}

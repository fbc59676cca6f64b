// The in-process Fleet adapter: acquire the VM on this host, stream the call to it, release when the stream ends.
import { Readable } from "node:stream";
import { Pool, errors as undiciErrors } from "undici";
import { AppError } from "../lib/errors.ts";
import type { Fleet, ForwardContext } from "./fleet.ts";
import { serverTiming } from "./fleet.ts";
import type { Host, Ticket } from "./host.ts";
import type { AgentSpec } from "./types.ts";

export interface LocalFleetOptions {
  /** Time to connect to the VM's port. */
  connectTimeoutMs: number;
  /** Time from sending the request to the agent's response headers. */
  headersTimeoutMs: number;
}

export const defaultLocalFleetOptions: LocalFleetOptions = { connectTimeoutMs: 5_000, headersTimeoutMs: 300_000 };

export function createLocalFleet(host: Host, opts: LocalFleetOptions = defaultLocalFleetOptions): Fleet & { close(): Promise<void> } {
  // One connection pool per VM run: a restored VM is a new process, so kept-alive sockets of the old one are dropped.
  const pools = new Map<string, { runId: string; pool: Pool }>();

  function poolFor(agentId: string, ticket: Ticket): Pool {
    const origin = `http://${ticket.endpoint.host}:${ticket.endpoint.port}`;
    const current = pools.get(agentId);
    if (current && current.runId === ticket.wake.runId) return current.pool;
    void current?.pool.destroy().catch(() => undefined);
    const pool = new Pool(origin, {
      connections: 256,
      pipelining: 1,
      keepAliveTimeout: 30_000,
      connectTimeout: opts.connectTimeoutMs,
      headersTimeout: opts.headersTimeoutMs,
      bodyTimeout: 0, // streams of any length: idle limits are the gateway's, not a total timeout
    });
    pools.set(agentId, { runId: ticket.wake.runId, pool });
    return pool;
  }

  return {
    async forward(agent: AgentSpec, req: Request, ctx: ForwardContext): Promise<Response> {
      const ticket = await host.acquire(agent, ctx.reason);
      try {
        const url = new URL(req.url);
        const upstream = await poolFor(agent.id, ticket).request({
          path: url.pathname + url.search,
          method: req.method,
          headers: headerRecord(req.headers),
          body: req.body ? Readable.fromWeb(touching(req.body, ticket) as import("node:stream/web").ReadableStream) : null,
          signal: ctx.signal ?? null,
        });
        ticket.streaming();
        ticket.firstByte();
        const headers = new Headers();
        for (const [k, v] of Object.entries(upstream.headers)) {
          if (Array.isArray(v)) for (const item of v) headers.append(k, item);
          else if (v !== undefined) headers.set(k, v);
        }
        headers.set("x-wake", ticket.wake.wake);
        const timing = serverTiming(ticket.wake.timings);
        if (timing) headers.append("server-timing", timing);
        const nullBody = upstream.statusCode === 204 || upstream.statusCode === 304 || req.method === "HEAD";
        if (nullBody) {
          upstream.body.resume();
          ticket.release();
          return new Response(null, { status: upstream.statusCode, headers });
        }
        return new Response(streamBody(upstream.body, ticket), { status: upstream.statusCode, headers });
      } catch (err) {
        ticket.release();
        throw upstreamError(err, agent.id);
      }
    },
    acquire: (agent, ctx) => host.acquire(agent, ctx.reason),
    wake: (agent, reason) => host.wake(agent, reason),
    hibernate: (agentId) => host.hibernateNow(agentId),
    status: async (agentId) => host.status(agentId),
    addLease: (agent, ttlMs) => host.addLease(agent, ttlMs),
    dropLease: async (agentId, leaseId) => host.dropLease(agentId, leaseId),
    async remove(agentId) {
      await host.remove(agentId);
      const p = pools.get(agentId);
      pools.delete(agentId);
      await p?.pool.destroy().catch(() => undefined);
    },
    async close() {
      await Promise.all([...pools.values()].map((p) => p.pool.destroy().catch(() => undefined)));
      pools.clear();
    },
  };
}

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

/** The agent's response body as a web stream that keeps the ticket alive while it flows and releases it at the end. */
function streamBody(body: Readable, ticket: Ticket): ReadableStream<Uint8Array> {
  const chunks = body[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        try {
          const next = await chunks.next();
          if (next.done) {
            ticket.release();
            controller.close();
            return;
          }
          ticket.touch();
          controller.enqueue(new Uint8Array(next.value.buffer, next.value.byteOffset, next.value.byteLength));
        } catch (err) {
          ticket.release();
          controller.error(err);
        }
      },
      cancel() {
        body.on("error", () => undefined); // undici reports the abort we cause as an error: nothing to handle
        body.destroy();
        ticket.release();
      },
    },
    { highWaterMark: 0 },
  );
}

/** Maps a failure to reach the agent onto the error envelope's codes: 502 answered badly, 504 too slow. */
export function upstreamError(err: unknown, agentId: string): unknown {
  if (err instanceof AppError) return err;
  if (err instanceof undiciErrors.HeadersTimeoutError) return new AppError("gateway_timeout", `agent ${agentId} did not answer in time`, { cause: err });
  if (err instanceof undiciErrors.ConnectTimeoutError) return new AppError("gateway_timeout", `agent ${agentId} did not accept the connection in time`, { cause: err });
  if (err instanceof undiciErrors.RequestAbortedError || (err instanceof Error && err.name === "AbortError")) return err;
  const message = err instanceof Error ? err.message : String(err);
  return new AppError("bad_gateway", `agent ${agentId} answered badly: ${message}`, { cause: err });
}

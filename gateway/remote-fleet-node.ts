// How a Node gateway reaches hosts: undici with pooled keep-alive, no total body timeout, and bodies left as the agent encoded them.
// (Node's fetch would decode gzip yet keep Content-Encoding, and adds request headers of its own; Workers' fetch needs neither fix.)
import { Readable } from "node:stream";
import { Agent, errors as undiciErrors } from "undici";
import { AppError } from "../lib/errors.ts";
import type { HostFetch } from "./remote-fleet.ts";

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
      if (err instanceof undiciErrors.HeadersTimeoutError) throw new AppError("gateway_timeout", `host ${url.host} did not answer within ${opts.headersTimeoutMs} ms`, { cause: err });
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

// A call through `Fleet.forward` under the agent's limits: the one web-stream data path (the Worker, the Hono app, Node over remote hosts).
//
// Limits enforced here: the body limit also for bodies without a declared length (413), the response timeout
// (504 when the agent's headers do not come in time) and the idle timeout of the response body (cut after
// `proxyIdleTimeoutMs` without a byte). The Node fast path enforces the same limits (from the same
// `EffectiveLimits`) on its raw connections.
import { AppError } from "../../lib/errors.ts";
import { withoutHopByHop } from "../../lib/http-headers.ts";
import type { ProxyCore, ResolvedAgent } from "./core.ts";

export interface ForwardCall {
  method: string;
  /** Path and query inside the agent. */
  pathInside: string;
  /** Headers for the agent, the header rules applied (no `host`). */
  headers: Headers;
  body: ReadableStream<Uint8Array> | null;
  requestId: string;
  /** The client went away: the upstream call is aborted. */
  clientSignal?: AbortSignal;
}

/**
 * The call forwarded, as an admission scope (admission.ts): `respond` gets the agent's response; what it returns
 * resolves once the exchange is over (the response body ended, was cut or cancelled), or rejects when no response
 * came (504, 413, the fleet's error), without `respond`.
 */
export function forwardCall(core: ProxyCore, agent: ResolvedAgent, call: ForwardCall, respond: (res: Response) => void): Promise<void> {
  return new Promise<void>((over, failed) => {
    exchange(core, agent, call, over).then((res) => {
      try {
        respond(res);
      } catch (err) {
        // The answer could not be written (the client is gone): the body is let go, which ends the exchange.
        void res.body?.cancel(err).catch(() => undefined);
        failed(err);
      }
    }, failed);
  });
}

/** The response, its body watched until it is over (`done`, once); a failure before the response rejects without `done`. */
async function exchange(core: ProxyCore, agent: ResolvedAgent, call: ForwardCall, done: () => void): Promise<Response> {
  const { requestId } = call;
  const max = agent.limits.maxBodyBytes;
  const limit = { exceeded: false };
  const hasBody = call.body !== null && call.method !== "GET" && call.method !== "HEAD";
  // The response timeout covers the wait for the agent's headers only; the client's own signal covers the rest.
  const abort = new AbortController();
  const onClientAbort = () => abort.abort(call.clientSignal?.reason);
  call.clientSignal?.addEventListener("abort", onClientAbort, { once: true });
  let finished = false;
  const finish = () => {
    if (finished) return;
    finished = true;
    call.clientSignal?.removeEventListener("abort", onClientAbort);
  };
  const over = () => {
    finish();
    done();
  };
  const init: RequestInit & { duplex?: "half" } = { method: call.method, headers: call.headers, signal: abort.signal };
  if (hasBody) {
    init.body = limitBody(call.body!, max, limit);
    init.duplex = "half";
  }
  const upstreamReq = new Request(new URL(call.pathInside, "http://agent"), init);
  const { responseTimeoutMs: timeoutMs, proxyIdleTimeoutMs } = agent.limits;
  // A fleet whose hosts apply the timeouts (they see the VM doze: that time counts towards neither) gets the limits
  // and no timer is set here; otherwise they are this side's.
  const byHost = core.fleet.appliesLimits === true;
  const timer = byHost
    ? undefined
    : setTimeout(() => abort.abort(new AppError("gateway_timeout", `agent ${agent.row.id} sent no response within ${timeoutMs} ms`)), timeoutMs);
  const ctx = {
    requestId,
    reason: "request" as const,
    signal: abort.signal,
    ...(byHost ? { limits: { responseTimeoutMs: timeoutMs, proxyIdleTimeoutMs } } : {}),
  };
  let res: Response;
  try {
    res = await core.fleet.forward(agent.spec, upstreamReq, ctx);
  } catch (err) {
    finish();
    if (limit.exceeded) throw new AppError("payload_too_large", `request body exceeds the limit of ${max} bytes`);
    if (abort.signal.reason instanceof AppError) throw abort.signal.reason;
    throw err;
  } finally {
    clearTimeout(timer);
  }
  const out = withoutHopByHop(res.headers);
  out.set("x-request-id", requestId);
  if (!res.body) {
    over();
    return new Response(null, { status: res.status, statusText: res.statusText, headers: out });
  }
  return new Response(watchBody(res.body, byHost ? undefined : proxyIdleTimeoutMs, over, core, requestId, agent.row.id), {
    status: res.status,
    statusText: res.statusText,
    headers: out,
  });
}

/** Passes the body through, failing the upload once it grows past `max` bytes (bodies without a length). */
function limitBody(body: ReadableStream<Uint8Array>, max: number, state: { exceeded: boolean }): ReadableStream<Uint8Array> {
  let seen = 0;
  return body.pipeThrough(
    new TransformStream<Uint8Array, Uint8Array>({
      transform(chunk, controller) {
        seen += chunk.byteLength;
        if (seen > max) {
          state.exceeded = true;
          controller.error(new AppError("payload_too_large", `request body exceeds the limit of ${max} bytes`));
          return;
        }
        controller.enqueue(chunk);
      },
    }),
  );
}

/** The response body as it flows out: ended after `idleMs` without a byte (undefined: the host does it), and `done` once it ends however it ends. */
function watchBody(
  body: ReadableStream<Uint8Array>,
  idleMs: number | undefined,
  done: () => void,
  core: ProxyCore,
  requestId: string,
  agentId: string,
): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  let timer: ReturnType<typeof setTimeout> | undefined;
  let finished = false;
  const finish = () => {
    if (finished) return;
    finished = true;
    if (timer) clearTimeout(timer);
    done();
  };
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        if (timer) clearTimeout(timer);
        if (idleMs !== undefined)
          timer = setTimeout(() => {
            core.log.warn("stream idle timeout: ended", { requestId, agentId, limitMs: idleMs });
            void reader.cancel(new Error("stream idle timeout")).catch(() => undefined);
            try {
              controller.error(new Error("stream idle timeout"));
            } catch {
              /* already closed */
            }
            finish();
          }, idleMs);
        try {
          const next = await reader.read();
          if (next.done) {
            finish();
            controller.close();
            return;
          }
          controller.enqueue(next.value);
        } catch (err) {
          finish();
          controller.error(err);
        }
      },
      cancel(reason) {
        finish();
        return reader.cancel(reason);
      },
    },
    { highWaterMark: 0 },
  );
}

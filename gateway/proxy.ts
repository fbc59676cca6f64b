// A call to an agent through the Hono app (the Worker entry, app.request tests): resolve, authorize, then stream through the fleet.
//
// The Node entry takes the fast path (gateway/fast-path/) for the same traffic; both apply the rules of
// proxy-core.ts and proxy-policy.ts, so an answer does not depend on the entry that gave it.
import type { Context } from "hono";
import { AppError } from "../lib/errors.ts";
import type { GatewayEnv } from "./auth-context.ts";
import type { ProxyCore } from "./proxy-core.ts";
import { upstreamRequestHeaders, withoutHopByHop } from "./proxy-headers.ts";

export interface ProxyRouteDeps {
  core: ProxyCore;
  /** The client's address as the runtime sees it (for X-Forwarded-For). */
  clientIp?: ((c: Context<GatewayEnv>) => string | undefined) | undefined;
}

export async function proxyToAgent(deps: ProxyRouteDeps, c: Context<GatewayEnv>, agentId: string, pathInside: string): Promise<Response> {
  const { core } = deps;
  const agent = await core.resolve(agentId);
  const caller = c.get("caller");
  core.authorize(agent, caller);

  const raw = c.req.raw;
  const requestId = c.get("requestId");
  const incomingUrl = new URL(raw.url);
  const answer = await core.nonWaking(agent, raw.method, pathInside + incomingUrl.search, raw.headers.get("user-agent") ?? undefined, requestId);
  if (answer) return new Response(answer.status === 204 ? null : answer.body, { status: answer.status, headers: answer.headers });

  core.checkDeclaredBody(agent, raw.headers.get("content-length"));
  const max = agent.limits.maxBodyBytes;
  const headers = upstreamRequestHeaders(
    raw.headers,
    { clientIp: deps.clientIp?.(c), proto: incomingUrl.protocol.replace(":", ""), host: raw.headers.get("host") ?? incomingUrl.host, requestId },
    { stripAuthorization: caller !== undefined },
  );
  headers.delete("host");
  if ((raw.headers.get("upgrade") ?? "").toLowerCase() === "websocket") {
    // Node takes upgrades on its fast path; here (Workers) the host relays the socket and the runtime joins it to ours.
    if (!core.fleet.upgradeFetch) throw new AppError("bad_gateway", "this entry does not relay WebSocket upgrades");
    const leave = core.enter(agent);
    try {
      const upgrade = new Request(new URL(pathInside + incomingUrl.search, "http://agent"), { method: "GET", headers });
      const { proxyIdleTimeoutMs, responseTimeoutMs } = agent.limits;
      return await core.fleet.upgradeFetch(agent.spec, upgrade, { requestId, reason: "request", proxyIdleTimeoutMs, responseTimeoutMs });
    } finally {
      leave(); // the tenant's slot covers the handshake, as on the Node entry
    }
  }
  const limit = { exceeded: false };
  const hasBody = raw.body !== null && raw.method !== "GET" && raw.method !== "HEAD";
  // The response timeout covers the wait for the agent's headers only; the client's own signal covers the rest.
  const abort = new AbortController();
  const onClientAbort = () => abort.abort(raw.signal.reason);
  raw.signal.addEventListener("abort", onClientAbort, { once: true });
  const init: RequestInit & { duplex?: "half" } = { method: raw.method, headers, signal: abort.signal };
  if (hasBody) {
    init.body = limitBody(raw.body!, max, limit);
    init.duplex = "half";
  }
  const upstreamReq = new Request(new URL(pathInside + incomingUrl.search, "http://agent"), init);

  const leave = core.enter(agent);
  const timeoutMs = agent.limits.responseTimeoutMs;
  const timer = setTimeout(() => abort.abort(new AppError("gateway_timeout", `agent ${agent.row.id} sent no response within ${timeoutMs} ms`)), timeoutMs);
  let res: Response;
  try {
    res = await core.fleet.forward(agent.spec, upstreamReq, { requestId, reason: "request", signal: abort.signal });
  } catch (err) {
    leave();
    raw.signal.removeEventListener("abort", onClientAbort);
    if (limit.exceeded) throw new AppError("payload_too_large", `request body exceeds the limit of ${max} bytes`);
    if (abort.signal.reason instanceof AppError) throw abort.signal.reason;
    throw err;
  } finally {
    clearTimeout(timer);
  }
  const out = withoutHopByHop(res.headers);
  out.set("x-request-id", requestId);
  const done = () => {
    leave();
    raw.signal.removeEventListener("abort", onClientAbort);
  };
  if (!res.body) {
    done();
    return new Response(null, { status: res.status, statusText: res.statusText, headers: out });
  }
  return new Response(watchBody(res.body, agent.limits.proxyIdleTimeoutMs, done, core, requestId, agent.row.id), { status: res.status, statusText: res.statusText, headers: out });
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

/** The response body as it flows out: ended after `idleMs` without a byte, and `done` once it ends however it ends. */
function watchBody(body: ReadableStream<Uint8Array>, idleMs: number, done: () => void, core: ProxyCore, requestId: string, agentId: string): ReadableStream<Uint8Array> {
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

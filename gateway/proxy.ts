// A call to an agent: resolve and authorize it, then stream the request in and the response out through the fleet.
import type { Context } from "hono";
import { AppError } from "../lib/errors.ts";
import { isId } from "../lib/ids.ts";
import { agentSpec } from "./agent-repo.ts";
import type { GatewayDeps } from "./app.ts";
import type { GatewayEnv } from "./auth-context.ts";
import { upstreamRequestHeaders, withoutHopByHop } from "./proxy-headers.ts";

export async function proxyToAgent(deps: GatewayDeps, c: Context<GatewayEnv>, agentId: string, pathInside: string): Promise<Response> {
  if (!isId("agent", agentId)) throw new AppError("invalid_id", `"${agentId.slice(0, 64)}" is not an agent id`);
  const row = await deps.agents.get(agentId);
  if (!row) throw new AppError("not_found", `agent ${agentId} not found`);
  const caller = c.get("caller");
  if (!row.public) {
    if (!caller) throw new AppError("unauthorized", "missing bearer token");
    // Another tenant's agent does not exist as far as this caller can tell.
    if (caller.tenantId !== row.tenantId) throw new AppError("not_found", `agent ${agentId} not found`);
    if (!caller.scopes.has("agents:invoke")) throw new AppError("forbidden", "token lacks the agents:invoke scope");
  }

  const raw = c.req.raw;
  const max = deps.config.maxBodyBytes;
  const declared = Number(raw.headers.get("content-length") ?? "0");
  if (declared > max) throw new AppError("payload_too_large", `request body of ${declared} bytes exceeds the limit of ${max} bytes`);

  const requestId = c.get("requestId");
  const incomingUrl = new URL(raw.url);
  const headers = upstreamRequestHeaders(
    raw.headers,
    { clientIp: deps.clientIp?.(c), proto: incomingUrl.protocol.replace(":", ""), host: raw.headers.get("host") ?? incomingUrl.host, requestId },
    { stripAuthorization: caller !== undefined },
  );
  headers.delete("host");
  const limit = { exceeded: false };
  const hasBody = raw.body !== null && raw.method !== "GET" && raw.method !== "HEAD";
  const init: RequestInit & { duplex?: "half" } = { method: raw.method, headers };
  if (hasBody) {
    init.body = limitBody(raw.body!, max, limit);
    init.duplex = "half";
  }
  const upstreamReq = new Request(new URL(pathInside + incomingUrl.search, "http://agent"), init);

  let res: Response;
  try {
    res = await deps.fleet.forward(agentSpec(row), upstreamReq, { requestId, reason: "request", signal: raw.signal });
  } catch (err) {
    if (limit.exceeded) throw new AppError("payload_too_large", `request body exceeds the limit of ${max} bytes`);
    throw err;
  }
  const out = withoutHopByHop(res.headers);
  out.set("x-request-id", requestId);
  return new Response(res.body, { status: res.status, statusText: res.statusText, headers: out });
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

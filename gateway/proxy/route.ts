// A call to an agent through the Hono app (the Worker, `app.request` tests): resolve, authorize, then forward (forward.ts).
//
// A Node gateway takes its fast path (gateway/node/fast-path/) for the same traffic; both apply the rules of
// core.ts and policy.ts, so an answer does not depend on the entry that gave it.
import type { Context } from "hono";
import { AppError } from "../../lib/errors.ts";
import { proxiedCalls } from "../../lib/metrics.ts";
import type { GatewayEnv } from "../../contracts/caller.ts";
import type { ProxyCore } from "./core.ts";
import { upstreamRequestHeaders } from "../../lib/http-headers.ts";
import { forwardCall } from "./forward.ts";

export interface ProxyRouteDeps {
  core: ProxyCore;
  /** The client's address as the runtime sees it (for X-Forwarded-For). */
  clientIp?: ((c: Context<GatewayEnv>) => string | undefined) | undefined;
}

/** Every call this entry answers is counted once, by the status it gets (a thrown error's, as the app renders it). */
export async function proxyToAgent(deps: ProxyRouteDeps, c: Context<GatewayEnv>, agentId: string, pathInside: string): Promise<Response> {
  const counted = proxiedCalls(deps.core.metrics);
  try {
    const res = await answerCall(deps, c, agentId, pathInside);
    counted(res.status);
    return res;
  } catch (err) {
    counted(err instanceof AppError ? err.status : 500);
    throw err;
  }
}

async function answerCall(deps: ProxyRouteDeps, c: Context<GatewayEnv>, agentId: string, pathInside: string): Promise<Response> {
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
  const leave = core.enter(agent);
  return forwardCall(core, agent, { method: raw.method, pathInside: pathInside + incomingUrl.search, headers, body: raw.body, requestId, clientSignal: raw.signal, done: leave });
}

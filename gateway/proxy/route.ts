// A call to an agent through the Hono app (the Worker, `app.request` tests): admitted (admission.ts), then forwarded (forward.ts).
//
// A Node gateway takes its fast path (gateway/node/fast-path/) for the same traffic; both are admitted by the same
// admission over the rules of core.ts and policy.ts, so an answer does not depend on the entry that gave it.
import type { Context } from "hono";
import { AppError } from "../../lib/errors.ts";
import { proxiedCalls } from "../../lib/metrics.ts";
import type { GatewayEnv } from "../../contracts/caller.ts";
import type { ProxyCore } from "./core.ts";
import type { Admission, ProxyCall, ProxyEntry } from "./admission.ts";
import { upstreamRequestHeaders } from "../../lib/http-headers.ts";
import { forwardCall } from "./forward.ts";

export interface ProxyRouteDeps {
  core: ProxyCore;
  admission: Admission;
  /** The client's address as the runtime sees it (for X-Forwarded-For). */
  clientIp?: ((c: Context<GatewayEnv>) => string | undefined) | undefined;
}

/** A call of this entry: the request, and the answer the app is waiting for. */
interface HonoCall extends ProxyCall {
  c: Context<GatewayEnv>;
  raw: Request;
  incomingUrl: URL;
  respond: (res: Response) => void;
  refuse: (err: unknown) => void;
}

/**
 * The app's handler of agent traffic. Every call it answers is counted once, by the status it gets (a thrown error's,
 * as the app renders it).
 */
export function agentProxy(deps: ProxyRouteDeps): (c: Context<GatewayEnv>, agentId: string, pathInside: string) => Promise<Response> {
  const entry = honoEntry(deps);
  const counted = proxiedCalls(deps.core.metrics);
  return async (c, agentId, pathInside) => {
    try {
      const res = await answerCall(deps.admission, entry, c, agentId, pathInside);
      counted(res.status);
      return res;
    } catch (err) {
      counted(err instanceof AppError ? err.status : 500);
      throw err;
    }
  };
}

function answerCall(admission: Admission, entry: ProxyEntry<HonoCall>, c: Context<GatewayEnv>, agentId: string, pathInside: string): Promise<Response> {
  const raw = c.req.raw;
  const incomingUrl = new URL(raw.url);
  return new Promise<Response>((respond, refuse) => {
    admission.admit<HonoCall>(
      {
        agentId,
        method: raw.method,
        pathInside: pathInside + incomingUrl.search,
        authorization: raw.headers.get("authorization") ?? undefined,
        userAgent: raw.headers.get("user-agent") ?? undefined,
        contentLength: raw.headers.get("content-length"),
        requestId: c.get("requestId"),
        upgrade: (raw.headers.get("upgrade") ?? "").toLowerCase() === "websocket",
        c,
        raw,
        incomingUrl,
        respond,
        refuse,
      },
      entry,
    );
  });
}

/** What this entry does with an admitted call: answers as web Responses, forwards through `Fleet.forward` (or `upgradeFetch`). */
function honoEntry(deps: ProxyRouteDeps): ProxyEntry<HonoCall> {
  const { core } = deps;
  return {
    // Node takes upgrades on its fast path; here (Workers) the host relays the socket and the runtime joins it to ours.
    get relaysUpgrades() {
      return core.fleet.upgradeFetch !== undefined;
    },
    answer(call, answer) {
      call.respond(new Response(answer.status === 204 ? null : answer.body, { status: answer.status, headers: answer.headers }));
    },
    fail(call, err) {
      call.refuse(err);
    },
    forward(call, agent, caller) {
      const { raw, incomingUrl, requestId } = call;
      const headers = upstreamRequestHeaders(
        raw.headers,
        { clientIp: deps.clientIp?.(call.c), proto: incomingUrl.protocol.replace(":", ""), host: raw.headers.get("host") ?? incomingUrl.host, requestId },
        { stripAuthorization: caller !== undefined },
      );
      headers.delete("host");
      if (call.upgrade) {
        // The tenant's slot covers the handshake, as on the Node entry.
        const upgrade = new Request(new URL(call.pathInside, "http://agent"), { method: "GET", headers });
        const { proxyIdleTimeoutMs, responseTimeoutMs } = agent.limits;
        return core.fleet.upgradeFetch!(agent.spec, upgrade, { requestId, reason: "request", proxyIdleTimeoutMs, responseTimeoutMs }).then(call.respond);
      }
      return forwardCall(
        core,
        agent,
        { method: raw.method, pathInside: call.pathInside, headers, body: raw.body, requestId, clientSignal: raw.signal },
        call.respond,
      );
    },
  };
}

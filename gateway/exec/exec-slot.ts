// The scope of an exec route's tenant slot: the slot its handler took (the proxy's TenantLimiter) is given back when its answer is over.
//
// Calls to an agent and its exec, files and processes routes count against the same per-tenant limit (the proxy
// core's limiter, shared with the Node fast path). A handler takes its slot once it knows the agent (routes.ts
// `target`); this middleware, around the handler, gives it back: at once for an error or an answer without a body,
// else when the answer's body ends, fails, or is cancelled (the client went away), or when the request is aborted.
import type { Context, MiddlewareHandler } from "hono";
import type { GatewayEnv } from "../../contracts/caller.ts";

/** Where a handler leaves the way out of the slot it took, for the scope to take back. */
export type SlotLeaves = WeakMap<Context<GatewayEnv>, () => void>;

export function tenantSlotScope(slots: SlotLeaves): MiddlewareHandler<GatewayEnv> {
  return async (c, next) => {
    let answered = false;
    try {
      await next();
      answered = true;
    } finally {
      const leave = slots.get(c);
      if (leave) {
        slots.delete(c);
        const body = answered && c.res.status < 400 ? c.res.body : null;
        if (!body) leave();
        else {
          c.req.raw.signal.addEventListener("abort", leave, { once: true });
          const res = c.res;
          c.res = new Response(leaving(body, leave), { status: res.status, statusText: res.statusText, headers: res.headers });
        }
      }
    }
  };
}

/** The body as it is, `leave` called once it ended, failed or was cancelled. */
function leaving(body: ReadableStream<Uint8Array>, leave: () => void): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        let next: ReadableStreamReadResult<Uint8Array>;
        try {
          next = await reader.read();
        } catch (err) {
          leave();
          controller.error(err);
          return;
        }
        if (next.done) {
          leave();
          controller.close();
        } else controller.enqueue(next.value);
      },
      cancel(reason) {
        leave();
        return reader.cancel(reason);
      },
    },
    { highWaterMark: 0 },
  );
}

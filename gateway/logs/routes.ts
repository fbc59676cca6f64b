// `GET /v1/agents/{id}/logs`: an agent's log (console + workload output), its tail and with `follow` what it writes next, as text or Server-Sent Events; reading it never wakes the agent.
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import { apiRouter, errors, z } from "../../lib/api.ts";
import { AppError } from "../../lib/errors.ts";
import type { LogReadOptions } from "../../contracts/fleet.ts";
import { requireScope, scopeGate, type GatewayEnv } from "../../contracts/caller.ts";
import { ownAgent } from "../agents/repo.ts";
import type { GatewayDeps } from "../deps.ts";
import { AgentParams } from "../agents/api-schemas.ts";

/** What `tail` is when the request does not say: the last 64 KiB. */
export const defaultLogTailBytes = 64 << 10;
/** The largest `tail` asked for, bytes (a host keeps at most two generations of its log limit anyway). */
export const maxLogTailBytes = 1 << 30;

export interface LogRouteOptions {
  /** An event stream sends a comment this often, so proxies on the way do not take a quiet follow for a dead one, ms. */
  keepaliveMs?: number;
  /** A follow of an agent that has not run anywhere yet asks again this often, ms. */
  retryMs?: number;
}

const tailMessage = `must be a number of bytes from 0 to ${maxLogTailBytes}`;
/** `tail`: a number of bytes from 0 to maxLogTailBytes, digits only; absent or empty: defaultLogTailBytes. */
const TailParam = z
  .string()
  .regex(/^\d{0,10}$/, { error: tailMessage })
  .refine((raw) => Number(raw) <= maxLogTailBytes, { error: tailMessage })
  .optional()
  .openapi({ description: `Bytes from the end of the log to start with (default ${defaultLogTailBytes}, at most ${maxLogTailBytes})`, example: "65536" });

/** `follow`: true, false, 1 or 0; absent or empty: false. */
const FollowParam = z
  .enum(["true", "false", "1", "0", ""], { error: "must be true or false" })
  .optional()
  .openapi({ description: "Go on with what the agent writes next, until the client goes away (default false)" });

const LogQuery = z.strictObject({ tail: TailParam, follow: FollowParam });

const logsRoute = createRoute({
  method: "get",
  path: "/v1/agents/{id}/logs",
  operationId: "getAgentLogs",
  summary: "An agent's log (console + workload output): its tail, and with follow what it writes next; never wakes the agent",
  description: "Plain text, or Server-Sent Events (one `data:` event per line, keep-alive comments while following) when `Accept: text/event-stream`.",
  tags: ["agents"],
  middleware: [scopeGate("agents:admin")],
  request: { params: AgentParams, query: LogQuery },
  responses: {
    200: {
      description: "The log",
      content: {
        "text/plain": { schema: z.string().openapi({ description: "The log's bytes as written" }) },
        "text/event-stream": { schema: z.string().openapi({ description: "One `data: <line>` event per line; `: keepalive` comments while following" }) },
      },
    },
    ...errors(400, 404),
  },
});

export function logRoutes(deps: Pick<GatewayDeps, "agents" | "fleet">, opts: LogRouteOptions = {}): OpenAPIHono<GatewayEnv> {
  const r = apiRouter<GatewayEnv>();
  const keepaliveMs = opts.keepaliveMs ?? 15_000;
  const retryMs = opts.retryMs ?? 1000;

  r.openapi(logsRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const q = c.req.valid("query");
    const row = await ownAgent(deps.agents, caller, c.req.valid("param").id);
    const read: LogReadOptions = { tailBytes: tailBytes(q.tail), follow: q.follow === "true" || q.follow === "1", signal: c.req.raw.signal };
    const sse = /\btext\/event-stream\b/i.test(c.req.header("accept") ?? "");
    const found = await deps.fleet.logs(row.id, read);
    // No host has the agent (it never ran): no log yet. A follow waits for its first run, as it would for its next output.
    const source = found ?? (read.follow ? lateLog(() => deps.fleet.logs(row.id, read), retryMs, read.signal) : emptyStream());
    const headers = new Headers({ "cache-control": "no-store", "x-content-type-options": "nosniff" });
    if (!sse) {
      headers.set("content-type", "text/plain; charset=utf-8");
      return new Response(source, { headers });
    }
    headers.set("content-type", "text/event-stream; charset=utf-8");
    headers.set("x-accel-buffering", "no"); // a buffering proxy in front would hold events back
    return new Response(logEventStream(source, read.follow ? keepaliveMs : 0), { headers });
  });

  return r;
}

function tailBytes(raw: string | undefined): number {
  return raw === undefined || raw === "" ? defaultLogTailBytes : Number(raw);
}

/** `tail` as the route reads it (the same schema); 400 for anything else. */
export function parseTail(raw: string | undefined): number {
  if (!TailParam.safeParse(raw).success) throw new AppError("bad_request", `tail ${tailMessage}`);
  return tailBytes(raw);
}

/** `follow` as the route reads it (the same schema); 400 for anything else. */
export function parseFollow(raw: string | undefined): boolean {
  const parsed = FollowParam.safeParse(raw);
  if (!parsed.success) throw new AppError("bad_request", "follow must be true or false");
  return parsed.data === "true" || parsed.data === "1";
}

/**
 * The log as Server-Sent Events: one event per line (ended by LF, CRLF or CR; the end of the stream ends the last),
 * its text in one `data:` field; a line is sent once it has ended. With `keepaliveMs`, a comment that often.
 */
export function logEventStream(source: ReadableStream<Uint8Array>, keepaliveMs: number): ReadableStream<Uint8Array> {
  const reader = source.getReader();
  const decoder = new TextDecoder();
  const encoder = new TextEncoder();
  let pending = "";
  let timer: ReturnType<typeof setInterval> | undefined;
  const stop = () => {
    if (timer !== undefined) clearInterval(timer);
    timer = undefined;
  };
  const events = (lines: string[]) => encoder.encode(lines.map((line) => `data: ${line}\n\n`).join(""));
  return new ReadableStream<Uint8Array>(
    {
      start(controller) {
        if (keepaliveMs <= 0) return;
        timer = setInterval(() => {
          try {
            controller.enqueue(encoder.encode(": keepalive\n\n"));
          } catch {
            stop(); // closed meanwhile
          }
        }, keepaliveMs);
      },
      async pull(controller) {
        for (;;) {
          let next: ReadableStreamReadResult<Uint8Array>;
          try {
            next = await reader.read();
          } catch (err) {
            stop();
            throw err;
          }
          if (next.done) {
            const lines = splitLines(pending + decoder.decode());
            if (lines.rest !== "") lines.complete.push(lines.rest);
            stop();
            if (lines.complete.length > 0) controller.enqueue(events(lines.complete));
            return controller.close();
          }
          let text = pending + decoder.decode(next.value, { stream: true });
          // A CR at the end may be the first half of a CRLF: it waits for the next chunk.
          const heldCr = text.endsWith("\r");
          if (heldCr) text = text.slice(0, -1);
          const lines = splitLines(text);
          pending = lines.rest + (heldCr ? "\r" : "");
          if (lines.complete.length > 0) return controller.enqueue(events(lines.complete));
        }
      },
      cancel(reason) {
        stop();
        return reader.cancel(reason);
      },
    },
    { highWaterMark: 0 },
  );
}

function splitLines(text: string): { complete: string[]; rest: string } {
  const parts = text.split(/\r\n|\r|\n/);
  const rest = parts.pop() ?? "";
  return { complete: parts, rest };
}

/** A log that is not there yet: asked for every `retryMs` until it is, then passed through; ends when `signal` aborts. */
function lateLog(open: () => Promise<ReadableStream<Uint8Array> | undefined>, retryMs: number, signal: AbortSignal | undefined): ReadableStream<Uint8Array> {
  let inner: ReadableStreamDefaultReader<Uint8Array> | undefined;
  let cancelled = false;
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        while (!inner) {
          if (cancelled) return;
          if (signal?.aborted) return controller.close();
          await new Promise<void>((resolve) => {
            const timer = setTimeout(done, retryMs);
            function done() {
              clearTimeout(timer);
              signal?.removeEventListener("abort", done);
              resolve();
            }
            signal?.addEventListener("abort", done, { once: true });
          });
          if (cancelled) return;
          if (signal?.aborted) return controller.close();
          inner = (await open())?.getReader();
        }
        const next = await inner.read();
        if (next.done) controller.close();
        else controller.enqueue(next.value);
      },
      cancel(reason) {
        cancelled = true;
        return inner?.cancel(reason);
      },
    },
    { highWaterMark: 0 },
  );
}

function emptyStream(): ReadableStream<Uint8Array> {
  return new ReadableStream<Uint8Array>({ start: (controller) => controller.close() });
}

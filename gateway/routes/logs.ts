// `GET /v1/agents/{id}/logs`: an agent's log (console + workload output), its tail and with `follow` what it writes next, as text or Server-Sent Events; reading it never wakes the agent.
import { Hono } from "hono";
import { AppError } from "../../lib/errors.ts";
import type { Fleet, LogReadOptions } from "../../contracts/fleet.ts";
import { requireScope, type GatewayEnv } from "../../contracts/caller.ts";
import { ownAgent } from "../agent-repo.ts";
import type { GatewayDeps } from "../deps.ts";

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

export function logRoutes(deps: Pick<GatewayDeps, "agents" | "fleet">, opts: LogRouteOptions = {}): Hono<GatewayEnv> {
  const r = new Hono<GatewayEnv>();
  const keepaliveMs = opts.keepaliveMs ?? 15_000;
  const retryMs = opts.retryMs ?? 1000;

  r.get("/v1/agents/:id/logs", async (c) => {
    const row = await ownAgent(deps.agents, requireScope(c, "agents:admin"), c.req.param("id") ?? "");
    const read: LogReadOptions = { tailBytes: parseTail(c.req.query("tail")), follow: parseFollow(c.req.query("follow")), signal: c.req.raw.signal };
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

/** `tail`: a number of bytes from 0 to maxLogTailBytes; absent: defaultLogTailBytes. */
export function parseTail(raw: string | undefined): number {
  if (raw === undefined || raw === "") return defaultLogTailBytes;
  const n = /^\d{1,10}$/.test(raw) ? Number(raw) : NaN;
  if (!(n <= maxLogTailBytes)) throw new AppError("bad_request", `tail must be a number of bytes from 0 to ${maxLogTailBytes}`);
  return n;
}

/** `follow`: true, false, 1 or 0; absent: false. */
export function parseFollow(raw: string | undefined): boolean {
  if (raw === undefined || raw === "" || raw === "false" || raw === "0") return false;
  if (raw === "true" || raw === "1") return true;
  throw new AppError("bad_request", "follow must be true or false");
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

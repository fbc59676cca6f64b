// `agentvm logs ID [-f] [--tail BYTES]` (the agent's console and workload output) and `agentvm events ID` (its VM event log).
import type { Command } from "commander";
import type { components } from "../contracts/api/types.ts";
import { ok } from "./client.ts";
import { contextOf } from "./context.ts";
import { parseDuration } from "./duration.ts";
import { exitCodes } from "./exit.ts";
import { integer } from "./options.ts";
import { shortTime } from "./agents.ts";

type AgentEvent = components["schemas"]["AgentEvent"];

/** Writes to stdout, waiting when the reader is slower than the log. */
async function write(chunk: Uint8Array | string): Promise<void> {
  if (!process.stdout.write(chunk)) await new Promise((resolve) => process.stdout.once("drain", resolve));
}

/** The lines of a Server-Sent Events stream's `data:` fields, one event at a time (comments and other fields skipped). */
export async function* sseData(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  let buffer = "";
  let data: string[] = [];
  const take = (line: string): string | undefined => {
    if (line === "") {
      const event = data.length ? data.join("\n") : undefined;
      data = [];
      return event;
    }
    if (line.startsWith("data:")) data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
    return undefined;
  };
  for await (const chunk of body) {
    buffer += decoder.decode(chunk, { stream: true });
    const lines = buffer.split(/\r\n|\r|\n/);
    buffer = lines.pop() ?? "";
    for (const line of lines) {
      const event = take(line);
      if (event !== undefined) yield event;
    }
  }
  const last = take(buffer + decoder.decode());
  if (last !== undefined) yield last;
  const end = take("");
  if (end !== undefined) yield end;
}

/** `--since 1h` is an hour ago; an ISO-8601 instant passes as it is (the API checks it). */
export function instantOption(raw: string, now: () => number = Date.now): string {
  if (/^\d/.test(raw) && !/^\d{4}-/.test(raw)) return new Date(now() - parseDuration(raw, "--since/--until")).toISOString();
  return raw;
}

export function logsCommand(program: Command): void {
  program
    .command("logs")
    .description("an agent's log (console and workload output); reading it never wakes the agent")
    .argument("<id>", "the agent's id")
    .option("-f, --follow", "go on with what it writes next, until Ctrl-C")
    .option("--tail <bytes>", "start this many bytes before the end (default 65536)", integer(0, 2 ** 30))
    .addHelpText("after", '\nWith --json, one JSON object a line: {"line": "…"} (the API\'s Server-Sent Events).')
    .action(async (id: string, o: { follow?: boolean; tail?: number }, cmd: Command) => {
      const ctx = contextOf(cmd);
      const api = ctx.api();
      const abort = new AbortController();
      // Ctrl-C is how a follow is meant to end: a success. `on`, not `once`: a terminal's Ctrl-C can arrive twice (once
      // from the terminal, once passed on by bin/agentvm.js on a Node that re-executes), and the second must not kill.
      for (const signal of ["SIGINT", "SIGTERM"] as const) {
        process.on(signal, () => {
          abort.abort();
          process.exit(exitCodes.ok);
        });
      }
      const sse = ctx.json || o.follow === true;
      const query = { ...(o.tail !== undefined ? { tail: String(o.tail) } : {}), ...(o.follow ? { follow: "true" as const } : {}) };
      const body = ok(
        await api.GET("/v1/agents/{id}/logs", {
          params: { path: { id }, query },
          // A follow always reads Server-Sent Events: their keep-alive comments keep a quiet log's connection alive through
          // the HTTP client's body timeout (undici: 300 s) and any proxy between, where plain text has nothing to send.
          headers: { accept: sse ? "text/event-stream" : "text/plain" },
          parseAs: "stream",
          signal: abort.signal,
        }),
      );
      if (!body) return;
      if (ctx.json) for await (const line of sseData(body)) await write(`${JSON.stringify({ line })}\n`);
      else if (sse) for await (const line of sseData(body)) await write(`${line}\n`);
      else for await (const chunk of body) await write(chunk);
      if (o.follow) process.stderr.write("logs: the gateway ended the stream\n");
    });
}

export function eventsCommand(program: Command): void {
  program
    .command("events")
    .description("an agent's VM event log: every state change with its reason and timings, newest first")
    .argument("<id>", "the agent's id")
    .option("--since <when>", "only events at or after this: an ISO-8601 instant, or a duration ago (1h, 30m)")
    .option("--until <when>", "only events before this (same forms)")
    .option("--limit <n>", "at most this many events", integer(1, 1_000_000))
    .action(async (id: string, o: { since?: string; until?: string; limit?: number }, cmd: Command) => {
      const ctx = contextOf(cmd);
      const api = ctx.api();
      const range = { ...(o.since ? { since: instantOption(o.since) } : {}), ...(o.until ? { until: instantOption(o.until) } : {}) };
      const listed = await ctx.all(async (cursor, limit) => {
        const page = ok(await api.GET("/v1/agents/{id}/events", { params: { path: { id }, query: { ...range, limit, ...(cursor ? { cursor } : {}) } } }));
        return { items: page.events, nextCursor: page.nextCursor };
      }, o.limit);
      if (ctx.json) return ctx.printJson({ events: listed.items, nextCursor: listed.nextCursor });
      ctx.printTable(
        [{ header: "AT" }, { header: "FROM" }, { header: "TO" }, { header: "REASON" }, { header: "RUN" }, { header: "TIMINGS", shrink: true }],
        listed.items.map((e: AgentEvent) => [
          shortTime(e.at),
          e.fromState,
          e.toState,
          e.reason,
          e.runId ?? "",
          Object.entries(e.timings ?? {})
            .map(([k, v]) => (typeof v === "number" ? `${k.replace(/Ms$/, "")}=${Math.round(v)}` : `${k}=${v}`))
            .join(" "),
        ]),
      );
    });
}

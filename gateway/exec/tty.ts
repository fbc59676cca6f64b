// An interactive command on a terminal inside an agent (`GET /v1/agents/{id}/exec/tty`, a WebSocket): scope agents:exec, audited as agent.exec with tty.
//
// Runtime-free: the runtime that can take a WebSocket (the Node gateway: gateway/node/exec-tty.ts) puts a
// `TtyAcceptor` in the request's env; the route checks the caller, the agent and the handshake, starts the command on
// the exec server (Fleet.forward, target `exec`: the agent woken and held, the request body streaming the terminal's
// input while its output streams back) and only then accepts the socket, so every refusal is a plain HTTP answer with
// the error envelope. A runtime without an acceptor (a Worker) answers 501.
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import type { Context } from "hono";
import { apiRouter, errors, z } from "../../lib/api.ts";
import { AppError, renderError } from "../../lib/errors.ts";
import { requireScope, scopeGate, type GatewayEnv } from "../../contracts/caller.ts";
import { callerAction } from "../../schema/audit-log.ts";
import { AgentParams } from "../agents/api-schemas.ts";
import type { ProxyCore } from "../proxy/core.ts";
import type { GatewayDeps } from "../deps.ts";
import { startSocketExec, type SocketExec } from "./socket-exec.ts";
import {
  encodeFrame,
  encodeSpec,
  frameDecoder,
  frameType,
  inputFrameType,
  isOldGuestTtyRefusal,
  parseExit,
  resizeFrame,
  ShortFrame,
  type ExitStatus,
  type Frame,
  type TtySize,
} from "../../contracts/exec-wire.ts";

/** A WebSocket the runtime accepted (binary messages are bytes, text messages JSON control). */
export interface TtySocket {
  /** Sends a message; false when the client's side is full (wait for `drained`). */
  send(data: Uint8Array | string): boolean;
  drained(): Promise<void>;
  /** A close frame with `code` and `reason` (at most 123 bytes), then the connection ends. */
  close(code: number, reason: string): void;
  onMessage(fn: (data: Uint8Array | string) => void): void;
  /** The connection ended (the client's close frame, or the socket gone); once. */
  onClose(fn: () => void): void;
  /** Stops reading the client while the command's input is full, and reads on. */
  pause(): void;
  resume(): void;
  /** Neither side has closed yet. */
  readonly open: boolean;
}

/** What a runtime that takes WebSockets gives the route (in the request's env under `ttyAcceptorKey`). */
export interface TtyAcceptor {
  /** Answers the handshake (`101`, with `headers`) and hands the socket over. */
  accept(headers: Record<string, string>): TtySocket;
}

export const ttyAcceptorKey = "agentvmTtyAcceptor";

/** Close codes: the command exited; the gateway (or the agent) is going away; anything else went wrong; a bad control message. */
export const ttyClose = { exited: 1000, goingAway: 1001, badMessage: 1008, error: 1011 } as const;

/** A window size the API takes (terminals beyond it do not exist). */
export const maxTtyRows = 1000;
export const maxTtyCols = 1000;
/** A closed client's command is given this long to end after its hangup (SIGHUP) before its connection is cut (SIGKILL), ms. */
const hangupGraceMs = 5_000;

const queryInt = (min: number, max: number) => {
  const message = `must be an integer from ${min} to ${max}`;
  return z
    .string({ error: message })
    .regex(/^\d{1,6}$/, { error: message })
    .transform(Number)
    .refine((n) => n >= min && n <= max, { error: message });
};
/** A query string's value (a NUL anywhere in the query was refused before any route: `refuseNul`). */
const queryText = (what: string) => z.string({ error: `must be ${what}` }).max(128 * 1024, { error: "must be at most 131072 characters" });
/** A parameter that may repeat (one value, or several). */
const many = (what: string) => z.union([queryText(what), z.array(queryText(what)).max(4096)]).optional();

export const TtyQuery = z.strictObject(
  {
    cmd: queryText("a string").min(1).optional().openapi({ description: "A command line run by `/bin/sh -c` (or give `arg`; neither: `/bin/sh`)" }),
    arg: many("a string").openapi({ description: "The argv, one `arg` each, in order (the program looked up in PATH)" }),
    rows: queryInt(1, maxTtyRows).openapi({ description: "The terminal's height", example: "24" }),
    cols: queryInt(1, maxTtyCols).openapi({ description: "The terminal's width", example: "80" }),
    env: many("NAME=VALUE").openapi({ description: "`NAME=VALUE` over the image's environment, repeated (TERM defaults to xterm-256color)" }),
    cwd: queryText("an absolute path")
      .refine((p) => p.startsWith("/") && !p.split("/").includes(".."), { error: "must be an absolute path without .. segments" })
      .optional()
      .openapi({ description: "Working directory (default: the image's)" }),
    user: z
      .string()
      .regex(/^(?:[a-z_][a-z0-9_.-]{0,31}\$?|\d{1,10}(?::\d{1,10})?)$/, { error: "must be a user name, a uid or uid:gid" })
      .optional()
      .openapi({ description: "Run as this user (name, uid or uid:gid); default: the image's user" }),
  },
  { error: "takes cmd, arg, rows, cols, env, cwd and user" },
);

const ttyRoute = createRoute({
  method: "get",
  path: "/v1/agents/{id}/exec/tty",
  operationId: "execTtyInAgent",
  summary: "Run a command on a terminal inside the agent's VM, interactively (a WebSocket)",
  description: [
    "A WebSocket upgrade (Node gateways; a Worker answers 501), with the bearer token in Authorization (a browser offers the subprotocols",
    "`agentvm.tty` and `agentvm.bearer.<token>` instead). The command starts (waking the agent, which stays awake while it runs)",
    "before the `101`: a refusal is a plain answer with the error envelope. Then binary messages are the terminal's bytes both ways;",
    'text messages are JSON control: in `{"resize":{"rows":n,"cols":n}}`, out `{"error":"…"}` (it could not start) and',
    '`{"exit":{"code":n|null,"signal":"HUP"|null,"timedOut":false,"durationMs":n}}` before the close. Close codes: 1000 it exited,',
    "1001 the gateway is going away or the agent is going to sleep, 1008 a bad control message, 1011 an error (the reason is the error envelope, cut to fit).",
    "Closing the socket hangs the command up (SIGHUP); one still running 5 s later is killed.",
  ].join(" "),
  tags: ["exec"],
  middleware: [scopeGate("agents:exec")],
  request: { params: AgentParams, query: TtyQuery },
  responses: {
    101: { description: "Switching protocols: the terminal's WebSocket" },
    ...errors(400, 404, 409, 501, 502, 504),
  },
});

/** The route, mounted by routes.ts (`execRoutes`). */
export function execTtyRoutes(deps: Pick<GatewayDeps, "fleet" | "audit" | "log">, proxy: Pick<ProxyCore, "resolve">): OpenAPIHono<GatewayEnv> {
  const r = apiRouter<GatewayEnv>();
  const { fleet, log } = deps;

  r.openapi(ttyRoute, async (c) => {
    const { id } = c.req.valid("param");
    const q = c.req.valid("query");
    const caller = requireScope(c, "agents:exec");
    const agent = await proxy.resolve(id);
    if (agent.row.tenantId !== caller.tenantId) throw new AppError("not_found", `agent ${id} not found`);
    const acceptor = acceptorOf(c);
    checkHandshake(c, acceptor);
    const args = q.arg === undefined ? [] : typeof q.arg === "string" ? [q.arg] : q.arg;
    if (q.cmd !== undefined && args.length > 0) throw new AppError("bad_request", "give cmd or arg, not both");
    const argv = q.cmd !== undefined ? ["/bin/sh", "-c", q.cmd] : args.length > 0 ? args : ["/bin/sh"];
    const env = parseEnv(q.env);
    const size: TtySize = { rows: q.rows, cols: q.cols };
    const requestId = c.get("requestId");
    const spec = encodeSpec({
      argv,
      env,
      ...(q.cwd !== undefined ? { cwd: q.cwd } : {}),
      ...(q.user !== undefined ? { user: q.user } : {}),
      timeoutMs: 0,
      tty: size,
    });

    // The terminal's input: the spec first (the request's head goes with its first bytes), then frames as typed.
    const startedAt = Date.now();
    let exec: SocketExec;
    try {
      exec = await startSocketExec(fleet, agent.spec, { spec, requestId, clientSignal: c.req.raw.signal });
    } catch (err) {
      if (err instanceof AppError && isOldGuestTtyRefusal(err.code, err.message))
        throw new AppError("guest_outdated", `agent ${id}'s guest was built before exec on a terminal; restart it to update`);
      throw err;
    }
    const { res, push, endInput } = exec;
    const wake = res.headers.get("x-wake");
    const ws = acceptor!.accept({ "x-request-id": requestId, ...(wake ? { "x-wake": wake } : {}) });
    exec.attach(ws);

    const what = { argv, cwd: q.cwd ?? null, user: q.user ?? null, env: Object.keys(env), tty: true, rows: size.rows, cols: size.cols };
    let recorded = false;
    const record = (exit: ExitStatus | undefined, error: string | undefined) => {
      if (recorded) return;
      recorded = true;
      const detail = {
        ...what,
        ...(exit ? { exitCode: exit.exitCode, signal: exit.signal, durationMs: exit.durationMs } : { exitCode: null, signal: null }),
        ...(error ? { error } : {}),
        ms: Date.now() - startedAt,
      };
      void deps.audit.record(callerAction(caller, requestId, "agent.exec", agent.spec.id, detail)).catch((err: unknown) => {
        log.error("audit record failed", { requestId, action: "agent.exec", agentId: agent.spec.id, err: err instanceof Error ? err.message : String(err) });
      });
    };

    let finished = false;
    ws.onMessage((data) => {
      if (typeof data !== "string") return push(encodeFrame(inputFrameType.data, data));
      const resize = parseControl(data);
      if (!resize) {
        ws.send(JSON.stringify({ error: 'a text message is JSON control: {"resize":{"rows":n,"cols":n}}' }));
        return ws.close(ttyClose.badMessage, "bad control message");
      }
      push(resizeFrame(resize));
    });
    const output = res.body!.pipeThrough(frameDecoder()).getReader();
    ws.onClose(() => {
      // The client hung up: so does the command (the input's end is its SIGHUP); one that outlives the grace is cut
      // (its connection to the exec server closed: SIGKILL to its group).
      endInput();
      if (finished) return;
      const timer = setTimeout(() => {
        if (finished) return;
        exec.abort(new AppError("client_gone", "the terminal's client went away"));
        void output.cancel().catch(() => undefined);
      }, hangupGraceMs);
      (timer as { unref?: () => void }).unref?.();
    });

    void pump(output, ws).then(
      ({ exit, error }) => {
        finished = true;
        record(exit, error);
        endInput();
        if (exit) {
          ws.send(JSON.stringify({ exit: { code: exit.exitCode, signal: exit.signal, timedOut: exit.timedOut, durationMs: exit.durationMs } }));
          ws.close(ttyClose.exited, "");
        } else void cut(new AppError("bad_gateway", `agent ${id}'s exec server ended the terminal's stream without its exit status`));
      },
      (err: unknown) => {
        finished = true;
        const message = err instanceof Error ? err.message : String(err);
        record(undefined, message);
        endInput();
        void cut(err instanceof AppError ? err : new AppError("bad_gateway", `the terminal's stream broke: ${message}`));
      },
    );
    /** A stream cut without an exit: 1001 when the agent is going to sleep under it (its host hibernated or moved it), else 1011. */
    async function cut(err: AppError): Promise<void> {
      if (!ws.open) return;
      const state = await fleet.status(agent.spec.id).then(
        (s) => s?.state,
        () => undefined,
      );
      log.warn("terminal stream cut", { requestId, agentId: agent.spec.id, state, err: err.message });
      if (state !== undefined && state !== "running" && state !== "dozing") {
        ws.send(JSON.stringify({ error: `agent ${id} is going to sleep (${state}): the terminal ended with it` }));
        return ws.close(ttyClose.goingAway, "the agent is hibernating");
      }
      failSocket(ws, err, requestId);
    }
    return c.body(null, 200) as never;
  });

  return r;
}

/** The output frames as messages (bytes as they come, each sent before the next is read); the exit, or none when the stream ended without one. */
async function pump(reader: ReadableStreamDefaultReader<Frame>, ws: TtySocket): Promise<{ exit: ExitStatus | undefined; error: string | undefined }> {
  const status = new ShortFrame();
  let error: string | undefined;
  for (;;) {
    const next = await reader.read();
    if (next.done) return { exit: undefined, error };
    const frame = next.value;
    if (frame.type === frameType.stdout || frame.type === frameType.stderr) {
      if (frame.payload.byteLength > 0 && !ws.send(frame.payload)) await ws.drained();
      continue;
    }
    if (frame.type !== frameType.exit && frame.type !== frameType.error) continue;
    const text = status.add(frame);
    if (text === undefined) continue;
    if (frame.type === frameType.error) {
      error = text;
      ws.send(JSON.stringify({ error: text }));
      continue;
    }
    void reader.cancel().catch(() => undefined);
    return { exit: parseExit(text), error };
  }
}

/** The envelope as a text message, then a 1011 close whose reason is the envelope cut to fit (123 bytes). */
export function failSocket(ws: TtySocket, err: AppError, requestId: string): void {
  ws.send(renderError(err, requestId).body);
  ws.close(ttyClose.error, closeReason(err));
}

/** `{"error":{"code","message"}}` within a close frame's 123 bytes (the message cut where it must be). */
export function closeReason(err: AppError): string {
  const encoder = new TextEncoder();
  let message = err.message;
  for (;;) {
    const reason = JSON.stringify({ error: { code: err.code, message } });
    if (encoder.encode(reason).byteLength <= 123 || message.length === 0) return reason;
    message = message.slice(0, Math.max(0, message.length - Math.max(1, encoder.encode(reason).byteLength - 123)));
  }
}

/** `{"resize":{"rows":n,"cols":n}}` with each in range, or undefined. */
export function parseControl(text: string): TtySize | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return undefined;
  }
  const resize = (parsed as { resize?: { rows?: unknown; cols?: unknown } } | null)?.resize;
  if (!resize || typeof resize !== "object") return undefined;
  const { rows, cols } = resize;
  const ok = (n: unknown, max: number): n is number => typeof n === "number" && Number.isInteger(n) && n >= 1 && n <= max;
  return ok(rows, maxTtyRows) && ok(cols, maxTtyCols) ? { rows, cols } : undefined;
}

export function acceptorOf(c: Context<GatewayEnv>): TtyAcceptor | undefined {
  const env = c.env as Record<string, unknown> | undefined;
  const acceptor = env?.[ttyAcceptorKey];
  return acceptor && typeof (acceptor as TtyAcceptor).accept === "function" ? (acceptor as TtyAcceptor) : undefined;
}

/** A WebSocket handshake this runtime can take: 400 for anything else, 501 where the runtime takes none (a Worker). */
export function checkHandshake(c: Context<GatewayEnv>, acceptor: TtyAcceptor | undefined): void {
  const upgrade = (c.req.header("upgrade") ?? "").toLowerCase() === "websocket";
  if (!acceptor) {
    if (upgrade) throw new AppError("exec_unsupported", "this gateway takes no WebSocket for exec on a terminal; use a Node gateway");
    throw new AppError("bad_request", "this route is a WebSocket: send GET with Connection: Upgrade and Upgrade: websocket");
  }
  if (!upgrade) throw new AppError("bad_request", "this route is a WebSocket: Upgrade: websocket is missing");
  if (c.req.header("sec-websocket-version") !== "13") throw new AppError("bad_request", "Sec-WebSocket-Version must be 13");
  const key = c.req.header("sec-websocket-key") ?? "";
  if (!/^[A-Za-z0-9+/]{22}==$/.test(key)) throw new AppError("bad_request", "Sec-WebSocket-Key must be 16 bytes in base64");
}

/** `NAME=VALUE` strings as a record; 400 on a bad one. */
function parseEnv(given: string | string[] | undefined): Record<string, string> {
  const list = given === undefined ? [] : typeof given === "string" ? [given] : given;
  const out: Record<string, string> = {};
  for (const item of list) {
    const eq = item.indexOf("=");
    const name = eq > 0 ? item.slice(0, eq) : "";
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name))
      throw new AppError("bad_request", `env must be NAME=VALUE with a name of letters, digits and _: ${item.slice(0, 100)}`);
    out[name] = item.slice(eq + 1);
  }
  return out;
}

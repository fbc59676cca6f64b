// Exec, background processes and files inside an agent's VM (`/v1/agents/{id}/exec|processes|files`): scope agents:exec, each change in the audit log.
//
// Every route reaches the VM's exec server (fleet-agent/guest/guest-exec/) through `Fleet.forward` with target
// `exec` (guest.ts): waking the agent, holding it awake while the call runs, streaming both ways, on any fleet.
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import type { Context } from "hono";
import { apiRouter, errors, json, jsonBody, jsonRequest, z } from "../../lib/api.ts";
import { AppError } from "../../lib/errors.ts";
import { requireScope, scopeGate, type Caller, type GatewayEnv } from "../../contracts/caller.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import { callerAction } from "../../schema/audit-log.ts";
import { AgentParams } from "../agents/api-schemas.ts";
import type { GatewayDeps } from "../deps.ts";
import type { ProxyCore } from "../proxy/core.ts";
import {
  defaultExecTimeoutMs,
  DeleteFileQuery,
  DirListingSchema,
  ExecBody,
  ExecResultSchema,
  FilesQuery,
  FileWrittenSchema,
  maxOutputBytes,
  OutputQuery,
  OutputSchema,
  ProcessListSchema,
  ProcessParams,
  ProcessSchema,
  PutFileQuery,
  SignalBody,
  StdinBody,
  TarWrittenSchema,
  WaitBody,
} from "./api-schemas.ts";
import { tenantSlotScope, type SlotLeaves } from "./exec-slot.ts";
import { callGuest, fromBase64, noLimitMs, readAll, readJson, toBase64 } from "./guest.ts";
import { maxFileBytes } from "./paths.ts";
import { execTtyRoutes } from "./tty.ts";
import { encodeSpec, frameDecoder, frameType, parseExit, ShortFrame, signalNumbers, type ExitStatus, type Frame } from "../../contracts/exec-wire.ts";
import { processView, listingView, octal, type GuestListing, type GuestProcess } from "./views.ts";

export type ExecRouteDeps = Pick<GatewayDeps, "fleet" | "audit" | "log" | "config">;

const tags = ["exec"];
const ndjson = "application/x-ndjson";
const tarType = "application/x-tar";
const binary = z.string().openapi({ format: "binary" });
const exec = scopeGate("agents:exec");

/** Time the exec server has to answer a call's head beyond what the call itself waits, ms. */
const answerMarginMs = 30_000;
/** A file's or a listing's body moving no byte for this long is cut, ms. */
const transferIdleMs = 5 * 60_000;

const execRoute = (body: ReturnType<typeof jsonBody>) =>
  createRoute({
    method: "post",
    path: "/v1/agents/{id}/exec",
    operationId: "execInAgent",
    summary: "Run a command inside the agent's VM (waking it), or start one in the background",
    description: [
      "Runs `cmd` in the agent's root as the image's user (or `user`), with the image's environment plus `env`; the agent",
      "stays awake while it runs. `Accept: application/json` (default) waits and answers the exit status with stdout and",
      `stderr (each at most ${maxOutputBytes} bytes: beyond it \`truncated\`). \`Accept: ${ndjson}\` streams one JSON object a line as`,
      'output comes: `{"stdout":…}`, `{"stderr":…}`, `{"error":…}` (it could not start), last `{"exit":{exitCode,signal,timedOut,durationMs}}`.',
      "`background: true` answers 201 with the process (see `/processes`).",
    ].join(" "),
    tags,
    middleware: [exec, body],
    request: { params: AgentParams, ...jsonRequest(ExecBody) },
    responses: {
      200: {
        description: "It ended (JSON), or its output as it comes (NDJSON)",
        content: {
          "application/json": { schema: ExecResultSchema },
          [ndjson]: { schema: z.string().openapi({ description: "One JSON object a line" }) },
        },
      },
      201: json(ProcessSchema, "Started in the background"),
      ...errors(400, 404, 409, 413, 501, 502, 504),
    },
  });

const listProcessesRoute = createRoute({
  method: "get",
  path: "/v1/agents/{id}/processes",
  operationId: "listAgentProcesses",
  summary: "The background processes started in the agent (running and exited), waking it",
  tags,
  middleware: [exec],
  request: { params: AgentParams },
  responses: { 200: json(ProcessListSchema, "The processes"), ...errors(400, 404, 409, 501, 502, 504) },
});

const getProcessRoute = createRoute({
  method: "get",
  path: "/v1/agents/{id}/processes/{pid}",
  operationId: "getAgentProcess",
  summary: "One background process",
  tags,
  middleware: [exec],
  request: { params: ProcessParams },
  responses: { 200: json(ProcessSchema, "The process"), ...errors(400, 404, 409, 501, 502, 504) },
});

const waitProcessRoute = (body: ReturnType<typeof jsonBody>) =>
  createRoute({
    method: "post",
    path: "/v1/agents/{id}/processes/{pid}/wait",
    operationId: "waitAgentProcess",
    summary: "Wait for a background process to exit (at most timeoutMs), answering it as it is then",
    tags,
    middleware: [exec, body],
    request: { params: ProcessParams, ...jsonRequest(WaitBody) },
    responses: { 200: json(ProcessSchema, "The process"), ...errors(400, 404, 409, 413, 501, 502, 504) },
  });

const stdinRoute = (body: ReturnType<typeof jsonBody>) =>
  createRoute({
    method: "post",
    path: "/v1/agents/{id}/processes/{pid}/stdin",
    operationId: "writeAgentProcessStdin",
    summary: "Write to a background process's standard input (and close it with eof)",
    tags,
    middleware: [exec, body],
    request: { params: ProcessParams, ...jsonRequest(StdinBody) },
    responses: { 204: { description: "Written" }, ...errors(400, 404, 409, 413, 501, 502, 504) },
  });

const signalRoute = (body: ReturnType<typeof jsonBody>) =>
  createRoute({
    method: "post",
    path: "/v1/agents/{id}/processes/{pid}/signal",
    operationId: "signalAgentProcess",
    summary: "Send a signal to a background process's group",
    tags,
    middleware: [exec, body],
    request: { params: ProcessParams, ...jsonRequest(SignalBody) },
    responses: { 204: { description: "Sent" }, ...errors(400, 404, 409, 413, 501, 502, 504) },
  });

const outputRoute = createRoute({
  method: "get",
  path: "/v1/agents/{id}/processes/{pid}/output",
  operationId: "readAgentProcessOutput",
  summary: "Read a background process's output from an offset (the VM keeps 16 MiB per stream)",
  tags,
  middleware: [exec],
  request: { params: ProcessParams, query: OutputQuery },
  responses: { 200: json(OutputSchema, "A piece of the stream"), ...errors(400, 404, 409, 501, 502, 504) },
});

const getFileRoute = createRoute({
  method: "get",
  path: "/v1/agents/{id}/files",
  operationId: "readAgentFile",
  summary: "Read a file (streamed), list a directory, or with Accept: application/x-tar a tree as tar",
  description:
    "A regular file's bytes with `x-file-mode` (octal), `x-file-uid`, `x-file-gid` and `last-modified`; a directory's entries as JSON; with `Accept: application/x-tar` the file or tree as a tar (modes and owners kept). Paths are inside the agent's root: absolute, no `..`; symlinks resolve inside it.",
  tags,
  middleware: [exec],
  request: { params: AgentParams, query: FilesQuery },
  responses: {
    200: {
      description: "The file's bytes, the directory's listing, or the tar",
      content: { "application/octet-stream": { schema: binary }, "application/json": { schema: DirListingSchema }, [tarType]: { schema: binary } },
    },
    ...errors(400, 404, 409, 501, 502, 504),
  },
});

const putFileRoute = createRoute({
  method: "put",
  path: "/v1/agents/{id}/files",
  operationId: "writeAgentFile",
  summary: "Write a file (streamed; replaced whole, never seen half-written), or with Content-Type: application/x-tar extract a tree under path",
  description: `The body is the file's bytes, at most ${maxFileBytes} bytes (the agent's own request-body limit does not apply). With \`Content-Type: application/x-tar\` it is a tar extracted under \`path\` (made), modes and owners kept; an entry that would leave \`path\` (\`..\`, an absolute link) is refused (400) with nothing after it written.`,
  tags,
  middleware: [exec],
  request: {
    params: AgentParams,
    query: PutFileQuery,
    body: { required: true, content: { "application/octet-stream": { schema: binary }, [tarType]: { schema: binary } } },
  },
  responses: {
    201: {
      description: "Written",
      content: { "application/json": { schema: z.union([FileWrittenSchema, TarWrittenSchema]) } },
    },
    ...errors(400, 404, 409, 413, 501, 502, 504),
  },
});

const deleteFileRoute = createRoute({
  method: "delete",
  path: "/v1/agents/{id}/files",
  operationId: "deleteAgentFile",
  summary: "Delete a file, or with recursive=true a directory and what it holds",
  tags,
  middleware: [exec],
  request: { params: AgentParams, query: DeleteFileQuery },
  responses: { 204: { description: "Deleted" }, ...errors(400, 404, 409, 501, 502, 504) },
});

export function execRoutes(deps: ExecRouteDeps, proxy: Pick<ProxyCore, "resolve" | "enter">): OpenAPIHono<GatewayEnv> {
  const r = apiRouter<GatewayEnv>();
  const { fleet, log } = deps;
  const body = jsonBody(() => deps.config.maxApiBodyBytes);
  const slots: SlotLeaves = new WeakMap();
  // Each route's call holds a slot of its tenant's concurrent-call limit for as long as it runs (exec-slot.ts).
  for (const path of ["/v1/agents/:id/exec", "/v1/agents/:id/processes", "/v1/agents/:id/processes/*", "/v1/agents/:id/files"]) {
    r.use(path, tenantSlotScope(slots));
  }

  /**
   * The caller's agent (404 for another tenant's), from the proxy's agent cache as a call to it would be, and its spec;
   * the call then counts against the tenant's concurrent-call limit, as a call to the agent does (429 at the limit).
   */
  async function target(c: Context<GatewayEnv>, id: string): Promise<{ caller: Caller; spec: AgentSpec }> {
    const caller = requireScope(c, "agents:exec");
    const agent = await proxy.resolve(id);
    if (agent.row.tenantId !== caller.tenantId) throw new AppError("not_found", `agent ${id} not found`);
    if (!slots.has(c)) slots.set(c, proxy.enter(agent));
    return { caller, spec: agent.spec };
  }

  /** Records the action; a failure to record is logged, never the caller's (the command ran). */
  function audit(c: Context<GatewayEnv>, caller: Caller, action: string, agentId: string, detail: Record<string, unknown>): Promise<void> {
    return deps.audit.record(callerAction(caller, c.get("requestId"), action, agentId, detail)).catch((err: unknown) => {
      log.error("audit record failed", { requestId: c.get("requestId"), action, agentId, err: err instanceof Error ? err.message : String(err) });
    });
  }

  r.openapi(execRoute(body), async (c) => {
    const { id } = c.req.valid("param");
    const { caller, spec } = await target(c, id);
    const q = c.req.valid("json");
    const argv = typeof q.cmd === "string" ? ["/bin/sh", "-c", q.cmd] : q.cmd;
    const timeoutMs = q.timeoutMs ?? (q.background ? 0 : defaultExecTimeoutMs);
    const stdin = q.stdin === undefined ? undefined : q.stdinEncoding === "base64" ? fromBase64(q.stdin, "stdin") : new TextEncoder().encode(q.stdin);
    const specBytes = encodeSpec({
      argv,
      ...(q.env ? { env: q.env } : {}),
      ...(q.cwd !== undefined ? { cwd: q.cwd } : {}),
      ...(q.user !== undefined ? { user: q.user } : {}),
      timeoutMs,
      background: q.background,
      // A background process always gets a stdin pipe (its first bytes, if any, from `stdin`): …/stdin writes to it.
      stdin: stdin !== undefined || q.background,
    });
    const requestBody = stdin ? concat(specBytes, stdin) : specBytes;
    const requestId = c.get("requestId");
    const what = { argv: auditArgv(argv), cwd: q.cwd ?? null, user: q.user ?? null, env: Object.keys(q.env ?? {}), stdinBytes: stdin?.byteLength ?? 0 };
    const startedAt = Date.now();
    const res = await callGuest(fleet, spec, {
      method: "POST",
      path: "/v1/exec",
      body: requestBody,
      headers: { "content-type": "application/octet-stream" },
      requestId,
      signal: c.req.raw.signal,
      responseTimeoutMs: answerMarginMs,
      idleTimeoutMs: timeoutMs === 0 ? noLimitMs : Math.min(noLimitMs, timeoutMs + answerMarginMs),
    });
    const wake = res.headers.get("x-wake");
    if (q.background) {
      const started = await readJson<{ pid?: unknown; error?: unknown }>(res);
      if (typeof started.pid !== "number") throw new AppError("bad_gateway", "the exec server started a process without a pid");
      const error = typeof started.error === "string" ? started.error : null;
      await audit(c, caller, "agent.exec", spec.id, { ...what, background: true, pid: started.pid, timeoutMs, ...(error ? { error } : {}) });
      const view = { ...processView({ pid: started.pid, cmd: argv, state: "running", startedAtMs: startedAt }), ...(error ? { error } : {}) };
      return c.json(view, 201, wake ? { "x-wake": wake } : {});
    }
    const recordExit = (exit: ExitStatus | undefined, error: string | undefined, truncated?: boolean) =>
      audit(c, caller, "agent.exec", spec.id, {
        ...what,
        timeoutMs,
        ...(exit ? { exitCode: exit.exitCode, signal: exit.signal, timedOut: exit.timedOut, durationMs: exit.durationMs } : { exitCode: null, signal: null }),
        ...(error ? { error } : {}),
        ...(truncated ? { truncated } : {}),
        ms: Date.now() - startedAt,
      });
    if (wantsNdjson(c.req.header("accept"))) {
      let recorded = false;
      const record = (exit: ExitStatus | undefined, error: string | undefined) => {
        if (recorded) return;
        recorded = true;
        void recordExit(exit, error);
      };
      const lines = res.body!.pipeThrough(frameDecoder()).pipeThrough(ndjsonLines(q.encoding, record));
      // A client that goes away before the exit is recorded too (the command's connection ends with it).
      return new Response(
        onCancel(lines, () => record(undefined, "the client went away before the command ended")),
        {
          status: 200,
          headers: { "content-type": ndjson, "cache-control": "no-store", ...(wake ? { "x-wake": wake } : {}) },
        },
      ) as never;
    }
    let result: Awaited<ReturnType<typeof collect>>;
    try {
      result = await collect(res.body!, q.encoding);
    } catch (err) {
      // Its stream broke (or the client went away): what ran is recorded all the same.
      await recordExit(undefined, err instanceof Error ? err.message : String(err));
      throw err;
    }
    await recordExit(result.exit, result.error ?? undefined, result.truncated);
    if (!result.exit) throw new AppError("bad_gateway", `agent ${spec.id}'s exec server ended the command's stream without its exit status`);
    return c.json(
      {
        ...result.exit,
        stdout: result.stdout,
        stderr: result.stderr,
        truncated: result.truncated,
        encoding: q.encoding,
        error: result.error,
      },
      200,
      wake ? { "x-wake": wake } : {},
    );
  });

  r.openapi(listProcessesRoute, async (c) => {
    const { spec } = await target(c, c.req.valid("param").id);
    const res = await callGuest(fleet, spec, short(c, "GET", "/v1/procs"));
    const list = await readJson<{ processes?: GuestProcess[] }>(res);
    return c.json({ processes: (list.processes ?? []).map(processView) }, 200);
  });

  r.openapi(getProcessRoute, async (c) => {
    const { id, pid } = c.req.valid("param");
    const { spec } = await target(c, id);
    const res = await callGuest(fleet, spec, short(c, "GET", `/v1/procs/${pid}`));
    return c.json(processView(await readJson<GuestProcess>(res)), 200);
  });

  r.openapi(waitProcessRoute(body), async (c) => {
    const { id, pid } = c.req.valid("param");
    const { spec } = await target(c, id);
    const { timeoutMs } = c.req.valid("json");
    const call = short(c, "GET", `/v1/procs/${pid}/wait?timeout_ms=${timeoutMs}`);
    const res = await callGuest(fleet, spec, { ...call, responseTimeoutMs: timeoutMs + answerMarginMs });
    return c.json(processView(await readJson<GuestProcess>(res)), 200);
  });

  r.openapi(stdinRoute(body), async (c) => {
    const { id, pid } = c.req.valid("param");
    const { caller, spec } = await target(c, id);
    const q = c.req.valid("json");
    const data = q.encoding === "base64" ? fromBase64(q.data, "data") : new TextEncoder().encode(q.data);
    const res = await callGuest(fleet, spec, {
      ...short(c, "POST", `/v1/procs/${pid}/stdin${q.eof ? "?eof=1" : ""}`),
      body: data,
      headers: { "content-type": "application/octet-stream" },
    });
    await res.body?.cancel().catch(() => undefined);
    await audit(c, caller, "agent.process.stdin", spec.id, { pid: Number(pid), bytes: data.byteLength, eof: q.eof });
    return c.body(null, 204);
  });

  r.openapi(signalRoute(body), async (c) => {
    const { id, pid } = c.req.valid("param");
    const { caller, spec } = await target(c, id);
    const { signal } = c.req.valid("json");
    const number = typeof signal === "number" ? signal : signalNumbers[signal]!;
    const res = await callGuest(fleet, spec, short(c, "POST", `/v1/procs/${pid}/signal?sig=${number}`));
    await res.body?.cancel().catch(() => undefined);
    await audit(c, caller, "agent.process.signal", spec.id, { pid: Number(pid), signal: number });
    return c.body(null, 204);
  });

  r.openapi(outputRoute, async (c) => {
    const { id, pid } = c.req.valid("param");
    const { spec } = await target(c, id);
    const q = c.req.valid("query");
    const res = await callGuest(fleet, spec, short(c, "GET", `/v1/procs/${pid}/output?stream=${q.stream}&offset=${q.offset}&limit=${q.limit}`));
    const bytes = await readAll(res, q.limit + 64 * 1024);
    const nextOffset = Number(res.headers.get("x-next-offset") ?? q.offset + bytes.byteLength);
    return c.json(
      {
        data: q.encoding === "base64" ? toBase64(bytes) : new TextDecoder().decode(bytes),
        encoding: q.encoding,
        offset: q.offset,
        nextOffset: Number.isFinite(nextOffset) ? nextOffset : q.offset + bytes.byteLength,
        dropped: Number(res.headers.get("x-dropped") ?? 0) || 0,
        eof: res.headers.get("x-eof") === "1",
      },
      200,
    );
  });

  r.openapi(getFileRoute, async (c) => {
    const { id } = c.req.valid("param");
    const { spec } = await target(c, id);
    const { path } = c.req.valid("query");
    const tar = (c.req.header("accept") ?? "").includes(tarType);
    const res = await callGuest(fleet, spec, {
      ...short(c, "GET", `${tar ? "/v1/tar" : "/v1/files"}?path=${encodeURIComponent(path)}`),
      idleTimeoutMs: transferIdleMs,
    });
    if (tar) return new Response(res.body, { status: 200, headers: { "content-type": tarType, "cache-control": "no-store" } }) as never;
    if ((res.headers.get("content-type") ?? "").startsWith("application/json")) {
      const listing = await readJson<GuestListing>(res, 64 * 1024 * 1024);
      return c.json(listingView(path, listing), 200);
    }
    const headers: Record<string, string> = { "content-type": "application/octet-stream", "cache-control": "no-store" };
    const length = res.headers.get("content-length");
    if (length) headers["content-length"] = length;
    const mode = res.headers.get("x-file-mode");
    if (mode) headers["x-file-mode"] = octal(mode);
    for (const name of ["x-file-uid", "x-file-gid"]) {
      const v = res.headers.get(name);
      if (v) headers[name] = v;
    }
    const mtime = Number(res.headers.get("x-file-mtime-ms"));
    if (res.headers.has("x-file-mtime-ms") && Number.isFinite(mtime)) headers["last-modified"] = new Date(mtime).toUTCString();
    return new Response(res.body, { status: 200, headers }) as never;
  });

  r.openapi(putFileRoute, async (c) => {
    const { id } = c.req.valid("param");
    const { caller, spec } = await target(c, id);
    const q = c.req.valid("query");
    const tar = (c.req.header("content-type") ?? "").startsWith(tarType);
    const declared = Number(c.req.header("content-length"));
    if (Number.isFinite(declared) && declared > maxFileBytes) throw tooLarge();
    const counted = { bytes: 0 };
    const source = c.req.raw.body ?? new ReadableStream<Uint8Array>({ start: (ctl) => ctl.close() });
    const upload = source.pipeThrough(limitBytes(maxFileBytes, counted));
    let path: string;
    if (tar) path = `/v1/tar?path=${encodeURIComponent(q.path)}`;
    else {
      const params = new URLSearchParams({ path: q.path });
      if (q.mode !== undefined) params.set("mode", q.mode);
      if (q.uid !== undefined) params.set("uid", String(q.uid));
      if (q.gid !== undefined) params.set("gid", String(q.gid));
      if (q.mkdirs) params.set("mkdirs", "1");
      path = `/v1/files?${params.toString()}`;
    }
    let res: Response;
    try {
      res = await callGuest(fleet, spec, {
        method: "PUT",
        path,
        body: upload,
        headers: {
          "content-type": "application/octet-stream",
          ...(Number.isFinite(declared) && declared >= 0 && c.req.header("content-length") ? { "content-length": String(declared) } : {}),
        },
        requestId: c.get("requestId"),
        signal: c.req.raw.signal,
        // The whole body is sent before the exec server answers: no deadline on the upload itself.
        responseTimeoutMs: noLimitMs,
        idleTimeoutMs: transferIdleMs,
      });
    } catch (err) {
      if (counted.bytes > maxFileBytes) throw tooLarge();
      throw err;
    }
    const written = await readJson<Record<string, unknown>>(res);
    if (tar) {
      const entries = typeof written.entries === "number" ? written.entries : 0;
      await audit(c, caller, "agent.files.untar", spec.id, { path: q.path, bytes: counted.bytes, entries });
      return c.json({ path: q.path, entries }, 201);
    }
    const view = {
      path: q.path,
      size: typeof written.size === "number" ? written.size : counted.bytes,
      mode: octal(written.mode ?? q.mode ?? "0644"),
      uid: typeof written.uid === "number" ? written.uid : (q.uid ?? 0),
      gid: typeof written.gid === "number" ? written.gid : (q.gid ?? 0),
    };
    await audit(c, caller, "agent.files.write", spec.id, { path: q.path, bytes: counted.bytes, mode: view.mode, uid: view.uid, gid: view.gid });
    return c.json(view, 201);
  });

  r.openapi(deleteFileRoute, async (c) => {
    const { id } = c.req.valid("param");
    const { caller, spec } = await target(c, id);
    const q = c.req.valid("query");
    const res = await callGuest(fleet, spec, short(c, "DELETE", `/v1/files?path=${encodeURIComponent(q.path)}${q.recursive ? "&recursive=1" : ""}`));
    await res.body?.cancel().catch(() => undefined);
    await audit(c, caller, "agent.files.delete", spec.id, { path: q.path, recursive: q.recursive });
    return c.body(null, 204);
  });

  r.route("/", execTtyRoutes(deps, proxy));
  return r;
}

/** A short call's shape (a control call of a few bytes each way). */
function short(c: Context<GatewayEnv>, method: "GET" | "POST" | "PUT" | "DELETE", path: string) {
  return { method, path, requestId: c.get("requestId"), signal: c.req.raw.signal, responseTimeoutMs: answerMarginMs, idleTimeoutMs: answerMarginMs };
}

function tooLarge(): AppError {
  return new AppError("payload_too_large", `a file written into an agent is at most ${maxFileBytes} bytes`);
}

/** Whether the caller asked for the NDJSON stream (over JSON). */
function wantsNdjson(accept: string | undefined): boolean {
  return accept?.includes(ndjson) === true;
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.byteLength + b.byteLength);
  out.set(a, 0);
  out.set(b, a.byteLength);
  return out;
}

/** The argv as the audit log keeps it: every element, each cut at 1,000 characters, at most 4,000 in all. */
function auditArgv(argv: readonly string[]): string[] {
  const out: string[] = [];
  let total = 0;
  for (const a of argv) {
    if (total >= 4000) {
      out.push(`… ${argv.length - out.length} more`);
      break;
    }
    const cut = a.length > 1000 ? `${a.slice(0, 1000)}…` : a;
    out.push(cut);
    total += cut.length;
  }
  return out;
}

/** Passes the body through, counting; past `max` bytes it fails (413). */
function limitBytes(max: number, counted: { bytes: number }): TransformStream<Uint8Array, Uint8Array> {
  return new TransformStream<Uint8Array, Uint8Array>({
    transform(chunk, controller) {
      counted.bytes += chunk.byteLength;
      if (counted.bytes > max) {
        controller.error(tooLarge());
        return;
      }
      controller.enqueue(chunk);
    },
  });
}

/** The stream as it is, `cancelled` called when its reader cancels it (before its end). */
function onCancel(body: ReadableStream<Uint8Array>, cancelled: () => void): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        try {
          const next = await reader.read();
          if (next.done) controller.close();
          else controller.enqueue(next.value);
        } catch (err) {
          controller.error(err);
        }
      },
      cancel(reason) {
        cancelled();
        return reader.cancel(reason);
      },
    },
    { highWaterMark: 0 },
  );
}

/** One stream's output decoded as it comes (UTF-8 with a streaming decoder: a character cut between frames is whole), or base64. */
class StreamText {
  private readonly decoder = new TextDecoder("utf-8");
  private readonly base64: boolean;
  /** Bytes of a base64 piece not yet a multiple of 3 (so pieces join without padding). */
  private pending = new Uint8Array(0);

  constructor(encoding: "utf8" | "base64") {
    this.base64 = encoding === "base64";
  }

  push(bytes: Uint8Array): string {
    if (!this.base64) return this.decoder.decode(bytes, { stream: true });
    const all = this.pending.byteLength ? concat(this.pending, bytes) : bytes;
    const whole = all.byteLength - (all.byteLength % 3);
    this.pending = all.slice(whole);
    return toBase64(all.subarray(0, whole));
  }

  end(): string {
    if (!this.base64) return this.decoder.decode();
    const rest = toBase64(this.pending);
    this.pending = new Uint8Array(0);
    return rest;
  }
}

/** The frames as NDJSON lines; `done` once with the exit (or without, the stream having ended without one). */
function ndjsonLines(encoding: "utf8" | "base64", done: (exit: ExitStatus | undefined, error: string | undefined) => void): TransformStream<Frame, Uint8Array> {
  const encoder = new TextEncoder();
  const out = { stdout: new StreamText(encoding), stderr: new StreamText(encoding) };
  const status = new ShortFrame();
  let error: string | undefined;
  let ended = false;
  const line = (obj: unknown) => encoder.encode(`${JSON.stringify(obj)}\n`);
  const flush = (controller: TransformStreamDefaultController<Uint8Array>) => {
    for (const name of ["stdout", "stderr"] as const) {
      const rest = out[name].end();
      if (rest) controller.enqueue(line({ [name]: rest }));
    }
  };
  return new TransformStream<Frame, Uint8Array>({
    transform(frame, controller) {
      if (ended) return;
      if (frame.type === frameType.stdout || frame.type === frameType.stderr) {
        const name = frame.type === frameType.stdout ? "stdout" : "stderr";
        const text = out[name].push(frame.payload);
        if (text) controller.enqueue(line({ [name]: text }));
        return;
      }
      if (frame.type !== frameType.exit && frame.type !== frameType.error) return; // a later version's frame: not ours to show
      const text = status.add(frame);
      if (text === undefined) return;
      if (frame.type === frameType.error) {
        error = text;
        controller.enqueue(line({ error: text }));
        return;
      }
      flush(controller);
      const exit = parseExit(text);
      ended = true;
      done(exit, error);
      controller.enqueue(line({ exit }));
    },
    flush(controller) {
      if (ended) return;
      flush(controller);
      const message = "the exec server ended the command's stream without its exit status";
      controller.enqueue(line({ error: message }));
      done(undefined, message);
    },
  });
}

/** A foreground command's whole answer: each stream's first `maxOutputBytes` bytes kept, the rest read and dropped. */
async function collect(
  body: ReadableStream<Uint8Array>,
  encoding: "utf8" | "base64",
): Promise<{ stdout: string; stderr: string; truncated: boolean; exit: ExitStatus | undefined; error: string | null }> {
  const kept = { stdout: { parts: [] as Uint8Array[], bytes: 0 }, stderr: { parts: [] as Uint8Array[], bytes: 0 } };
  let truncated = false;
  let exit: ExitStatus | undefined;
  let error: string | null = null;
  const status = new ShortFrame();
  const reader = body.pipeThrough(frameDecoder()).getReader();
  for (;;) {
    let next: ReadableStreamReadResult<Frame>;
    try {
      next = await reader.read();
    } catch (err) {
      if (exit) break;
      throw new AppError("bad_gateway", `the exec server's stream broke: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    }
    if (next.done) break;
    const frame = next.value;
    if (frame.type === frameType.stdout || frame.type === frameType.stderr) {
      const k = frame.type === frameType.stdout ? kept.stdout : kept.stderr;
      const room = maxOutputBytes - k.bytes;
      if (frame.payload.byteLength > room) truncated = true;
      if (room > 0) {
        const piece = frame.payload.byteLength > room ? frame.payload.slice(0, room) : frame.payload.slice();
        k.parts.push(piece);
        k.bytes += piece.byteLength;
      }
      continue;
    }
    if (frame.type !== frameType.exit && frame.type !== frameType.error) continue;
    const text = status.add(frame);
    if (text === undefined) continue;
    if (frame.type === frameType.error) error = text;
    else exit = parseExit(text);
  }
  const render = (k: { parts: Uint8Array[] }) => {
    const s = new StreamText(encoding);
    let text = "";
    for (const p of k.parts) text += s.push(p);
    return text + s.end();
  };
  return { stdout: render(kept.stdout), stderr: render(kept.stderr), truncated, exit, error };
}

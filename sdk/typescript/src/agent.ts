// One agent: its commands (run, streamed, in the background), its files, its desktop, calls to its URL, and its lifecycle (wake, hibernate, checkpoint, reset).
import { AgentVMError } from "./errors.ts";
import { type Http, lines, seg, toBase64 } from "./http.ts";
import type {
  AgentInfo,
  AgentState,
  Checkpoint,
  Command,
  DesktopAction,
  DesktopActionsResult,
  DesktopViewers,
  DirectoryListing,
  ExecEvent,
  ExecExit,
  ExecOptions,
  ExecResult,
  FileData,
  FileWritten,
  Lease,
  PoolReleased,
  ProcessInfo,
  ProcessOutput,
  ResetResult,
  TtyOptions,
  SignalName,
  TarWritten,
  Wake,
  WriteOptions,
} from "./types.ts";

/** The exec request's body: the command, its options, stdin as text or base64. */
function execBody(cmd: Command, opts: ExecOptions, extra: Record<string, unknown> = {}): Record<string, unknown> {
  const body: Record<string, unknown> = { cmd: typeof cmd === "string" ? cmd : [...cmd], ...extra };
  if (opts.cwd !== undefined) body.cwd = opts.cwd;
  if (opts.env !== undefined) body.env = opts.env;
  if (opts.user !== undefined) body.user = opts.user;
  if (opts.timeoutMs !== undefined) body.timeoutMs = opts.timeoutMs;
  if (opts.encoding !== undefined) body.encoding = opts.encoding;
  if (opts.stdin !== undefined) {
    if (typeof opts.stdin === "string") body.stdin = opts.stdin;
    else {
      body.stdin = toBase64(opts.stdin);
      body.stdinEncoding = "base64";
    }
  }
  return body;
}

/** A mode as the API's query takes it: octal digits (`0o644` → `0644`). */
function modeParam(mode: number | string | undefined): string | undefined {
  if (mode === undefined) return undefined;
  return typeof mode === "number" ? mode.toString(8).padStart(4, "0") : mode;
}

/** What `fetch` sends: text, bytes, a Blob or a stream as they are. */
function bodyOf(data: FileData): BodyInit {
  if (typeof data === "string") return new TextEncoder().encode(data);
  return data as BodyInit;
}

/** A process started with `spawn`: it runs on in the agent (through hibernation) until it exits. */
export class Process {
  readonly agentId: string;
  readonly pid: number;
  /** What the API last said of it. */
  info: ProcessInfo;
  private readonly http: Http;

  constructor(http: Http, agentId: string, info: ProcessInfo) {
    this.http = http;
    this.agentId = agentId;
    this.pid = info.pid;
    this.info = info;
  }

  private path(tail = ""): string {
    return `/v1/agents/${seg(this.agentId)}/processes/${seg(this.pid)}${tail}`;
  }

  /** Its state now. */
  async refresh(): Promise<ProcessInfo> {
    this.info = await this.http.json<ProcessInfo>("GET", this.path());
    return this.info;
  }

  /** Waits until it exits, or `timeoutMs` passed (then its state as it is: check `state`). */
  async wait(opts: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<ProcessInfo> {
    this.info = await this.http.json<ProcessInfo>("POST", this.path("/wait"), {
      json: opts.timeoutMs !== undefined ? { timeoutMs: opts.timeoutMs } : {},
      signal: opts.signal,
    });
    return this.info;
  }

  /** Writes to its standard input; `eof` closes it after. */
  async write(data: string | Uint8Array, opts: { eof?: boolean } = {}): Promise<void> {
    const body = typeof data === "string" ? { data } : { data: toBase64(data), encoding: "base64" };
    await this.http.json("POST", this.path("/stdin"), { json: { ...body, ...(opts.eof ? { eof: true } : {}) } });
  }

  /** Closes its standard input. */
  async closeStdin(): Promise<void> {
    await this.write("", { eof: true });
  }

  /** Sends it a signal (`TERM` by default). */
  async kill(signal: SignalName | number = "TERM"): Promise<void> {
    await this.http.json("POST", this.path("/signal"), { json: { signal } });
  }

  /** A page of its output from `offset` (what it printed so far is kept in the agent, 16 MiB a stream). */
  async output(opts: { stream?: "stdout" | "stderr"; offset?: number; limit?: number } = {}): Promise<ProcessOutput> {
    return this.http.json<ProcessOutput>("GET", this.path("/output"), { query: { stream: opts.stream ?? "stdout", offset: opts.offset, limit: opts.limit } });
  }

  /** All of a stream's output so far as text (pages followed until the end of what is there). */
  async text(stream: "stdout" | "stderr" = "stdout"): Promise<string> {
    let offset = 0;
    let text = "";
    for (;;) {
      const page = await this.output({ stream, offset });
      text += page.encoding === "base64" ? new TextDecoder().decode(Uint8Array.from(atob(page.data), (c) => c.charCodeAt(0))) : page.data;
      if (page.eof || page.nextOffset === offset) return text;
      offset = page.nextOffset;
    }
  }
}

/** An agent's files: paths are absolute inside its root (the image's filesystem). */
export class Files {
  private readonly http: Http;
  private readonly agentId: string;

  constructor(http: Http, agentId: string) {
    this.http = http;
    this.agentId = agentId;
  }

  private get path(): string {
    return `/v1/agents/${seg(this.agentId)}/files`;
  }

  /** A file's bytes as a stream (never held whole), with its mode and owner in the response's headers. */
  async stream(path: string, opts: { signal?: AbortSignal } = {}): Promise<Response> {
    return this.http.raw("GET", this.path, { query: { path }, headers: { accept: "application/octet-stream" }, signal: opts.signal });
  }

  /** A file's bytes. */
  async read(path: string, opts: { signal?: AbortSignal } = {}): Promise<Uint8Array> {
    const response = await this.stream(path, opts);
    if ((response.headers.get("content-type") ?? "").startsWith("application/json") && !response.headers.has("x-file-mode")) {
      await response.body?.cancel();
      throw new AgentVMError("bad_request", `${path} is a directory: use files.list`, { status: 400 });
    }
    return new Uint8Array(await response.arrayBuffer());
  }

  /** A file's text (UTF-8). */
  async readText(path: string, opts: { signal?: AbortSignal } = {}): Promise<string> {
    return new TextDecoder().decode(await this.read(path, opts));
  }

  /** Writes a file whole (replaced at once: a reader never sees half of it). */
  async write(path: string, data: FileData, opts: WriteOptions = {}): Promise<FileWritten> {
    return this.http.json<FileWritten>("PUT", this.path, {
      query: { path, mode: modeParam(opts.mode), uid: opts.uid, gid: opts.gid, mkdirs: opts.mkdirs ? "true" : undefined },
      body: bodyOf(data),
      headers: { "content-type": "application/octet-stream" },
      signal: opts.signal,
    });
  }

  /** A directory's entries. */
  async list(path: string): Promise<DirectoryListing> {
    const response = await this.http.raw("GET", this.path, { query: { path }, headers: { accept: "application/json" } });
    if (!(response.headers.get("content-type") ?? "").startsWith("application/json")) {
      await response.body?.cancel();
      throw new AgentVMError("bad_request", `${path} is not a directory`, { status: 400 });
    }
    return (await response.json()) as DirectoryListing;
  }

  /** Removes a file, or with `recursive` a tree. */
  async remove(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await this.http.raw("DELETE", this.path, { query: { path, recursive: opts.recursive ? "true" : undefined } });
  }

  /** A file or tree as a tar stream (ustar). */
  async downloadTar(path: string, opts: { signal?: AbortSignal } = {}): Promise<ReadableStream<Uint8Array>> {
    const response = await this.http.raw("GET", this.path, { query: { path }, headers: { accept: "application/x-tar" }, signal: opts.signal });
    if (!response.body) throw new AgentVMError("bad_response", "the tar had no body");
    return response.body;
  }

  /** A tar (bytes, a Blob or a stream) extracted under the directory `path` (made); answers how many entries. */
  async uploadTar(path: string, tar: Uint8Array | ArrayBuffer | Blob | ReadableStream<Uint8Array>, opts: { signal?: AbortSignal } = {}): Promise<TarWritten> {
    return this.http.json("PUT", this.path, { query: { path }, body: tar as BodyInit, headers: { "content-type": "application/x-tar" }, signal: opts.signal });
  }
}

/** An agent: an id and what the API last said of it (`info`; `refresh()` asks again). */
export class Agent {
  readonly id: string;
  info: AgentInfo | undefined;
  /** The pool it was acquired from, if it was. */
  readonly poolId: string | undefined;
  readonly files: Files;
  private readonly http: Http;

  constructor(http: Http, id: string, info?: AgentInfo, poolId?: string) {
    this.http = http;
    this.id = id;
    this.info = info;
    this.poolId = poolId;
    this.files = new Files(http, id);
  }

  private path(tail = ""): string {
    return `/v1/agents/${seg(this.id)}${tail}`;
  }

  /** Where the agent's own server is called: `<baseUrl>/a/<id>/`. */
  get url(): string {
    return `${this.http.baseUrl}/a/${seg(this.id)}/`;
  }

  /** The agent now. */
  async refresh(): Promise<AgentInfo> {
    this.info = await this.http.json<AgentInfo>("GET", this.path());
    return this.info;
  }

  /** Runs a command to its end (waking the agent if it sleeps); its output in the answer, each stream capped at 1 MiB. */
  async exec(cmd: Command, opts: ExecOptions = {}): Promise<ExecResult> {
    const r = await this.http.json<Omit<ExecResult, "ok">>("POST", this.path("/exec"), { json: execBody(cmd, opts), signal: opts.signal });
    return { ...r, ok: r.exitCode === 0 };
  }

  /**
   * Runs a command and yields its output as it happens: `{stdout}`, `{stderr}`, then `{exit}` last. Leaving the loop
   * early closes the connection (and the command with it).
   */
  async *execStream(cmd: Command, opts: ExecOptions = {}): AsyncGenerator<ExecEvent, ExecExit | undefined> {
    const response = await this.http.raw("POST", this.path("/exec"), {
      json: execBody(cmd, opts),
      headers: { accept: "application/x-ndjson" },
      signal: opts.signal,
    });
    if (!response.body) throw new AgentVMError("bad_response", "the exec stream had no body");
    for await (const line of lines(response.body)) {
      const event = JSON.parse(line) as ExecEvent | { error: { code: string; message: string } };
      // The envelope (a failure before any output, in the stream's place) is thrown; `{error: "…"}` (it could not start) is an event.
      if ("error" in event && typeof event.error !== "string") throw AgentVMError.fromBody(502, event);
      yield event as ExecEvent;
      if ("exit" in event) return event.exit;
    }
    throw new AgentVMError("stream_ended", "the exec stream ended before the command's exit", { status: 502 });
  }

  /**
   * Opens a terminal in the agent, interactively (`GET /v1/agents/{id}/exec/tty`, a WebSocket; it wakes the agent):
   * `cmd` as an argv, or a `/bin/sh -c` string, or none for `/bin/sh`. Binary messages are the terminal's bytes both
   * ways; text messages are JSON control: send `{"resize":{"rows":n,"cols":n}}`, receive `{"error":"…"}` (it could not
   * start) and `{"exit":{"code","signal","timedOut","durationMs"}}` before a 1000 close. The token goes as a subprotocol
   * (`agentvm.bearer.<token>` beside `agentvm.tty`), which browsers and Node ≥ 22 both send. A refusal (no scope, an
   * unknown agent) shows only as a socket that fails to open: the API's plain answer is not readable through it.
   */
  openTty(cmd: Command | undefined, opts: TtyOptions): WebSocket {
    const q = new URLSearchParams();
    if (typeof cmd === "string") q.set("cmd", cmd);
    else for (const arg of cmd ?? []) q.append("arg", arg);
    q.set("rows", String(opts.rows));
    q.set("cols", String(opts.cols));
    for (const [name, value] of Object.entries(opts.env ?? {})) q.append("env", `${name}=${value}`);
    if (opts.cwd !== undefined) q.set("cwd", opts.cwd);
    if (opts.user !== undefined) q.set("user", opts.user);
    const url = `${this.http.baseUrl.replace(/^http/, "ws")}${this.path("/exec/tty")}?${q.toString()}`;
    const ws = new WebSocket(url, this.http.token ? ["agentvm.tty", `agentvm.bearer.${this.http.token}`] : ["agentvm.tty"]);
    ws.binaryType = "arraybuffer";
    return ws;
  }

  /**
   * Starts a command in the background: it runs on (through hibernation and wake) until it exits. Its stdin stays open
   * for `Process.write` when `stdin` is given (`true`: open, nothing written yet); without it stdin is /dev/null.
   */
  async spawn(cmd: Command, opts: Omit<ExecOptions, "encoding" | "stdin"> & { stdin?: string | Uint8Array | true } = {}): Promise<Process> {
    const { stdin, ...rest } = opts;
    const body = execBody(cmd, { ...rest, ...(stdin !== undefined ? { stdin: stdin === true ? "" : stdin } : {}) }, { background: true });
    const info = await this.http.json<ProcessInfo>("POST", this.path("/exec"), { json: body, signal: opts.signal });
    return new Process(this.http, this.id, info);
  }

  /** Its background processes. */
  async processes(): Promise<Process[]> {
    const r = await this.http.json<{ processes: ProcessInfo[] }>("GET", this.path("/processes"));
    return r.processes.map((p) => new Process(this.http, this.id, p));
  }

  /** One background process by pid. */
  async process(pid: number): Promise<Process> {
    return new Process(this.http, this.id, await this.http.json<ProcessInfo>("GET", this.path(`/processes/${seg(pid)}`)));
  }

  /** A call to the agent's own server (`path` under its URL), with the token; it wakes the agent like any call. */
  async fetch(path = "/", init: RequestInit = {}): Promise<Response> {
    const headers = this.http.authHeaders(init.headers);
    return this.http.send(`${this.http.baseUrl}/a/${seg(this.id)}${path.startsWith("/") ? path : `/${path}`}`, { ...init, headers });
  }

  /** A desktop agent's screen as PNG bytes (waking it), `scale` 0.1..1 of the display's size. */
  async screenshot(opts: { scale?: number; signal?: AbortSignal } = {}): Promise<Uint8Array> {
    const res = await this.http.raw("GET", this.path("/desktop/screenshot"), {
      query: { scale: opts.scale },
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
    return new Uint8Array(await res.arrayBuffer());
  }

  /** Runs input actions on a desktop agent's screen, in order (at most 50), answering the cursor and the screen after them. */
  async act(actions: readonly DesktopAction[], opts: { screenshot?: boolean; scale?: number } = {}): Promise<DesktopActionsResult> {
    const json: Record<string, unknown> = { actions: [...actions] };
    if (opts.screenshot !== undefined) json.screenshot = opts.screenshot;
    if (opts.scale !== undefined) json.scale = opts.scale;
    return this.http.json<DesktopActionsResult>("POST", this.path("/desktop/actions"), { json });
  }

  /** Who is watching a desktop agent's screen through the viewer, and who holds control (through any gateway). */
  async viewers(): Promise<DesktopViewers["viewers"]> {
    return (await this.http.json<DesktopViewers>("GET", this.path("/desktop/viewers"))).viewers;
  }

  /** Wakes it now and waits until it runs. */
  async wake(opts: { signal?: AbortSignal } = {}): Promise<Wake> {
    return this.http.json<Wake>("POST", this.path("/wake"), { signal: opts.signal });
  }

  /** Snapshots it now; it wakes on its next call (or exec). */
  async hibernate(): Promise<AgentState> {
    return this.http.json<AgentState>("POST", this.path("/hibernate"));
  }

  /** Keeps it awake for `ttlMs`. */
  async lease(ttlMs: number): Promise<Lease> {
    return this.http.json<Lease>("POST", this.path("/leases"), { json: { ttlMs } });
  }

  /** A checkpoint of it as it is now (forks and pools start from one). */
  async checkpoint(name?: string): Promise<Checkpoint> {
    return this.http.json<Checkpoint>("POST", this.path("/checkpoints"), { json: name !== undefined ? { name } : {} });
  }

  /** Rolls it back to the checkpoint it was forked from (an episode ends, the next starts from the same state). */
  async reset(): Promise<ResetResult> {
    const r = await this.http.json<ResetResult>("POST", this.path("/reset"));
    this.info = r.agent;
    return r;
  }

  /** Gives it back to the pool it was acquired from (reset there first). */
  async release(): Promise<PoolReleased> {
    const poolId = this.poolId ?? this.info?.pool?.id;
    if (!poolId) throw new AgentVMError("bad_request", `agent ${this.id} is in no pool`, { status: 400 });
    const r = await this.http.json<PoolReleased>("POST", `/v1/pools/${seg(poolId)}/release`, { json: { agentId: this.id } });
    this.info = r.agent;
    return r;
  }

  /** Deletes it: its VM, snapshot and disk go. */
  async delete(): Promise<void> {
    await this.http.json("DELETE", this.path());
  }
}

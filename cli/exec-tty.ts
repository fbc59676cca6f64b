// `agentvm exec` on a terminal: our terminal raw, its bytes to the agent's PTY and back over the API's WebSocket (`/v1/agents/{id}/exec/tty`), our window size followed, the terminal restored on every way out.
import { constants } from "node:os";
import type { CliConfig } from "./config.ts";
import { failure, fetchFailure, tokenHelp } from "./client.ts";
import { CliError, exitCodes, usageError } from "./exit.ts";

/** Whether to run on a terminal: `-t`/`-T` when given, else when both our stdin and stdout are terminals (as `ssh` decides). */
export function wantsTty(flag: boolean | undefined, stdinIsTty: boolean, stdoutIsTty: boolean): boolean {
  return flag ?? (stdinIsTty && stdoutIsTty);
}

/** The API's bounds on a window size (gateway/exec/tty.ts). */
const maxSide = 1000;

/** Our window's size, within the API's bounds; 24x80 when stdout is no terminal. */
export function windowSize(out: { isTTY?: boolean; rows?: number; columns?: number }): { rows: number; cols: number } {
  const clamp = (n: number | undefined, fallback: number) => (n && n > 0 ? Math.min(Math.floor(n), maxSide) : fallback);
  return out.isTTY ? { rows: clamp(out.rows, 24), cols: clamp(out.columns, 80) } : { rows: 24, cols: 80 };
}

export interface TtyOptions {
  cwd?: string;
  env?: Record<string, string>;
  user?: string;
  shell?: boolean;
}

/** The WebSocket's URL: the argv as `arg`s (or one `cmd` with --shell), the size, our TERM unless --env sets one. */
export function ttyUrl(
  config: Pick<CliConfig, "url" | "term">,
  id: string,
  words: readonly string[],
  o: TtyOptions,
  size: { rows: number; cols: number },
): string {
  const q = new URLSearchParams();
  if (o.shell) q.set("cmd", words.join(" "));
  else for (const w of words) q.append("arg", w);
  q.set("rows", String(size.rows));
  q.set("cols", String(size.cols));
  const env = { ...(config.term ? { TERM: config.term } : {}), ...o.env };
  for (const [name, value] of Object.entries(env)) q.append("env", `${name}=${value}`);
  if (o.cwd !== undefined) q.set("cwd", o.cwd);
  if (o.user !== undefined) q.set("user", o.user);
  const base = config.url.replace(/^http/, "ws");
  return `${base}/v1/agents/${encodeURIComponent(id)}/exec/tty?${q.toString()}`;
}

/** What the terminal guard needs of stdin and of the process (injected: tests drive it without a terminal). */
export interface GuardStdin {
  isTTY?: boolean;
  setRawMode?(raw: boolean): unknown;
  pause(): unknown;
}
export interface GuardProcess {
  on(event: "SIGINT" | "SIGTERM" | "SIGHUP" | "exit", fn: () => void): unknown;
  off(event: "SIGINT" | "SIGTERM" | "SIGHUP" | "exit", fn: () => void): unknown;
  exit(code: number): never;
}

/**
 * Our terminal in raw mode while the remote one runs, and back as it was however we leave: `restore` (idempotent)
 * on the way out, on process exit, and on SIGINT/SIGTERM/SIGHUP (which then end us with 128+N, as a shell reports it).
 */
export class TerminalGuard {
  private readonly stdin: GuardStdin;
  private readonly proc: GuardProcess;
  private raw = false;
  private readonly onExit = () => this.restore();
  private readonly handlers = new Map<"SIGINT" | "SIGTERM" | "SIGHUP", () => void>();
  /** Called on a signal after the terminal is restored (closes the socket). */
  onSignal: (() => void) | undefined;

  constructor(stdin: GuardStdin, proc: GuardProcess) {
    this.stdin = stdin;
    this.proc = proc;
  }

  enter(): void {
    this.proc.on("exit", this.onExit);
    for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"] as const) {
      const fn = () => {
        this.restore();
        this.onSignal?.();
        this.proc.exit(128 + constants.signals[sig]);
      };
      this.handlers.set(sig, fn);
      this.proc.on(sig, fn);
    }
    if (this.stdin.isTTY && this.stdin.setRawMode) {
      this.stdin.setRawMode(true);
      this.raw = true;
    }
  }

  /** Raw mode off and the handlers gone; safe to call again. */
  restore(): void {
    if (this.raw) {
      this.raw = false;
      this.stdin.setRawMode?.(false);
    }
    this.stdin.pause();
    this.proc.off("exit", this.onExit);
    for (const [sig, fn] of this.handlers) this.proc.off(sig, fn);
    this.handlers.clear();
  }

  get isRaw(): boolean {
    return this.raw;
  }
}

/** The status a shell gives what ended: the code, or 128+N for signal N (by name, as the API gives it). */
export function exitStatus(exit: { code: number | null; signal: string | null }): number {
  if (exit.signal) {
    const n = /^\d+$/.test(exit.signal) ? Number(exit.signal) : constants.signals[`SIG${exit.signal}` as keyof typeof constants.signals];
    return 128 + (n ?? 0);
  }
  return exit.code ?? 1;
}

/** The close's reason (the envelope, cut to fit) as the CLI's one line. */
function closeMessage(code: number, reason: string): string {
  try {
    const e = (JSON.parse(reason) as { error?: { code?: string; message?: string } }).error;
    if (e?.code) return `error ${e.code}: ${e.message ?? ""}`;
  } catch {
    /* plain text */
  }
  return `the terminal closed (${code}${reason ? `: ${reason}` : ""})`;
}

/**
 * Runs the command on a terminal in the agent and answers its exit status. A refusal before the upgrade (which the
 * WebSocket API does not show) is asked again as a plain GET, whose answer has the envelope.
 */
export async function runOnTty(config: CliConfig, id: string, words: readonly string[], o: TtyOptions): Promise<number> {
  if (!config.token) throw usageError(tokenHelp);
  const stdin = process.stdin;
  const stdout = process.stdout;
  const url = ttyUrl(config, id, words, o, windowSize(stdout));
  // Node's WebSocket (undici) takes headers besides the protocols: the bearer token as on every API call.
  const ws = new WebSocket(url, { headers: { authorization: `Bearer ${config.token}` } } as unknown as string[]);
  ws.binaryType = "arraybuffer";
  const opened = await new Promise<boolean>((resolve) => {
    ws.addEventListener("open", () => resolve(true), { once: true });
    ws.addEventListener("error", () => resolve(false), { once: true });
  });
  if (!opened) throw await whyRefused(config, url);

  const guard = new TerminalGuard(stdin, process);
  guard.onSignal = () => ws.close();
  let exit: { code: number | null; signal: string | null } | undefined;
  try {
    guard.enter();
    const onInput = (chunk: Buffer) => ws.send(new Uint8Array(chunk));
    const onResize = () => ws.send(JSON.stringify({ resize: windowSize(stdout) }));
    stdin.on("data", onInput);
    stdin.resume();
    stdout.on("resize", onResize);
    const closed = await new Promise<{ code: number; reason: string }>((resolve) => {
      ws.addEventListener("message", (e) => {
        if (typeof e.data !== "string") return void stdout.write(new Uint8Array(e.data as ArrayBuffer));
        let control: { exit?: { code: number | null; signal: string | null }; error?: unknown };
        try {
          control = JSON.parse(e.data) as typeof control;
        } catch {
          return;
        }
        if (control.exit) exit = control.exit;
        else if (typeof control.error === "string") process.stderr.write(`agentvm: ${control.error}\r\n`);
      });
      ws.addEventListener("close", (e) => resolve({ code: e.code, reason: e.reason }));
    });
    stdin.off("data", onInput);
    stdout.off("resize", onResize);
    if (exit) return exitStatus(exit);
    throw new CliError(exitCodes.server, closeMessage(closed.code, closed.reason));
  } finally {
    guard.restore();
  }
}

/** The refusal's envelope: the same URL as a plain GET answers it (auth, the agent, the query; anything past those is the upgrade's alone). */
async function whyRefused(config: CliConfig, url: string): Promise<CliError | unknown> {
  let res: Response;
  try {
    res = await fetch(url.replace(/^ws/, "http"), { headers: { authorization: `Bearer ${config.token}` } });
  } catch (err) {
    return fetchFailure(err, config);
  }
  const text = await res.text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  const plainGet = (body as { error?: { message?: string } } | null)?.error?.message?.startsWith("this route is a WebSocket") === true;
  if (res.status >= 400 && !plainGet) return failure(res.status, body);
  return new CliError(
    exitCodes.server,
    "the terminal could not be opened: its upgrade was refused once the agent was reached (an agent whose guest predates exec on a terminal needs a restart; -T runs without one)",
  );
}

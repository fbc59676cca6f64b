// Sends one request to the desktop helper (images/desktop/, in the desktop base) in an agent's VM through the exec path, and reads its answer whole.
//
// Runtime-free. The exec runs the base's `call` (a static C program): it takes a screenshot itself and hands
// actions to the resident helper the desktop session started (no interpreter starts per call), or runs the helper
// once when none answers. Both are programs of the base, outside what an image's own Containerfile touches; the exec
// runs as the image's user like any other, so the agent is woken and held awake while it runs (callGuest).
import type { AgentSpec } from "../../contracts/agent.ts";
import type { Fleet } from "../../contracts/fleet.ts";
import { AppError } from "../../lib/errors.ts";
import { callGuest } from "../exec/guest.ts";
import { encodeSpec, frameDecoder, frameType, parseExit, ShortFrame, type ExitStatus, type Frame } from "../../contracts/exec-wire.ts";
import { concatBytes } from "../../lib/bytes.ts";

/** Where the desktop base installs the helper's entry (images/desktop/call.c, compiled). */
export const helperCallPath = "/usr/lib/agentvm/desktop/call";
/** The largest answer taken from it: a PNG of a 3840x2160 screen stays well under this. */
const maxStdoutBytes = 48 * 1024 * 1024;
const maxStderrBytes = 4096;
/** Time the exec server has to answer the call's head, ms. */
const answerMs = 30_000;

/** What the helper is asked: `{cmd: "screenshot", scale?}` or `{cmd: "actions", actions, screenshot?, scale?}`. */
export type HelperRequest = { cmd: "screenshot"; scale?: number } | { cmd: "actions"; actions: unknown[]; screenshot: boolean; scale?: number };

export interface HelperCall {
  request: HelperRequest;
  requestId: string;
  signal?: AbortSignal;
  /** The helper's own limit (its waits included), ms. */
  timeoutMs: number;
}

export interface HelperAnswer {
  stdout: Uint8Array;
  /** The wake this call caused (`restore`, `boot`, …), from the host's `x-wake`; null when the agent was awake. */
  wake: string | null;
}

/**
 * Runs the helper and answers its stdout. Its refusals (exit 2: a coordinate off the screen, an unknown action) are
 * 400s with its reason; a helper that cannot start (an image without it) is `no_desktop`; any other failure is 502.
 */
export async function runHelper(fleet: Fleet, agent: AgentSpec, call: HelperCall): Promise<HelperAnswer> {
  // One JSON line (JSON.stringify escapes every newline inside strings).
  const stdin = new TextEncoder().encode(`${JSON.stringify(call.request)}\n`);
  const body = concatBytes(encodeSpec({ argv: [helperCallPath], timeoutMs: call.timeoutMs, stdin: true }), stdin);
  const res = await callGuest(fleet, agent, {
    method: "POST",
    path: "/v1/exec",
    body,
    headers: { "content-type": "application/octet-stream" },
    requestId: call.requestId,
    ...(call.signal ? { signal: call.signal } : {}),
    responseTimeoutMs: answerMs,
    idleTimeoutMs: call.timeoutMs + answerMs,
    reason: "desktop",
  });
  const wake = res.headers.get("x-wake");
  const out = await collect(res.body, agent.id);
  if (out.error !== undefined)
    throw new AppError(
      "no_desktop",
      `agent ${agent.id} has no desktop helper (${out.error.trim().slice(0, 200)}): its image is not built FROM agentvm/desktop:bookworm`,
    );
  const exit = out.exit;
  if (!exit) throw new AppError("bad_gateway", `agent ${agent.id}'s desktop helper ended without an exit status`);
  const stderr = new TextDecoder().decode(out.stderr).trim();
  if (exit.exitCode === 2) throw new AppError("bad_request", stderr.replace(/^refused: /, "").slice(0, 500) || "the desktop helper refused the call");
  if (exit.exitCode === 127) throw new AppError("no_desktop", `agent ${agent.id} has no desktop helper: its image is not built FROM agentvm/desktop:bookworm`);
  if (exit.exitCode !== 0) {
    const how = exit.timedOut ? "timed out" : exit.signal ? `was killed by ${exit.signal}` : `exited ${exit.exitCode}`;
    throw new AppError("bad_gateway", `agent ${agent.id}'s desktop helper ${how}${stderr ? `: ${stderr.slice(0, 500)}` : ""}`);
  }
  return { stdout: out.stdout, wake };
}

async function collect(
  body: ReadableStream<Uint8Array> | null,
  agentId: string,
): Promise<{ stdout: Uint8Array; stderr: Uint8Array; exit: ExitStatus | undefined; error: string | undefined }> {
  const stdout: Uint8Array[] = [];
  const stderr: Uint8Array[] = [];
  let outBytes = 0;
  let errBytes = 0;
  let exit: ExitStatus | undefined;
  let error: string | undefined;
  const status = new ShortFrame();
  if (!body) return { stdout: new Uint8Array(0), stderr: new Uint8Array(0), exit, error: "no answer" };
  const reader = body.pipeThrough(frameDecoder()).getReader();
  for (;;) {
    let next: ReadableStreamReadResult<Frame>;
    try {
      next = await reader.read();
    } catch (err) {
      if (exit) break;
      throw new AppError("bad_gateway", `agent ${agentId}'s exec stream broke: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    }
    if (next.done) break;
    const frame = next.value;
    if (frame.type === frameType.stdout) {
      outBytes += frame.payload.byteLength;
      if (outBytes > maxStdoutBytes) {
        void reader.cancel().catch(() => undefined);
        throw new AppError("bad_gateway", `agent ${agentId}'s desktop helper answered more than ${maxStdoutBytes} bytes`);
      }
      stdout.push(frame.payload.slice());
    } else if (frame.type === frameType.stderr) {
      if (errBytes < maxStderrBytes) stderr.push(frame.payload.slice(0, maxStderrBytes - errBytes));
      errBytes += frame.payload.byteLength;
    } else if (frame.type === frameType.exit || frame.type === frameType.error) {
      const text = status.add(frame);
      if (text === undefined) continue;
      if (frame.type === frameType.error) error = text;
      else exit = parseExit(text);
    }
  }
  return { stdout: concatBytes(...stdout), stderr: concatBytes(...stderr), exit, error };
}

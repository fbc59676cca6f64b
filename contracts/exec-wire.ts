// The exec server's wire protocol (fleet-agent/guest/guest-exec/, docs/exec.md) as its clients speak it: the gateway's exec API, and the host's warm-up of a reset standby (fleet-agent/drivers/qemu/standby.ts): the request's spec, the answer's frames, its exit line.
//
// Runtime-free: web streams and typed arrays only.

import { concatBytes } from "../lib/bytes.ts";
/** The header that carries a VM's exec key to its exec server; set by the host alone (the key never leaves it). */
export const execKeyHeader = "x-agentvm-exec-key";

/** The media type of a foreground exec's answer: frames until the connection closes. */
export const framesType = "application/vnd.agentvm.exec-frames";

export const frameType = { stdout: 1, stderr: 2, exit: 3, error: 4 } as const;

/** The request body's frames after the spec of an exec on a terminal (`tty`): bytes typed, and window sizes. */
export const inputFrameType = { data: 1, resize: 5 } as const;

/** A terminal's window size, each 1..65535 on the wire (the API takes less). */
export interface TtySize {
  rows: number;
  cols: number;
}

/** The largest frame the gateway accepts (the exec server sends at most a pipe's worth): beyond it the stream is bad. */
export const maxFramePayload = 16 * 1024 * 1024;

/** What one command is run with (the spec's `key=value` strings). */
export interface ExecSpec {
  argv: readonly string[];
  env?: Readonly<Record<string, string>>;
  cwd?: string;
  user?: string;
  /** 0: none. */
  timeoutMs?: number;
  background?: boolean;
  /** The rest of the request body is the process's stdin (EOF at its end); without it stdin is /dev/null. */
  stdin?: boolean;
  /**
   * On a pseudo-terminal of this size (foreground only; protocol v2): one output stream (stdout frames), and the rest
   * of the request body is input frames (`inputFrameType`) until its end, which hangs the command up (SIGHUP).
   */
  tty?: TtySize;
}

const encoder = new TextEncoder();

/**
 * The spec as the request body opens: a 4-byte big-endian length N, then N bytes of NUL-terminated `key=value`
 * strings (`arg=` repeated in order, `env=NAME=VALUE` repeated, `cwd=`, `user=`, `timeout_ms=`, `background=1`,
 * `stdin=1`, `tty=<rows>x<cols>`). A NUL inside a value cannot be carried: the schemas refuse it before this.
 */
export function encodeSpec(spec: ExecSpec): Uint8Array<ArrayBuffer> {
  const lines: string[] = spec.argv.map((a) => `arg=${a}`);
  for (const [name, value] of Object.entries(spec.env ?? {})) lines.push(`env=${name}=${value}`);
  if (spec.cwd !== undefined) lines.push(`cwd=${spec.cwd}`);
  if (spec.user !== undefined) lines.push(`user=${spec.user}`);
  if (spec.timeoutMs !== undefined) lines.push(`timeout_ms=${spec.timeoutMs}`);
  if (spec.background) lines.push("background=1");
  if (spec.stdin) lines.push("stdin=1");
  if (spec.tty) lines.push(`tty=${spec.tty.rows}x${spec.tty.cols}`);
  for (const line of lines) if (line.includes("\0")) throw new Error("an exec spec string holds a NUL");
  const body = encoder.encode(lines.map((l) => `${l}\0`).join(""));
  const out = new Uint8Array(4 + body.byteLength);
  new DataView(out.buffer).setUint32(0, body.byteLength);
  out.set(body, 4);
  return out;
}

/** A window size as the input frame the exec server reads (`rows=<n> cols=<n>`). */
export function resizeFrame(size: TtySize): Uint8Array<ArrayBuffer> {
  return encodeFrame(inputFrameType.resize, encoder.encode(`rows=${size.rows} cols=${size.cols}`));
}

/** An exec server of protocol v1 refuses a spec with `tty=` this way (a 400 naming the entry it does not know). */
export function isOldGuestTtyRefusal(code: string, message: string): boolean {
  return code === "bad_request" && message.startsWith("unknown spec entry: tty=");
}

/** The spec's strings back (the fake exec server of the tests, and a check of the encoding). */
export function decodeSpec(bytes: Uint8Array): { spec: string[]; rest: Uint8Array } {
  if (bytes.byteLength < 4) throw new Error("spec length missing");
  const n = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength).getUint32(0);
  if (bytes.byteLength < 4 + n) throw new Error("spec shorter than its length");
  const text = new TextDecoder().decode(bytes.subarray(4, 4 + n));
  const spec = text.split("\0");
  if (spec.pop() !== "") throw new Error("spec's last string is not NUL-terminated");
  return { spec, rest: bytes.subarray(4 + n) };
}

/** One frame of a foreground exec's answer. */
export interface Frame {
  type: number;
  payload: Uint8Array;
  /** The frame's last piece (a frame may come in several). */
  last: boolean;
}

/** One frame as bytes: `[u8 type][u32 big-endian length][payload]`. */
export function encodeFrame(type: number, payload: Uint8Array): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(5 + payload.byteLength);
  out[0] = type;
  new DataView(out.buffer).setUint32(1, payload.byteLength);
  out.set(payload, 5);
  return out;
}

/**
 * The answer's bytes as frames, however the bytes are cut; a payload is handed on as it arrives (a large stdout frame
 * becomes several `Frame` pieces, the last one marked: nothing is held beyond one chunk). A stream that ends inside a frame,
 * or a frame past `maxFramePayload`, errors.
 */
export function frameDecoder(): TransformStream<Uint8Array, Frame> {
  const head = new Uint8Array(5);
  let headLen = 0;
  let type = 0;
  let left = 0;
  return new TransformStream<Uint8Array, Frame>({
    transform(chunk, controller) {
      let i = 0;
      while (i < chunk.byteLength) {
        if (left === 0 && headLen < 5) {
          const take = Math.min(5 - headLen, chunk.byteLength - i);
          head.set(chunk.subarray(i, i + take), headLen);
          headLen += take;
          i += take;
          if (headLen < 5) break;
          type = head[0]!;
          left = new DataView(head.buffer).getUint32(1);
          if (left > maxFramePayload) throw new Error(`exec frame of ${left} bytes`);
          if (left === 0) {
            controller.enqueue({ type, payload: new Uint8Array(0), last: true });
            headLen = 0;
          }
          continue;
        }
        const take = Math.min(left, chunk.byteLength - i);
        left -= take;
        controller.enqueue({ type, payload: chunk.subarray(i, i + take), last: left === 0 });
        i += take;
        if (left === 0) headLen = 0;
      }
    },
    flush() {
      if (headLen !== 0 || left !== 0) throw new Error("exec stream ended inside a frame");
    },
  });
}

/** Short frames (exit, error) read whole: the pieces of one frame joined until its last. */
export class ShortFrame {
  private parts: Uint8Array[] = [];
  private bytes = 0;

  /** Adds a piece; answers the frame's text once its last piece came, else undefined. */
  add(frame: Frame): string | undefined {
    this.bytes += frame.payload.byteLength;
    if (this.bytes > 64 * 1024) throw new Error("exec status frame too long");
    this.parts.push(frame.payload);
    if (!frame.last) return undefined;
    const out = concatBytes(...this.parts);
    this.parts = [];
    this.bytes = 0;
    return new TextDecoder().decode(out);
  }
}

/** How a command ended: `code=<n>` or `signal=<n>`, then ` timeout=1` when its timeout killed it, then ` ms=<duration>`. */
export interface ExitStatus {
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean;
  durationMs: number;
}

export function parseExit(text: string): ExitStatus {
  const fields = new Map<string, string>();
  for (const part of text.trim().split(/\s+/)) {
    const eq = part.indexOf("=");
    if (eq > 0) fields.set(part.slice(0, eq), part.slice(eq + 1));
  }
  const code = fields.get("code");
  const signal = fields.get("signal");
  const ms = Number(fields.get("ms"));
  if (code === undefined && signal === undefined) throw new Error(`exit frame without code or signal: ${text.slice(0, 100)}`);
  return {
    exitCode: code !== undefined && /^-?\d+$/.test(code) ? Number(code) : null,
    signal: signal !== undefined ? signalName(Number(signal)) : null,
    timedOut: fields.get("timeout") === "1",
    durationMs: Number.isFinite(ms) && ms >= 0 ? ms : 0,
  };
}

/** Linux's signal numbers by the names the API takes and gives (without `SIG`). */
export const signalNumbers: Readonly<Record<string, number>> = {
  HUP: 1,
  INT: 2,
  QUIT: 3,
  ILL: 4,
  TRAP: 5,
  ABRT: 6,
  BUS: 7,
  FPE: 8,
  KILL: 9,
  USR1: 10,
  SEGV: 11,
  USR2: 12,
  PIPE: 13,
  ALRM: 14,
  TERM: 15,
  CHLD: 17,
  CONT: 18,
  STOP: 19,
  TSTP: 20,
};

const signalNames = new Map(Object.entries(signalNumbers).map(([name, n]) => [n, name]));

/** A signal's name as the API gives it (`KILL`), or its number as text when it has no name here. */
export function signalName(n: number): string {
  return signalNames.get(n) ?? String(n);
}

// A test client of the exec server's wire protocol (fleet-agent/guest/guest-exec/, docs/exec.md) over real HTTP:
// the spec encoding, the frames of a foreground exec, and plain requests with the key.
import { requestOptions } from "../../lib/node-net.ts";
import { request } from "node:http";
import type { ExecTarget } from "../../fleet-agent/drivers/driver.ts";

export interface ExecSpec {
  cmd: string[];
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  timeoutMs?: number;
  background?: boolean;
  /** Sent after the spec as the rest of the body (stdin=1). */
  stdin?: Buffer | string;
  /** On a terminal of this size (tty=<rows>x<cols>): the body after the spec is input frames. */
  tty?: { rows: number; cols: number };
}

/** The body's head: a 4-byte big-endian length, then NUL-terminated key=value strings. */
export function encodeSpec(s: ExecSpec): Buffer {
  const parts = s.cmd.map((a) => `arg=${a}`);
  for (const [k, v] of Object.entries(s.env ?? {})) parts.push(`env=${k}=${v}`);
  if (s.cwd) parts.push(`cwd=${s.cwd}`);
  if (s.user) parts.push(`user=${s.user}`);
  if (s.timeoutMs !== undefined) parts.push(`timeout_ms=${s.timeoutMs}`);
  if (s.background) parts.push("background=1");
  if (s.stdin !== undefined) parts.push("stdin=1");
  if (s.tty) parts.push(`tty=${s.tty.rows}x${s.tty.cols}`);
  const spec = Buffer.from(parts.map((p) => `${p}\0`).join(""), "utf8");
  const len = Buffer.alloc(4);
  len.writeUInt32BE(spec.length);
  return Buffer.concat([len, spec]);
}

export interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
}

/** One request to the exec server with the target's key (or `key`), the whole answer read. */
export function execRequest(
  t: ExecTarget,
  method: string,
  path: string,
  body?: Buffer | string,
  opts: { key?: string | null; headers?: Record<string, string>; timeoutMs?: number } = {},
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = { ...opts.headers };
    const key = opts.key === undefined ? t.key : opts.key;
    if (key !== null) headers["x-agentvm-exec-key"] = key;
    if (body !== undefined) headers["content-length"] = String(Buffer.byteLength(body));
    const req = request({ ...requestOptions(t), method, path, headers, agent: false, timeout: opts.timeoutMs ?? 60_000 }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on("error", reject);
    });
    req.on("timeout", () => req.destroy(new Error(`${method} ${path}: timed out`)));
    req.on("error", reject);
    req.end(body);
  });
}

export interface ExecResult {
  stdout: Buffer;
  stderr: Buffer;
  /** The exit frame's text, e.g. `code=0 ms=12`. */
  exit: string;
  code: number | null;
  signal: number | null;
  timedOut: boolean;
  errors: string[];
}

/** Splits an exec answer's body into its frames ([u8 type][u32 BE length][payload]). */
export function parseFrames(body: Buffer): ExecResult {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  const errors: string[] = [];
  let exit = "";
  for (let i = 0; i + 5 <= body.length; ) {
    const type = body[i]!;
    const len = body.readUInt32BE(i + 1);
    const payload = body.subarray(i + 5, i + 5 + len);
    if (type === 1) out.push(payload);
    else if (type === 2) err.push(payload);
    else if (type === 3) exit = payload.toString();
    else if (type === 4) errors.push(payload.toString());
    i += 5 + len;
  }
  const code = /(?:^| )code=(\d+)/.exec(exit);
  const signal = /(?:^| )signal=(\d+)/.exec(exit);
  return {
    stdout: Buffer.concat(out),
    stderr: Buffer.concat(err),
    exit,
    code: code ? Number(code[1]) : null,
    signal: signal ? Number(signal[1]) : null,
    timedOut: / timeout=1/.test(exit),
    errors,
  };
}

/** A foreground exec, its output collected. */
export async function execRun(t: ExecTarget, s: ExecSpec): Promise<ExecResult & { status: number }> {
  const body = s.stdin === undefined ? encodeSpec(s) : Buffer.concat([encodeSpec(s), Buffer.from(s.stdin)]);
  const a = await execRequest(t, "POST", "/v1/exec", body);
  if (a.status !== 200) throw new Error(`exec answered ${a.status}: ${a.body.toString()}`);
  return { status: a.status, ...parseFrames(a.body) };
}

/** A terminal's input frame: 1 bytes typed, 5 a window size (`rows=<n> cols=<n>`). */
export function inputFrame(type: 1 | 5, payload: string | Buffer): Buffer {
  const bytes = Buffer.from(payload);
  const head = Buffer.alloc(5);
  head[0] = type;
  head.writeUInt32BE(bytes.length, 1);
  return Buffer.concat([head, bytes]);
}

/** A foreground exec on a terminal: the spec and `input` frames sent, the body left open (its end would hang the command up) until the answer ends. */
export function execTty(t: ExecTarget, s: ExecSpec & { tty: { rows: number; cols: number } }, input: Buffer[]): Promise<ExecResult & { status: number }> {
  return new Promise((resolve, reject) => {
    const headers = { "x-agentvm-exec-key": t.key, "transfer-encoding": "chunked" };
    const req = request({ ...requestOptions(t), method: "POST", path: "/v1/exec", headers, agent: false, timeout: 60_000 }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        req.destroy();
        resolve({ status: res.statusCode ?? 0, ...parseFrames(Buffer.concat(chunks)) });
      });
      res.on("error", reject);
    });
    req.on("timeout", () => req.destroy(new Error("exec on a terminal: timed out")));
    req.on("error", reject);
    req.write(encodeSpec(s));
    for (const frame of input) req.write(frame);
  });
}

/** stdout of a command as text (throws unless it exits 0). */
export async function sh(t: ExecTarget, script: string, opts: Omit<ExecSpec, "cmd"> = {}): Promise<string> {
  const r = await execRun(t, { cmd: ["/bin/sh", "-c", script], ...opts });
  if (r.code !== 0) throw new Error(`${script}: ${r.exit} ${r.stderr.toString()} ${r.errors.join(" ")}`);
  return r.stdout.toString();
}

/** A minimal ustar archive of the given entries (tests only: short names). */
export function makeTar(
  entries: { name: string; type?: "file" | "dir" | "symlink"; data?: string; mode?: number; uid?: number; gid?: number; link?: string }[],
): Buffer {
  const blocks: Buffer[] = [];
  for (const e of entries) {
    const h = Buffer.alloc(512);
    const data = Buffer.from(e.data ?? "");
    const type = e.type === "dir" ? "5" : e.type === "symlink" ? "2" : "0";
    h.write(e.name, 0, 100);
    h.write(`${(e.mode ?? (type === "5" ? 0o755 : 0o644)).toString(8).padStart(7, "0")}\0`, 100);
    h.write(`${(e.uid ?? 0).toString(8).padStart(7, "0")}\0`, 108);
    h.write(`${(e.gid ?? 0).toString(8).padStart(7, "0")}\0`, 116);
    h.write(`${(type === "0" ? data.length : 0).toString(8).padStart(11, "0")}\0`, 124);
    h.write(
      `${Math.floor(Date.now() / 1000)
        .toString(8)
        .padStart(11, "0")}\0`,
      136,
    );
    h.write(type, 156);
    if (e.link) h.write(e.link, 157, 100);
    h.write("ustar\0", 257);
    h.write("00", 263);
    h.fill(" ", 148, 156);
    let sum = 0;
    for (const b of h) sum += b;
    h.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148);
    blocks.push(h);
    if (type === "0" && data.length) {
      blocks.push(data, Buffer.alloc((512 - (data.length % 512)) % 512));
    }
  }
  blocks.push(Buffer.alloc(1024));
  return Buffer.concat(blocks);
}

/** The names (and link targets) in a ustar/pax archive (tests only). */
export function listTar(tar: Buffer): { name: string; type: string; size: number; mode: number; uid: number; link: string; data: Buffer }[] {
  const out: { name: string; type: string; size: number; mode: number; uid: number; link: string; data: Buffer }[] = [];
  let paxPath: string | undefined;
  for (let i = 0; i + 512 <= tar.length; ) {
    const h = tar.subarray(i, i + 512);
    if (h.every((b) => b === 0)) break;
    const str = (a: number, n: number) =>
      h
        .subarray(a, a + n)
        .toString()
        .replace(/\0.*$/s, "");
    const size = Number.parseInt(str(124, 12) || "0", 8);
    const type = String.fromCharCode(h[156]!) || "0";
    const data = tar.subarray(i + 512, i + 512 + size);
    i += 512 + Math.ceil(size / 512) * 512;
    if (type === "x") {
      const m = /\d+ path=([^\n]*)\n/.exec(data.toString());
      paxPath = m?.[1];
      continue;
    }
    const prefix = str(345, 155);
    const name = paxPath ?? (prefix ? `${prefix}/${str(0, 100)}` : str(0, 100));
    paxPath = undefined;
    out.push({ name, type, size, mode: Number.parseInt(str(100, 8), 8), uid: Number.parseInt(str(108, 8), 8), link: str(157, 100), data: Buffer.from(data) });
  }
  return out;
}

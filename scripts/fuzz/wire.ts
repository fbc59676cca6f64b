// Sends one fuzz request and reads its answer: undici for well-formed requests, a raw node:net socket for bad framing.
import { connect, type Socket } from "node:net";
import { Readable } from "node:stream";
import { Agent, request } from "undici";
import type { BodyPlan, Framing } from "./plan.ts";

/** A request as it goes on the wire. */
export interface WireRequest {
  method: string;
  /** Path and query, sent as they are. */
  target: string;
  headers: [string, string][];
  body: Buffer | undefined;
  framing: Framing;
  transport: "undici" | "raw";
  trickleMs: number;
}

export interface Answer {
  /** Undefined when the connection ended with no answer (or an answer that did not parse). */
  status: number | undefined;
  headers: Record<string, string[]>;
  body: Buffer;
  /** True when the fuzzer stopped reading a body that was still coming (a followed log, a stream). */
  bodyCut: boolean;
  /** What went wrong on the client's side: a timeout, a reset, a malformed answer. */
  error: string | undefined;
  ms: number;
}

/** The most of an answer's body the fuzzer keeps (an error is far smaller; a success may be a long list). */
const maxKept = 4 * 1024 * 1024;
/** How long a success's body may keep coming before the fuzzer stops reading (logs with follow=1 never end). */
const streamReadMs = 2000;

export function bodyBytes(plan: BodyPlan): Buffer {
  switch (plan.kind) {
    case "json":
      return Buffer.from(JSON.stringify(plan.value) ?? "null");
    case "text":
      return Buffer.from(plan.text);
    case "bytes":
      return Buffer.from(plan.bytes);
    case "unknownFields":
      return Buffer.from(`{${Array.from({ length: plan.n }, (_, i) => `"f${i}":0`).join(",")}}`);
    case "deep":
      return Buffer.from(plan.objects ? `${'{"a":'.repeat(plan.depth)}1${"}".repeat(plan.depth)}` : `${"[".repeat(plan.depth)}${"]".repeat(plan.depth)}`);
    case "sized": {
      const overhead = `{"${plan.field}":""}`.length;
      return Buffer.from(`{"${plan.field}":"${"a".repeat(Math.max(0, plan.bytes - overhead))}"}`);
    }
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function pieces(body: Buffer, n: number): Buffer[] {
  const size = Math.max(1, Math.ceil(body.length / n));
  const out: Buffer[] = [];
  for (let at = 0; at < body.length; at += size) out.push(body.subarray(at, at + size));
  return out;
}

/** Sends `req` to `origin` (`http://127.0.0.1:port`) and answers what came back within `timeoutMs`. */
export function send(origin: string, req: WireRequest, dispatcher: Agent, timeoutMs: number): Promise<Answer> {
  return req.transport === "undici" ? viaUndici(origin, req, dispatcher, timeoutMs) : viaSocket(origin, req, timeoutMs);
}

async function viaUndici(origin: string, req: WireRequest, dispatcher: Agent, timeoutMs: number): Promise<Answer> {
  const started = Date.now();
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(new Error("timeout")), timeoutMs);
  const flat = req.headers.flat();
  // No length given: undici sends a stream chunked.
  const body = req.body && req.framing === "chunked" ? Readable.from(pieces(req.body, 3)) : req.body;
  try {
    const res = await request(`${origin}${req.target}`, { method: req.method as "GET", headers: flat, body, signal: abort.signal, dispatcher });
    const headers: Record<string, string[]> = {};
    for (const [k, v] of Object.entries(res.headers)) headers[k] = Array.isArray(v) ? v : v === undefined ? [] : [v];
    const chunks: Buffer[] = [];
    let kept = 0;
    let bodyCut = false;
    const cutTimer = res.statusCode < 400 ? setTimeout(() => ((bodyCut = true), abort.abort(new Error("stream cut"))), streamReadMs) : undefined;
    try {
      for await (const c of res.body) {
        kept += c.length;
        if (kept <= maxKept) chunks.push(c as Buffer);
        else {
          bodyCut = true;
          break;
        }
      }
    } catch (err) {
      if (!bodyCut) throw err;
    } finally {
      clearTimeout(cutTimer);
      if (bodyCut) res.body.destroy();
    }
    return { status: res.statusCode, headers, body: Buffer.concat(chunks), bodyCut, error: undefined, ms: Date.now() - started };
  } catch (err) {
    return {
      status: undefined,
      headers: {},
      body: Buffer.alloc(0),
      bodyCut: false,
      error: `${(err as Error).name}: ${(err as Error).message}`,
      ms: Date.now() - started,
    };
  } finally {
    clearTimeout(timer);
  }
}

async function viaSocket(origin: string, req: WireRequest, timeoutMs: number): Promise<Answer> {
  const started = Date.now();
  const url = new URL(origin);
  const socket = connect({ host: url.hostname, port: Number(url.port) });
  socket.setNoDelay(true);
  const answer = readAnswer(socket, req.method === "HEAD", timeoutMs, started);
  socket.on("error", () => {});
  await new Promise<void>((r) => {
    socket.once("connect", () => r());
    socket.once("error", () => r());
  });
  void writeRequest(socket, req, url.host).catch(() => {});
  return answer;
}

async function writeRequest(socket: Socket, req: WireRequest, host: string): Promise<void> {
  const body = req.body ?? Buffer.alloc(0);
  const lines = [`${req.method} ${req.target} HTTP/1.1`, `Host: ${host}`, ...req.headers.map(([k, v]) => `${k}: ${v}`)];
  const chunked = req.framing === "chunked" || req.framing === "trickleChunked" || req.framing === "badChunk";
  if (req.body && !chunked) {
    const declared = req.framing === "short" ? body.length + 10 : req.framing === "long" ? Math.max(0, body.length - 5) : body.length;
    lines.push(`Content-Length: ${declared}`);
  }
  if (req.body && chunked) lines.push("Transfer-Encoding: chunked");
  lines.push("Connection: close", "", "");
  const write = (b: Buffer | string) => (socket.destroyed ? false : socket.write(b));
  // A big body goes in slices, and stops once the server has answered (it may answer early and close): what it sent
  // before it closed is then still read, instead of being lost to the reset an unread upload causes.
  const writeAll = async (b: Buffer) => {
    for (let at = 0; at < b.length && !socket.destroyed && socket.bytesRead === 0; at += 64 * 1024) {
      if (!write(b.subarray(at, at + 64 * 1024))) await new Promise<void>((r) => (socket.once("drain", r), socket.once("close", r)));
    }
  };
  write(Buffer.from(lines.join("\r\n"), "utf8"));
  if (!req.body) return;
  const chunk = (b: Buffer) => Buffer.concat([Buffer.from(`${b.length.toString(16)}\r\n`), b, Buffer.from("\r\n")]);
  switch (req.framing) {
    case "length":
    case "long":
    case "none":
      await writeAll(body);
      return;
    case "chunked":
      for (const p of pieces(body, 3)) await writeAll(chunk(p));
      if (socket.bytesRead === 0) write("0\r\n\r\n");
      return;
    case "badChunk":
      write(`zz\r\n${body.subarray(0, 16).toString("latin1")}\r\n0\r\n\r\n`);
      return;
    case "short":
      await writeAll(body);
      await sleep(300);
      socket.end();
      return;
    case "abort":
      write(body.subarray(0, Math.floor(body.length / 2)));
      await sleep(50);
      socket.destroy();
      return;
    case "trickle":
      for (const p of pieces(body, 8)) {
        write(p);
        await sleep(req.trickleMs);
      }
      return;
    case "trickleChunked":
      for (const p of pieces(body, 8)) {
        write(chunk(p));
        await sleep(req.trickleMs);
      }
      write("0\r\n\r\n");
      return;
  }
}

/** Reads one HTTP/1.1 answer off a socket (skipping a `100 Continue`): length-delimited, chunked, or to the close. */
function readAnswer(socket: Socket, head: boolean, timeoutMs: number, started: number): Promise<Answer> {
  return new Promise((resolve) => {
    let buf = Buffer.alloc(0);
    let done = false;
    let cutTimer: NodeJS.Timeout | undefined;
    const finish = (a: Omit<Answer, "ms">) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      clearTimeout(cutTimer);
      socket.destroy();
      resolve({ ...a, ms: Date.now() - started });
    };
    const timer = setTimeout(
      () => finish({ ...(parse(true) ?? { status: undefined, headers: {}, body: Buffer.alloc(0), bodyCut: false }), error: "timeout" }),
      timeoutMs,
    );
    const parse = (ended: boolean): Omit<Answer, "ms" | "error"> | undefined => {
      for (;;) {
        const end = buf.indexOf("\r\n\r\n");
        if (end < 0) return undefined;
        const [statusLine, ...headerLines] = buf.subarray(0, end).toString("latin1").split("\r\n");
        const m = /^HTTP\/1\.[01] (\d{3})/.exec(statusLine ?? "");
        if (!m) return { status: undefined, headers: {}, body: buf, bodyCut: false };
        const status = Number(m[1]);
        const headers: Record<string, string[]> = {};
        for (const l of headerLines) {
          const i = l.indexOf(":");
          if (i > 0) (headers[l.slice(0, i).trim().toLowerCase()] ??= []).push(l.slice(i + 1).trim());
        }
        const rest = buf.subarray(end + 4);
        if (status === 100) {
          buf = rest;
          continue;
        }
        if (head || status === 204 || status === 304) return { status, headers, body: Buffer.alloc(0), bodyCut: false };
        const length = headers["content-length"]?.[0];
        if (length !== undefined)
          return rest.length >= Number(length)
            ? { status, headers, body: rest.subarray(0, Number(length)), bodyCut: false }
            : ended
              ? { status, headers, body: rest, bodyCut: true }
              : undefined;
        if (headers["transfer-encoding"]?.some((v) => /chunked/i.test(v))) {
          const decoded = dechunk(rest);
          if (decoded.complete) return { status, headers, body: decoded.body, bodyCut: false };
          return ended ? { status, headers, body: decoded.body, bodyCut: true } : undefined;
        }
        return ended ? { status, headers, body: rest, bodyCut: false } : undefined;
      }
    };
    socket.on("data", (d: Buffer) => {
      buf = buf.length > maxKept ? buf : Buffer.concat([buf, d]);
      const a = parse(false);
      if (a) return finish({ ...a, error: undefined });
      // A success whose body keeps coming (a followed log): read it for a while, then stop.
      if (!cutTimer && buf.indexOf("\r\n\r\n") >= 0 && /^HTTP\/1\.[01] [23]/.test(buf.toString("latin1", 0, 12)))
        cutTimer = setTimeout(
          () => finish({ ...(parse(true) ?? { status: undefined, headers: {}, body: buf, bodyCut: true }), bodyCut: true, error: undefined }),
          streamReadMs,
        );
    });
    const ended = (error: string | undefined) => () => {
      const a = parse(true);
      finish(
        a
          ? { ...a, error: undefined }
          : { status: undefined, headers: {}, body: buf, bodyCut: false, error: error ?? (buf.length > 0 ? "unparsable answer" : "closed without an answer") },
      );
    };
    socket.on("end", ended(undefined));
    socket.on("close", ended(undefined));
    socket.on("error", (err) => ended(`${err.name}: ${err.message}`)());
  });
}

function dechunk(b: Buffer): { body: Buffer; complete: boolean } {
  const out: Buffer[] = [];
  let at = 0;
  for (;;) {
    const eol = b.indexOf("\r\n", at);
    if (eol < 0) return { body: Buffer.concat(out), complete: false };
    const size = parseInt(b.subarray(at, eol).toString("latin1"), 16);
    if (!Number.isFinite(size)) return { body: Buffer.concat(out), complete: false };
    if (size === 0) return { body: Buffer.concat(out), complete: true };
    if (b.length < eol + 2 + size + 2) return { body: Buffer.concat(out), complete: false };
    out.push(b.subarray(eol + 2, eol + 2 + size));
    at = eol + 2 + size + 2;
  }
}

export { Agent };

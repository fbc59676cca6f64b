// A slow model on the host's loopback for the doze's tests and bench: answers after a wait, then streams tokens as OpenAI's SSE does, and records each call's timings.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AppError } from "../../lib/errors.ts";

export interface SlowModelOptions {
  /** From the end of a request to the first byte of its answer (head and first token together), ms. */
  firstByteMs: number;
  /** Token chunks per answer; the final chunk (usage) and `[DONE]` come `gapMs` after the last. */
  tokens: number;
  /** Between two chunks, ms. */
  gapMs: number;
  /** Also serve HTTPS with a self-signed certificate for 127.0.0.1 made at start by `openssl` (`certPem`). */
  tls?: boolean;
}

/** What one call did, on the host's clocks: monotonic ms (`performance.now()`) and wall ms with sub-ms digits. */
export interface ModelCall {
  /** The call's number, from 0, in order of arrival. */
  index: number;
  method: string;
  path: string;
  /** The plan it was answered by (the server's, or the path's `/slow/<firstByteMs>/<tokens>/<gapMs>`). */
  plan: { firstByteMs: number; tokens: number; gapMs: number };
  arrivedAt: number;
  /** The request's body ended: the wait for the first byte starts here. */
  requestEndedAt?: number;
  firstByteAt?: number;
  firstByteWallMs?: number;
  endedAt?: number;
  /** Body bytes written (the SSE text). */
  bytes: number;
  /** FNV-1a (32 bits, hex) of the body written: what the client should have received. */
  fnv: string;
  /** The client's connection closed before the answer ended. */
  closedEarly: boolean;
}

/** Host wall-clock ms with sub-ms digits (comparable with a guest's clock once it is fixed). */
export const wallMs = () => performance.timeOrigin + performance.now();

/** FNV-1a, 32 bits, over bytes, continued from `hash` (start: `FNV_START`): cheap to compute on both sides (demo-agent/fetch.c). */
export const FNV_START = 0x811c9dc5;
export function fnv1a(bytes: Uint8Array, hash = FNV_START): number {
  let h = hash;
  for (const b of bytes) h = Math.imul(h ^ b, 0x01000193) >>> 0;
  return h;
}
export const fnvHex = (h: number) => h.toString(16).padStart(8, "0");

/** One SSE event of a chat completion chunk, OpenAI style. */
function chunkEvent(callIndex: number, delta: Record<string, unknown>, finish: string | null, usage?: Record<string, number>): string {
  const body = {
    id: `chatcmpl-slow${callIndex}`,
    object: "chat.completion.chunk",
    model: "slow-model",
    choices: [{ index: 0, delta, finish_reason: finish }],
    ...(usage ? { usage } : {}),
  };
  return `data: ${JSON.stringify(body)}\n\n`;
}

/** The plan a path asks for: `/slow/<firstByteMs>/<tokens>/<gapMs>` (a guest URL cannot carry a query of its own), else the server's. */
function planOf(path: string, fallback: ModelCall["plan"]): ModelCall["plan"] {
  const m = /^\/slow\/(\d+)\/(\d+)\/(\d+)(?:[/?]|$)/.exec(path);
  return m
    ? { firstByteMs: Number(m[1]), tokens: Number(m[2]), gapMs: Number(m[3]) }
    : { firstByteMs: fallback.firstByteMs, tokens: fallback.tokens, gapMs: fallback.gapMs };
}

export class SlowModel {
  readonly calls: ModelCall[] = [];
  /** The plain HTTP port on 127.0.0.1 (after `start`). */
  port = 0;
  /** The HTTPS port when `tls` (after `start`). */
  tlsPort: number | undefined;
  /** The self-signed certificate the HTTPS listener presents (PEM), for a client to trust. */
  certPem: string | undefined;
  private readonly options: SlowModelOptions;
  private readonly servers: Server[] = [];
  private readonly timers = new Set<NodeJS.Timeout>();

  constructor(options: SlowModelOptions) {
    this.options = options;
  }

  static async start(options: SlowModelOptions): Promise<SlowModel> {
    const model = new SlowModel(options);
    const plain = createServer((req, res) => model.answer(req, res));
    model.port = await listen(plain);
    model.servers.push(plain);
    if (options.tls) {
      const { key, cert } = selfSignedCert();
      const secure = createHttpsServer({ key, cert }, (req, res) => model.answer(req, res));
      model.tlsPort = await listen(secure);
      model.certPem = cert;
      model.servers.push(secure);
    }
    return model;
  }

  /** `http://127.0.0.1:<port><path>` (default: the server's plan). */
  url(path = "/v1/chat/completions"): string {
    return `http://127.0.0.1:${this.port}${path}`;
  }

  /** A path that asks for its own plan. */
  static path(plan: { firstByteMs: number; tokens: number; gapMs: number }): string {
    return `/slow/${plan.firstByteMs}/${plan.tokens}/${plan.gapMs}`;
  }

  /** Calls whose answer has not ended and whose client is still there. */
  open(): number {
    return this.calls.filter((c) => c.endedAt === undefined && !c.closedEarly).length;
  }

  async close(): Promise<void> {
    for (const t of this.timers) clearTimeout(t);
    this.timers.clear();
    await Promise.all(
      this.servers.map(
        (s) =>
          new Promise<void>((resolve) => {
            s.close(() => resolve());
            s.closeAllConnections();
          }),
      ),
    );
  }

  private later(fn: () => void, ms: number): void {
    const t = setTimeout(() => {
      this.timers.delete(t);
      fn();
    }, ms);
    this.timers.add(t);
  }

  private answer(req: IncomingMessage, res: ServerResponse): void {
    const path = req.url ?? "/";
    const call: ModelCall = {
      index: this.calls.length,
      method: req.method ?? "GET",
      path,
      plan: planOf(path, this.options),
      arrivedAt: performance.now(),
      bytes: 0,
      fnv: fnvHex(FNV_START),
      closedEarly: false,
    };
    this.calls.push(call);
    let hash = FNV_START;
    res.on("close", () => {
      if (!res.writableFinished) call.closedEarly = true;
    });
    const write = (text: string, end = false) => {
      if (res.destroyed) return;
      const bytes = Buffer.from(text);
      hash = fnv1a(bytes, hash);
      call.bytes += bytes.length;
      call.fnv = fnvHex(hash);
      if (end) {
        res.end(bytes);
        call.endedAt = performance.now();
      } else res.write(bytes);
    };
    req.resume(); // a body, if any, is read and dropped
    req.once("end", () => {
      call.requestEndedAt = performance.now();
      const { firstByteMs, tokens, gapMs } = call.plan;
      this.later(() => {
        if (res.destroyed) return;
        res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
        call.firstByteAt = performance.now();
        call.firstByteWallMs = wallMs();
        write(chunkEvent(call.index, { role: "assistant", content: "tok0 " }, null));
        for (let i = 1; i < tokens; i++) this.later(() => write(chunkEvent(call.index, { content: `tok${i} ` }, null)), gapMs * i);
        const usage = { prompt_tokens: 7, completion_tokens: tokens, total_tokens: 7 + tokens };
        this.later(() => write(`${chunkEvent(call.index, {}, "stop", usage)}data: [DONE]\n\n`, true), gapMs * Math.max(1, tokens));
      }, firstByteMs);
    });
  }
}

function listen(server: Server): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => resolve((server.address() as AddressInfo).port));
  });
}

/** A self-signed P-256 certificate for 127.0.0.1 and localhost, made by `openssl` (a few ms). */
function selfSignedCert(): { key: string; cert: string } {
  const dir = mkdtempSync(join(tmpdir(), "slow-model-tls-"));
  try {
    const keyPath = join(dir, "key.pem");
    const certPath = join(dir, "cert.pem");
    const r = spawnSync(
      "openssl",
      [
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=slow-model",
        "-addext",
        "subjectAltName=IP:127.0.0.1,DNS:localhost",
        "-keyout",
        keyPath,
        "-out",
        certPath,
      ],
      { encoding: "utf8" },
    );
    if (r.status !== 0) throw new AppError("internal", `openssl could not make the slow model's certificate: ${r.stderr || r.error?.message}`);
    return { key: readFileSync(keyPath, "utf8"), cert: readFileSync(certPath, "utf8") };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

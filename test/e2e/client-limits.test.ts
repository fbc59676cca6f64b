// Every connection and every body under one policy, over raw sockets against a real Node gateway: head and body
// deadlines (408), connection bounds per address and in total (429/503 + Retry-After), counts that free up, and the
// proxy's long streams and slow-but-steady uploads left alone.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connect, type Socket } from "node:net";
import { createLogger } from "../../lib/log.ts";
import { componentKey, signComponentToken } from "../../lib/host-token.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ProcessDriver } from "../../fleet-agent/drivers/process/driver.ts";
import { parseDaemonConfig, startFleetAgent, type FleetAgentDaemon } from "../../compose/fleet-agent.ts";
import { freshDatabase } from "../helpers/db.ts";

const headTimeoutMs = 800;
const windowMs = 500;
const minBytes = 64;
const apiBodyTimeoutMs = 2500;
const webhookBodyTimeoutMs = 1500;
const componentSecret = "client-limits-test-secret-0123456789abcdef";
// A workload that starts listening 1.6 s after it is started: its wake outlasts three body windows.
const slowBoot = `setTimeout(() => require("http").createServer((q, s) => { let n = 0; q.on("data", (c) => (n += c.length)); q.on("end", () => s.end(JSON.stringify({ bytes: n }))); }).listen(process.env.PORT, "127.0.0.1"), 1600)`;
/** Node checks heads every twentieth of the deadline; what a loaded CI machine adds on top. */
const lateMs = headTimeoutMs / 20 + 600;

interface RawAnswer {
  status: number;
  headers: Record<string, string>;
  body: string;
  /** From the first byte written to the connection's close, ms. */
  closedAfterMs: number;
}

/** Parses what came back on a raw connection (the first answer only). */
function parseAnswer(raw: string, closedAfterMs: number): RawAnswer {
  const end = raw.indexOf("\r\n\r\n");
  const head = end < 0 ? raw : raw.slice(0, end);
  const [statusLine = "", ...lines] = head.split("\r\n");
  const headers: Record<string, string> = {};
  for (const l of lines) {
    const i = l.indexOf(":");
    if (i > 0) headers[l.slice(0, i).toLowerCase()] = l.slice(i + 1).trim();
  }
  let body = end < 0 ? "" : raw.slice(end + 4);
  if (headers["transfer-encoding"] === "chunked") body = dechunk(body);
  else if (headers["content-length"]) body = body.slice(0, Number(headers["content-length"]));
  return { status: Number(statusLine.split(" ")[1] ?? 0), headers, body, closedAfterMs };
}

function dechunk(s: string): string {
  let out = "";
  let at = 0;
  for (;;) {
    const nl = s.indexOf("\r\n", at);
    if (nl < 0) return out;
    const size = parseInt(s.slice(at, nl), 16);
    if (!(size > 0)) return out;
    out += s.slice(nl + 2, nl + 2 + size);
    at = nl + 2 + size + 2;
  }
}

interface Trickle {
  /** Written at once. */
  head: string;
  /** Then written one piece every `everyMs` (stopped when the connection closes). */
  pieces?: string[];
  everyMs?: number;
  localAddress?: string;
  /** Give up (and fail) after this long, ms. */
  timeoutMs?: number;
}

/** A raw client that writes a head, then pieces on a schedule, and answers what it got once the server closed. */
function trickle(port: number, t: Trickle): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: "127.0.0.1", port, ...(t.localAddress ? { localAddress: t.localAddress } : {}) });
    let raw = "";
    let started = 0;
    let timer: NodeJS.Timeout | undefined;
    const giveUp = setTimeout(() => {
      socket.destroy();
      reject(new Error(`no close within ${t.timeoutMs ?? 15_000} ms; got ${JSON.stringify(raw.slice(0, 200))}`));
    }, t.timeoutMs ?? 15_000);
    socket.on("connect", () => {
      started = performance.now();
      socket.write(t.head);
      const pieces = [...(t.pieces ?? [])];
      const next = () => {
        const p = pieces.shift();
        if (p === undefined || socket.destroyed) return;
        socket.write(p);
        timer = setTimeout(next, t.everyMs ?? 100);
      };
      if (pieces.length) timer = setTimeout(next, t.everyMs ?? 100);
    });
    socket.on("data", (d: Buffer) => (raw += d.toString("latin1")));
    socket.on("error", () => undefined); // a reset after the answer: what was read is what counts
    socket.on("close", () => {
      clearTimeout(timer);
      clearTimeout(giveUp);
      resolve(parseAnswer(raw, performance.now() - started));
    });
  });
}

const repeat = (piece: string, n: number): string[] => Array.from({ length: n }, () => piece);

let sys: TestSystem;
const logLines: Record<string, unknown>[] = [];

beforeAll(async () => {
  sys = await startSystem({
    images: { slowboot: [process.execPath, "-e", slowBoot] },
    env: {
      CLIENT_HEADERS_TIMEOUT_MS: String(headTimeoutMs),
      CLIENT_BODY_MIN_BYTES: String(minBytes),
      CLIENT_BODY_WINDOW_MS: String(windowMs),
      CLIENT_BODY_TIMEOUT_MS: String(apiBodyTimeoutMs),
      CLIENT_WEBHOOK_BODY_TIMEOUT_MS: String(webhookBodyTimeoutMs),
      COMPONENT_SECRET: componentSecret,
    },
    log: createLogger({ level: "info", write: (line) => logLines.push(JSON.parse(line) as Record<string, unknown>) }),
  });
});
afterAll(async () => {
  await sys?.stop();
});

function expectEnvelope(a: RawAnswer, status: number, code: string): { message: string } {
  expect(a.status, a.body).toBe(status);
  expect(a.headers.connection).toBe("close");
  const err = (JSON.parse(a.body) as { error: { code: string; message: string; requestId: string } }).error;
  expect(err.code).toBe(code);
  expect(err.requestId).toMatch(/^req_/);
  return err;
}

/** No line at error level, and no stack anywhere, since `from` (the index of the log when the case began). */
function expectQuietLog(from: number): void {
  const lines = logLines.slice(from);
  expect(lines.filter((l) => l.level === "error" || l.level === "warn")).toEqual([]);
  expect(lines.filter((l) => l.stack !== undefined)).toEqual([]);
}

const auth = () => `Authorization: Bearer ${sys.demo.token}\r\n`;
const postHead = (path: string, extra: string) => `POST ${path} HTTP/1.1\r\nHost: localhost\r\n${extra}\r\n`;

describe("the request head", () => {
  it("a head trickled one header at a time is cut with 408 at its deadline, precisely; a silent connection too", async () => {
    const from = logLines.length;
    const trickled = await trickle(sys.port, { head: "GET /v1/agents HTTP/1.1\r\nHost: localhost\r\n", pieces: repeat("X-Slow: 1\r\n", 100), everyMs: 100 });
    expect(expectEnvelope(trickled, 408, "request_timeout").message).toContain(`${headTimeoutMs} ms`);
    expect(trickled.closedAfterMs).toBeGreaterThanOrEqual(headTimeoutMs - 50);
    expect(trickled.closedAfterMs).toBeLessThan(headTimeoutMs + lateMs);

    const silent = await trickle(sys.port, { head: "" });
    expectEnvelope(silent, 408, "request_timeout");
    expect(silent.closedAfterMs).toBeLessThan(headTimeoutMs + lateMs);
    expect(logLines.slice(from).filter((l) => l.msg === "request head too slow: connection closed" && l.level === "info")).toHaveLength(2);
    expectQuietLog(from);
  });
});

describe("request bodies", () => {
  it("an admin body trickled below the floor (1 byte per 250 ms) is 408 within a window or two, the handler fails cleanly", async () => {
    const from = logLines.length;
    const a = await trickle(sys.port, {
      head: postHead("/v1/agents", `${auth()}Content-Type: application/json\r\nContent-Length: 100\r\n`),
      pieces: repeat(" ", 100),
      everyMs: 250,
    });
    expect(expectEnvelope(a, 408, "request_timeout").message).toContain(`${minBytes}-byte floor`);
    expect(a.closedAfterMs).toBeGreaterThanOrEqual(windowMs - 50);
    expect(a.closedAfterMs).toBeLessThan(2 * windowMs + 600);
    const cut = logLines.slice(from).filter((l) => l.msg === "request body too slow: connection closed");
    expect(cut).toHaveLength(1);
    expect(cut[0]).toMatchObject({ level: "info", method: "POST", path: "/v1/agents" });
    expectQuietLog(from);
  });

  it("a chunked admin body that keeps above the floor but outlasts CLIENT_BODY_TIMEOUT_MS is 408 at that deadline", async () => {
    const from = logLines.length;
    const chunk = `${(100).toString(16)}\r\n${" ".repeat(100)}\r\n`;
    const a = await trickle(sys.port, {
      head: postHead("/v1/agents", `${auth()}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n`),
      pieces: repeat(chunk, 100),
      everyMs: 200,
    });
    expect(expectEnvelope(a, 408, "request_timeout").message).toContain(`within ${apiBodyTimeoutMs} ms`);
    expect(a.closedAfterMs).toBeGreaterThanOrEqual(apiBodyTimeoutMs - 50);
    expect(a.closedAfterMs).toBeLessThan(apiBodyTimeoutMs + 600);
    expectQuietLog(from);
  });

  it("bodies that arrive fast, or slowly but above the floor within the deadline, are taken", async () => {
    const body = JSON.stringify({ idleTimeoutMs: 60_000 });
    const fast = await trickle(sys.port, {
      head: postHead("/v1/agents", `${auth()}Content-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n`) + body,
    });
    expect(fast.status, fast.body).toBe(201);
    const padded = `${body}${" ".repeat(400 - body.length)}`;
    const pieces = padded.match(/[\s\S]{1,80}/g) ?? [];
    const slow = await trickle(sys.port, {
      head: postHead("/v1/agents", `${auth()}Content-Type: application/json\r\nContent-Length: ${padded.length}\r\nConnection: close\r\n`),
      pieces,
      everyMs: 300,
    });
    expect(slow.status, slow.body).toBe(201);
    expect(slow.closedAfterMs).toBeGreaterThan(1000);
  });

  it("billing's meter ingest (/v1/meter-segments) cuts a trickled body with 408", async () => {
    const from = logLines.length;
    const token = await signComponentToken(componentKey(componentSecret), { sub: "host_test", aud: "billing" });
    const a = await trickle(sys.port, {
      head: postHead("/v1/meter-segments", `Authorization: Bearer ${token}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n`),
      pieces: repeat("1\r\n \r\n", 100),
      everyMs: 250,
    });
    expectEnvelope(a, 408, "request_timeout");
    expect(a.closedAfterMs).toBeLessThan(2 * windowMs + 600);
    expectQuietLog(from);
  });

  it("webhook intake (POST /hooks/…, no credentials) is cut below the floor, and at its tighter total deadline above it", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    const created = await sys.call(`/v1/agents/${agent.id}/webhooks`, { method: "POST", body: JSON.stringify({ name: "slow", scheme: "standard" }) });
    expect(created.status).toBe(201);
    const from = logLines.length;
    const head = (len: number) => postHead(`/hooks/${agent.id}/slow`, `Content-Type: application/json\r\nContent-Length: ${len}\r\n`);
    const stalled = await trickle(sys.port, { head: head(100), pieces: repeat("x", 100), everyMs: 250 });
    expect(expectEnvelope(stalled, 408, "request_timeout").message).toContain("floor");
    expect(stalled.closedAfterMs).toBeLessThan(2 * windowMs + 600);
    // 100 bytes every 200 ms is above the floor, but 5000 bytes would take 10 s: cut at 1.5 s, before the API's 2.5 s.
    const long = await trickle(sys.port, { head: head(5000), pieces: repeat("x".repeat(100), 50), everyMs: 200 });
    expect(expectEnvelope(long, 408, "request_timeout").message).toContain(`within ${webhookBodyTimeoutMs} ms`);
    expect(long.closedAfterMs).toBeGreaterThanOrEqual(webhookBodyTimeoutMs - 50);
    expect(long.closedAfterMs).toBeLessThan(webhookBodyTimeoutMs + 600);
    expectQuietLog(from);
  });
});

describe("image uploads (POST /v1/images)", () => {
  it("are held to the floor only: below it 408, above it an upload may outlast the API's body deadline", async () => {
    const from = logLines.length;
    const head = (len: number) =>
      postHead("/v1/images?name=slow&tag=v1", `${auth()}Content-Type: application/x-tar\r\nContent-Length: ${len}\r\nConnection: close\r\n`);
    const stalled = await trickle(sys.port, { head: head(1000), pieces: repeat("t", 100), everyMs: 250 });
    expectEnvelope(stalled, 408, "request_timeout");
    expect(stalled.closedAfterMs).toBeLessThan(2 * windowMs + 600);
    // 1200 bytes in 3.6 s: arrives whole (then is refused as no tar — not cut on the way).
    const steady = await trickle(sys.port, { head: head(1200), pieces: repeat("t".repeat(100), 12), everyMs: 300 });
    expect(steady.status, steady.body).not.toBe(408);
    expect(steady.status).toBeLessThan(500);
    expect(steady.closedAfterMs).toBeGreaterThan(apiBodyTimeoutMs);
    expectQuietLog(from);
  });
});

describe("agent traffic", () => {
  it("an upload to an agent above the floor outlasts the API's body deadline; one below the floor is cut with 408", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    expect((await sys.call(`/a/${agent.id}/`)).status).toBe(200);
    // 1200 bytes, 100 every 300 ms: 3.6 s, more than CLIENT_BODY_TIMEOUT_MS (2.5 s), above the floor in every window.
    const steady = await trickle(sys.port, {
      head: postHead(`/a/${agent.id}/upload`, `${auth()}Content-Length: 1200\r\nConnection: close\r\n`),
      pieces: repeat("u".repeat(100), 12),
      everyMs: 300,
    });
    expect(steady.status, steady.body).toBe(200);
    expect((JSON.parse(steady.body) as { bytes: number }).bytes).toBe(1200);
    expect(steady.closedAfterMs).toBeGreaterThan(apiBodyTimeoutMs);

    const from = logLines.length;
    const stalled = await trickle(sys.port, {
      head: postHead(`/a/${agent.id}/upload`, `${auth()}Content-Length: 1200\r\n`),
      pieces: repeat("u", 100),
      everyMs: 250,
    });
    expectEnvelope(stalled, 408, "request_timeout");
    expect(stalled.closedAfterMs).toBeLessThan(2 * windowMs + 600);
    expectQuietLog(from);
  });

  it("windows where the gateway is the one not reading do not count: an agent that stalls its reads, a client waiting for 100 Continue", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    expect((await sys.call(`/a/${agent.id}/`)).status).toBe(200);
    // 16 MiB sent at full speed to an agent that reads nothing for 1.6 s (three windows): the socket buffers fill,
    // the gateway stops reading (the bytes wait in its buffer) — backpressure, not a slow client.
    const big = Buffer.alloc(16 * 1024 * 1024, 0x61);
    const stalled = await sys.call(`/a/${agent.id}/upload?stallMs=1600`, { method: "POST", body: big });
    expect(stalled.status).toBe(200);
    expect(((await stalled.json()) as { bytes: number }).bytes).toBe(big.length);

    // A sleeping agent whose wake takes 1.6 s: the client sends its body only once told to continue.
    const sleepy = await sys.createAgent({ image: "slowboot", idleTimeoutMs: 60_000 });
    const answer = await new Promise<RawAnswer>((resolve, reject) => {
      const socket = connect({ host: "127.0.0.1", port: sys.port });
      let raw = "";
      let sentBody = false;
      const started = performance.now();
      socket.on("connect", () => socket.write(postHead(`/a/${sleepy.id}/`, `${auth()}Expect: 100-continue\r\nContent-Length: 5\r\nConnection: close\r\n`)));
      socket.on("data", (d: Buffer) => {
        raw += d.toString("latin1");
        if (!sentBody && raw.startsWith("HTTP/1.1 100")) {
          sentBody = true;
          raw = raw.slice(raw.indexOf("\r\n\r\n") + 4);
          socket.write("hello");
        }
      });
      socket.on("error", reject);
      socket.on("close", () => resolve(parseAnswer(raw, performance.now() - started)));
    });
    expect(answer.status, answer.body).toBe(200);
    expect(JSON.parse(answer.body)).toEqual({ bytes: 5 });
    expect(answer.closedAfterMs).toBeGreaterThan(1500);
  });

  it("a proxied stream the agent already answers is not cut: a chunked echo trickled below the floor, an SSE stream", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    expect((await sys.call(`/a/${agent.id}/`)).status).toBe(200);
    // One byte every 700 ms for 3.5 s: below the floor in every window, past the API's deadline — but the agent
    // answered at the first byte, so the exchange is a stream (bounded by the proxy's idle timeout).
    const chunk = "1\r\ne\r\n";
    const echo = await trickle(sys.port, {
      head: postHead(`/a/${agent.id}/echo`, `${auth()}Transfer-Encoding: chunked\r\nConnection: close\r\n`) + chunk,
      pieces: [...repeat(chunk, 5), "0\r\n\r\n"],
      everyMs: 700,
    });
    expect(echo.status, echo.body).toBe(200);
    expect(echo.body).toBe("e".repeat(6));
    expect(echo.closedAfterMs).toBeGreaterThan(3000);

    const sse = await trickle(sys.port, {
      head: `GET /a/${agent.id}/sse?n=10&intervalMs=300 HTTP/1.1\r\nHost: localhost\r\n${auth()}Connection: close\r\n\r\n`,
    });
    expect(sse.status).toBe(200);
    expect(sse.body.match(/^data:/gm)).toHaveLength(10);
    expect(sse.closedAfterMs).toBeGreaterThan(apiBodyTimeoutMs);
  });
});

describe("connection bounds", () => {
  let bounded: TestSystem;
  const boundLog: Record<string, unknown>[] = [];
  beforeAll(async () => {
    bounded = await startSystem({
      env: { MAX_CONNECTIONS_PER_IP: "5", MAX_CONNECTIONS: "8" },
      log: createLogger({ level: "info", write: (line) => boundLog.push(JSON.parse(line) as Record<string, unknown>) }),
    });
  });
  afterAll(async () => {
    await bounded?.stop();
  });

  /** An open connection from `localAddress` on which a kept-alive `GET /healthz` was answered 200 (so it was admitted). */
  function admitted(localAddress: string): Promise<Socket> {
    return new Promise((resolve, reject) => {
      const s = connect({ host: "127.0.0.1", port: bounded.port, localAddress });
      let raw = "";
      s.on("connect", () => s.write("GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"));
      s.on("data", (d: Buffer) => {
        raw += d.toString("latin1");
        if (raw.includes("\r\n\r\n")) {
          const status = Number(raw.split(" ")[1]);
          if (status === 200) resolve(s);
          else reject(new Error(`not admitted: ${raw.slice(0, 300)}`));
        }
      });
      s.on("error", reject);
    });
  }

  const refused = (localAddress: string) => trickle(bounded.port, { head: "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n", localAddress, timeoutMs: 5000 });

  async function closeAll(sockets: Socket[]): Promise<void> {
    await Promise.all(sockets.map((s) => (s.closed ? undefined : new Promise((done) => s.once("close", done).destroy()))));
    await new Promise((r) => setTimeout(r, 200));
  }

  it("per address: the connection beyond MAX_CONNECTIONS_PER_IP is 429 + Retry-After, written on the socket and closed; loopback included", async () => {
    for (let round = 0; round < 3; round++) {
      const mine = await Promise.all(Array.from({ length: 5 }, () => admitted("127.0.0.2")));
      const over = await refused("127.0.0.2");
      expect(expectEnvelope(over, 429, "too_many_connections").message).toContain("5 open connections");
      expect(over.headers["retry-after"]).toBe("1");
      // Another address still gets in.
      const other = await admitted("127.0.0.3");
      // Closed connections are given back: the next round admits five again (the count does not leak).
      await closeAll([...mine, other]);
    }
    expect(boundLog.filter((l) => l.msg === "connection refused").every((l) => l.level === "info" && l.stack === undefined)).toBe(true);
    expect(boundLog.some((l) => l.msg === "connection refused" && l.code === "too_many_connections")).toBe(true);
  });

  it("a WebSocket counts as one of its address's connections while it is open", async () => {
    // The agent is created over a connection that closes at once (a kept-alive one would hold a slot).
    const body = "{}";
    const created = await trickle(bounded.port, {
      head:
        postHead(
          "/v1/agents",
          `Authorization: Bearer ${bounded.demo.token}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n`,
        ) + body,
      localAddress: "127.0.0.9",
    });
    expect(created.status, created.body).toBe(201);
    const agentId = (JSON.parse(created.body) as { id: string }).id;
    const ws = await new Promise<Socket>((resolve, reject) => {
      const s = connect({ host: "127.0.0.1", port: bounded.port, localAddress: "127.0.0.8" });
      let raw = "";
      s.on("connect", () =>
        s.write(
          `GET /a/${agentId}/ws/echo HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer ${bounded.demo.token}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n`,
        ),
      );
      s.on("data", (d: Buffer) => {
        raw += d.toString("latin1");
        if (!raw.includes("\r\n\r\n")) return;
        if (raw.startsWith("HTTP/1.1 101")) resolve(s);
        else reject(new Error(`no upgrade: ${raw.slice(0, 300)}`));
      });
      s.on("error", reject);
    });
    const rest = await Promise.all(Array.from({ length: 4 }, () => admitted("127.0.0.8")));
    expect((await refused("127.0.0.8")).status).toBe(429);
    // A close frame (masked, no payload): the relay closes the WebSocket, the slot is given back.
    await new Promise((done) => ws.once("close", done).end(Buffer.from([0x88, 0x80, 0, 0, 0, 0])));
    await new Promise((r) => setTimeout(r, 200));
    const freed = await admitted("127.0.0.8");
    await closeAll([...rest, freed]);
  });

  it("in total: the connection beyond MAX_CONNECTIONS is 503 server_busy + Retry-After; closing frees the room", async () => {
    const open = [
      ...(await Promise.all(Array.from({ length: 5 }, () => admitted("127.0.0.4")))),
      ...(await Promise.all(Array.from({ length: 3 }, () => admitted("127.0.0.5")))),
    ];
    const busy = await refused("127.0.0.6");
    expect(expectEnvelope(busy, 503, "server_busy").message).toContain("8 connections");
    expect(busy.headers["retry-after"]).toBe("5");
    await closeAll(open.splice(0, 2));
    const again = [await admitted("127.0.0.6"), await admitted("127.0.0.6")];
    expect((await refused("127.0.0.7")).status).toBe(503);
    await closeAll([...open, ...again]);
    const fresh = await Promise.all(Array.from({ length: 8 }, (_, i) => admitted(`127.0.0.${10 + (i % 2)}`)));
    expect(fresh).toHaveLength(8);
    await closeAll(fresh);
  });
});

describe("the fleet-agent's host ingress", () => {
  let database: Awaited<ReturnType<typeof freshDatabase>>;
  let host: FleetAgentDaemon;
  let dataDir: string;
  const hostLog: Record<string, unknown>[] = [];
  beforeAll(async () => {
    database = await freshDatabase();
    dataDir = mkdtempSync(join(tmpdir(), "agentvm-ingress-limits-"));
    const env = {
      DATABASE_URL: database.url,
      COMPONENT_SECRET: componentSecret,
      DATA_DIR: dataDir,
      INGRESS_PORT: "0",
      CLIENT_HEADERS_TIMEOUT_MS: String(headTimeoutMs),
      CLIENT_BODY_MIN_BYTES: String(minBytes),
      CLIENT_BODY_WINDOW_MS: String(windowMs),
    };
    host = await startFleetAgent(parseDaemonConfig(env), {
      log: createLogger({ level: "info", write: (line) => hostLog.push(JSON.parse(line) as Record<string, unknown>) }),
      driver: new ProcessDriver({}),
      database,
    });
  });
  afterAll(async () => {
    await host?.stop();
    await database?.close();
    if (dataDir) rmSync(dataDir, { recursive: true, force: true });
  });

  it("holds heads to the same deadline (408 in the envelope) and cuts a host-op body below the floor", async () => {
    const head = await trickle(host.port, { head: "GET /healthz HTTP/1.1\r\nHost: localhost\r\n", pieces: repeat("X-Slow: 1\r\n", 100), everyMs: 100 });
    expectEnvelope(head, 408, "request_timeout");
    expect(head.closedAfterMs).toBeLessThan(headTimeoutMs + lateMs);
    // Whatever the host op answers first (its token is checked before the body is read), the trickle is cut.
    const body = await trickle(host.port, {
      head: postHead("/v1/wake", "Content-Type: application/json\r\nContent-Length: 100\r\n"),
      pieces: repeat(" ", 100),
      everyMs: 250,
    });
    expect([401, 408]).toContain(body.status);
    expect(body.closedAfterMs).toBeLessThan(2 * windowMs + 600);
    expect(hostLog.filter((l) => l.level === "error")).toEqual([]);
  });
});

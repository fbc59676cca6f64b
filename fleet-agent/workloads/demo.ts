// The demo agent workload for the process driver: the same HTTP contract as the guest image's C workload.
//   GET /            {"ok":true,"agent":"demo"}          GET /healthz   ok
//   GET /counter     {"count":N}                         POST /counter  increments, {"count":N}
//   GET /clock       {"nowMs":…} (this process's wall clock)
//   GET /sse?n=5&intervalMs=200   n events "id: i / data: {"i":i,"nowMs":…}", one by one
//   POST /work?seconds=S[&lease=1]   202, then burns CPU for S seconds (holding a lease file if asked)
//   POST /echo       echoes the body;   GET /status/CODE   that status;   GET /slow?ms=N   waits, then 200
//   GET /bytes?size=N   N bytes (application/octet-stream, with Content-Length), written as the reader takes them
//   POST /upload[?stallMs=N]   reads the body (after not reading for N ms), {"bytes":N,"sha256":"…"}
//   GET /stats       {"aborted":N,"bytesSent":N}: responses (/slow, /sse, /bytes) whose client went away before the end,
//                    and bytes /bytes has handed to its connections so far
//   WebSocket /ws/echo                       every message sent back as it came (text or binary)
//   WebSocket /ws/push?intervalMs=200&n=10   the server sends {"i":i,"nowMs":…} every intervalMs, n times (0 = forever)
import { createHash } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Worker } from "node:worker_threads";
import { WebSocketServer, type WebSocket } from "ws";

const port = Number(process.env.PORT ?? 8080);
const leaseDir = process.env.LEASE_DIR;
let count = 0;
let jobs = 0;
let aborted = 0;
let bytesSent = 0;

/** Counts a response whose client went away before it ended. */
function countAbort(res: ServerResponse): void {
  res.on("close", () => {
    if (!res.writableFinished) aborted++;
  });
}

/** `size` bytes of a repeating pattern, written only as fast as the client reads. */
function sendBytes(res: ServerResponse, size: number): void {
  const block = Buffer.alloc(64 * 1024, "0123456789abcdef");
  res.writeHead(200, { "content-type": "application/octet-stream", "content-length": size });
  let left = size;
  const pump = () => {
    while (left > 0) {
      const n = Math.min(left, block.length);
      left -= n;
      bytesSent += n;
      if (!res.write(n === block.length ? block : block.subarray(0, n))) return void res.once("drain", pump);
    }
    res.end();
  };
  pump();
}

function json(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

function burn(seconds: number, lease: boolean): void {
  const leaseFile = lease && leaseDir ? join(leaseDir, `job-${process.pid}-${++jobs}`) : undefined;
  if (leaseFile) {
    mkdirSync(leaseDir!, { recursive: true });
    writeFileSync(leaseFile, String(Math.ceil(Date.now() / 1000 + seconds + 5)));
  }
  // A worker thread so the HTTP server stays responsive while the CPU is busy.
  const worker = new Worker(`const end = Date.now() + ${Math.round(seconds * 1000)}; while (Date.now() < end) {}`, { eval: true });
  worker.on("exit", () => leaseFile && rmSync(leaseFile, { force: true }));
}

function handle(req: IncomingMessage, res: ServerResponse): void {
  const url = new URL(req.url ?? "/", "http://demo");
  const path = url.pathname;
  if (req.method === "GET" && path === "/") return json(res, 200, { ok: true, agent: "demo" });
  if (req.method === "GET" && path === "/healthz") return void res.writeHead(200, { "content-type": "text/plain" }).end("ok");
  if (path === "/counter") {
    if (req.method === "POST") count++;
    return json(res, 200, { count });
  }
  if (req.method === "GET" && path === "/clock") return json(res, 200, { nowMs: Date.now() });
  if (req.method === "GET" && path === "/sse") {
    const n = Math.min(Number(url.searchParams.get("n") ?? 5), 100_000);
    const interval = Number(url.searchParams.get("intervalMs") ?? 200);
    countAbort(res);
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    res.flushHeaders();
    let i = 0;
    const send = () => {
      if (i >= n) return void res.end();
      res.write(`id: ${i}\ndata: ${JSON.stringify({ i, nowMs: Date.now() })}\n\n`);
      i++;
      timer = setTimeout(send, interval);
    };
    let timer = setTimeout(send, 0);
    res.on("close", () => clearTimeout(timer));
    return;
  }
  if (req.method === "POST" && path === "/work") {
    burn(Number(url.searchParams.get("seconds") ?? 1), url.searchParams.get("lease") === "1");
    return json(res, 202, { started: true });
  }
  if (req.method === "POST" && path === "/echo") {
    const headers: Record<string, string> = { "content-type": req.headers["content-type"] ?? "application/octet-stream" };
    if (req.headers["content-length"]) headers["content-length"] = req.headers["content-length"];
    res.writeHead(200, headers);
    req.pipe(res);
    return;
  }
  if (req.method === "GET" && path === "/bytes") {
    countAbort(res);
    return sendBytes(res, Math.max(0, Number(url.searchParams.get("size") ?? 1024 * 1024)));
  }
  if (req.method === "POST" && path === "/upload") {
    const hash = createHash("sha256");
    const stallMs = Number(url.searchParams.get("stallMs") ?? 0);
    let bytes = 0;
    req.on("data", (c: Buffer) => {
      bytes += c.length;
      hash.update(c);
    });
    if (stallMs > 0) {
      req.pause();
      setTimeout(() => req.resume(), stallMs);
    }
    req.on("end", () => json(res, 200, { bytes, sha256: hash.digest("hex") }));
    return;
  }
  if (req.method === "GET" && path === "/stats") return json(res, 200, { aborted, bytesSent });
  const status = /^\/status\/(\d{3})$/.exec(path);
  if (status) return json(res, Number(status[1]), { status: Number(status[1]) });
  if (req.method === "GET" && path === "/slow") {
    countAbort(res);
    const timer = setTimeout(() => json(res, 200, { slept: Number(url.searchParams.get("ms") ?? 1000) }), Number(url.searchParams.get("ms") ?? 1000));
    res.on("close", () => clearTimeout(timer));
    return;
  }
  json(res, 404, { error: "not found", path });
}

const server = createServer(handle);
server.keepAliveTimeout = 65_000;

const sockets = new WebSocketServer({ noServer: true });
server.on("upgrade", (req, socket, head) => {
  const url = new URL(req.url ?? "/", "http://demo");
  if (url.pathname !== "/ws/echo" && url.pathname !== "/ws/push") {
    socket.end("HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\ncontent-length: 10\r\nconnection: close\r\n\r\nno socket\n");
    return;
  }
  sockets.handleUpgrade(req, socket, head, (ws) => (url.pathname === "/ws/echo" ? echo(ws) : push(ws, url)));
});

function echo(ws: WebSocket): void {
  ws.on("message", (data, isBinary) => ws.send(data, { binary: isBinary }));
}

function push(ws: WebSocket, url: URL): void {
  const interval = Math.max(10, Number(url.searchParams.get("intervalMs") ?? 200));
  const n = Number(url.searchParams.get("n") ?? 10);
  let i = 0;
  const timer = setInterval(() => {
    if (n > 0 && i >= n) return clearInterval(timer);
    ws.send(JSON.stringify({ i: i++, nowMs: Date.now() }));
  }, interval);
  ws.on("close", () => clearInterval(timer));
}
server.listen(port, "127.0.0.1", () => console.log(`demo agent listening on 127.0.0.1:${port}`));
const shutdown = () => server.close(() => process.exit(0));
process.on("SIGTERM", shutdown);
process.on("SIGINT", shutdown);

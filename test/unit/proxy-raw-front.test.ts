// The raw front over real sockets: what it answers itself, what it hands to node:http (and how), framing, keep-alive, timeouts.
import { once } from "node:events";
import { createServer, type Server } from "node:http";
import { connect, type AddressInfo, type Socket } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import type { ClientRequest, ClientResponse } from "../../gateway/node/fast-path/client-side.ts";
import { createRawFront, type RawFront } from "../../gateway/node/fast-path/raw-front.ts";

interface Harness {
  port: number;
  /** Connections handed to Node so far. */
  handOffs: number;
  /** Requests the front answered itself, and Node's. */
  raw: string[];
  node: string[];
  headTimeouts: number;
  /** The raw responses seen closing. */
  closed: ClientResponse[];
  front: RawFront;
  server: Server;
}

let open: Harness | undefined;
afterEach(async () => {
  if (!open) return;
  open.front.closeIdle();
  open.server.closeAllConnections();
  await new Promise((r) => open!.server.close(r));
  open = undefined;
});

/** A node:http server whose connections go through the front first; `answer` answers what the front takes (`/raw/…`). */
async function harness(
  answer: (req: ClientRequest, res: ClientResponse) => void,
  limits: { headTimeoutMs?: number; keepAliveTimeoutMs?: number } = {},
): Promise<Harness> {
  const server = createServer((req, res) => {
    h.node.push(`${req.method} ${req.url}`);
    let body = "";
    req.on("data", (c: Buffer) => (body += c.toString()));
    req.on("end", () => res.end(`node:${req.method} ${req.url} ${body}`));
  });
  const nodeListeners = server.listeners("connection") as ((socket: Socket) => void)[];
  server.removeAllListeners("connection");
  const front = createRawFront({
    maxHeadBytes: 16_384,
    headTimeoutMs: limits.headTimeoutMs ?? 10_000,
    keepAliveTimeoutMs: limits.keepAliveTimeoutMs ?? 5_000,
    take(req, res) {
      if (!req.url!.startsWith("/raw/")) return false;
      h.raw.push(`${req.method} ${req.url}`);
      res.on("close", () => h.closed.push(res));
      answer(req, res);
      return true;
    },
    handOff(socket) {
      h.handOffs++;
      for (const l of nodeListeners) l.call(server, socket);
    },
    headTimedOut(socket) {
      h.headTimeouts++;
      socket.end("HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    },
  });
  server.on("connection", (s: Socket) => front.connection(s));
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const h: Harness = { port: (server.address() as AddressInfo).port, handOffs: 0, raw: [], node: [], headTimeouts: 0, closed: [], front, server };
  open = h;
  return h;
}

/** A client connection that collects what it receives. */
function client(port: number) {
  const s = connect(port, "127.0.0.1");
  let got = "";
  s.on("data", (d: Buffer) => (got += d.toString("latin1")));
  s.on("error", () => undefined);
  return {
    socket: s,
    send: (text: string) => s.write(Buffer.from(text, "latin1")),
    text: () => got,
    /** Waits until `n` responses (status lines) arrived. */
    async responses(n: number): Promise<string> {
      for (let i = 0; i < 200 && (got.match(/HTTP\/1\.1 \d{3}/g)?.length ?? 0) < n; i++) await new Promise((r) => setTimeout(r, 10));
      return got;
    },
  };
}

/** Waits (up to 3 s) until `cond` holds: the steps below depend on what the server has read, not on sleeps. */
async function until(cond: () => boolean): Promise<void> {
  for (let i = 0; i < 300 && !cond(); i++) await new Promise((r) => setTimeout(r, 10));
}

const GET = (path: string, extra = "") => `GET ${path} HTTP/1.1\r\nHost: h\r\n${extra}\r\n`;
const json = (req: ClientRequest, res: ClientResponse) => {
  const body = JSON.stringify({ url: req.url, auth: req.headers.authorization ?? null });
  res.writeHead(200, ["content-type", "application/json", "content-length", String(body.length)]);
  res.end(body);
};

describe("raw front", () => {
  it("answers simple requests itself on a kept-alive connection, with Date and keep-alive like Node", async () => {
    const h = await harness(json);
    const c = client(h.port);
    c.send(GET("/raw/1", "Authorization: Bearer t\r\n"));
    await c.responses(1);
    c.send(GET("/raw/2"));
    const text = await c.responses(2);
    expect(h.raw).toEqual(["GET /raw/1", "GET /raw/2"]);
    expect(h.node).toEqual([]);
    const [first, second] = text.split(/(?=HTTP\/1\.1 )/);
    expect(first).toMatch(
      /^HTTP\/1\.1 200 OK\r\ncontent-type: application\/json\r\ncontent-length: \d+\r\ndate: .+ GMT\r\nconnection: keep-alive\r\nkeep-alive: timeout=5\r\n\r\n/,
    );
    expect(first).toContain('{"url":"/raw/1","auth":"Bearer t"}');
    expect(second).toContain('{"url":"/raw/2","auth":null}');
    await until(() => h.closed.length === 2);
    await new Promise((r) => setTimeout(r, 20));
    expect(h.closed.length).toBe(2); // each response's 'close', once
    c.socket.destroy();
  });

  it("hands a connection to Node, unread bytes first, at the first request it does not take; Node keeps it", async () => {
    const h = await harness(json);
    const c = client(h.port);
    c.send(GET("/raw/1"));
    await c.responses(1);
    c.send("POST /api HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhel");
    await until(() => h.handOffs === 1);
    c.send("lo");
    await c.responses(2);
    c.send(GET("/raw/3")); // simple, but the connection is Node's now
    const text = await c.responses(3);
    expect(h.raw).toEqual(["GET /raw/1"]);
    expect(h.node).toEqual(["POST /api", "GET /raw/3"]);
    expect(text).toContain("node:POST /api hello");
    expect(text).toContain("node:GET /raw/3 ");
    c.socket.destroy();
  });

  it("keeps a request that arrives while one is answered, and answers it next, in order", async () => {
    const h = await harness((req, res) => {
      setTimeout(() => json(req, res), req.url === "/raw/slow" ? 60 : 0);
    });
    const c = client(h.port);
    c.send(GET("/raw/slow"));
    await until(() => h.raw.length === 1); // taken, and answered only 60 ms later
    c.send(GET("/raw/next"));
    const text = await c.responses(2);
    expect(h.raw).toEqual(["GET /raw/slow", "GET /raw/next"]);
    expect(text.indexOf("/raw/slow")).toBeLessThan(text.indexOf("/raw/next"));
    expect(h.node).toEqual([]);
    c.socket.destroy();
  });

  it.each([
    ["a request the entry does not take", [GET("/api/x")]],
    ["a head split over two reads", ["GET /raw/x HTTP/1.1\r\nHo", "st: h\r\n\r\n"]],
    ["two pipelined requests in one read", [GET("/raw/a") + GET("/raw/b")]],
  ])("leaves %s to Node, which answers it", async (_what, pieces) => {
    const h = await harness(json);
    const c = client(h.port);
    for (const p of pieces) {
      c.send(p);
      await until(() => h.handOffs === 1); // the first read went to Node before the next piece is sent
    }
    const text = await c.responses(pieces[0]!.split("\r\n\r\n").length - 1 || 1);
    expect(h.raw).toEqual([]);
    expect(h.node.length).toBeGreaterThan(0);
    expect(text).toContain("node:GET");
    c.socket.destroy();
  });

  it("frames a response without a length as chunked, sends no body for HEAD, and streams writes as they come", async () => {
    const h = await harness((_req, res) => {
      res.writeHead(200, ["content-type", "text/plain"]);
      res.write("ab");
      setTimeout(() => res.end(Buffer.from("cde")), 20);
    });
    const c = client(h.port);
    c.send(GET("/raw/stream"));
    await until(() => c.text().endsWith("0\r\n\r\n"));
    expect(c.text()).toMatch(/transfer-encoding: chunked\r\n[\s\S]*\r\n\r\n2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n$/);
    const head = client(h.port);
    head.send(`HEAD /raw/h HTTP/1.1\r\nHost: h\r\n\r\n`);
    await until(() => head.text().includes("\r\n\r\n"));
    await new Promise((r) => setTimeout(r, 30)); // a body, were one sent, would be here by now
    expect(head.text()).toMatch(/^HTTP\/1\.1 200 OK\r\n[\s\S]*\r\n\r\n$/); // head only
    c.socket.destroy();
    head.socket.destroy();
  });

  it("closes the connection after the response when the client asks, or an answer says connection: close", async () => {
    const h = await harness((req, res) => {
      res.writeHead(503, req.url === "/raw/bye" ? ["connection", "close", "content-length", "0"] : ["content-length", "0"]);
      res.end();
    });
    for (const [req, closes] of [
      [GET("/raw/x", "Connection: close\r\n"), true],
      [GET("/raw/bye"), true],
      [GET("/raw/x"), false],
    ] as const) {
      const c = client(h.port);
      c.send(req);
      await c.responses(1);
      if (closes) await until(() => c.socket.readableEnded);
      else await new Promise((r) => setTimeout(r, 50));
      expect(c.socket.readableEnded, req).toBe(closes);
      c.socket.destroy();
    }
  });

  it("tells the response the client went away mid-answer", async () => {
    let res: ClientResponse | undefined;
    const h = await harness((_req, r) => {
      res = r;
      r.writeHead(200, ["content-type", "text/plain"]);
      r.write("partial");
    });
    const c = client(h.port);
    c.send(GET("/raw/slow"));
    await until(() => c.text().includes("partial"));
    c.socket.destroy();
    await until(() => h.closed.length === 1);
    expect(h.closed).toEqual([res]);
    expect(res!.destroyed).toBe(true);
  });

  it("answers a silent new connection after the head timeout, and closes a kept-alive one after the keep-alive timeout", async () => {
    const h = await harness(json, { headTimeoutMs: 300, keepAliveTimeoutMs: 200 });
    const silent = client(h.port);
    const idle = client(h.port);
    idle.send(GET("/raw/1"));
    await idle.responses(1);
    const t0 = Date.now();
    await once(idle.socket, "close");
    expect(Date.now() - t0).toBeGreaterThanOrEqual(150);
    await once(silent.socket, "close");
    expect(h.headTimeouts).toBe(1);
    expect(silent.text()).toMatch(/^HTTP\/1\.1 408/);
  });
});

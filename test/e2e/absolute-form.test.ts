// A request in absolute form (`GET http://host/path HTTP/1.1`, as a client sends it to a proxy) is routed by the URI's
// authority and path (RFC 9112 §3.2.2: the Host header is then ignored), on every entry, over a real socket.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connect } from "node:net";
import { fileURLToPath } from "node:url";
import { startSystem, type TestSystem } from "../helpers/system.ts";

const inspect = [process.execPath, fileURLToPath(new URL("../helpers/workloads/inspect.ts", import.meta.url))];

let sys: TestSystem;
let port: number;

beforeAll(async () => {
  sys = await startSystem({ images: { inspect }, env: { GATEWAY_DOMAIN: "agents.test" } });
  port = Number(new URL(sys.url).port);
});
afterAll(async () => {
  await sys?.stop();
});

/** Sends one raw request and reads the whole answer (the connection is closed by the request). */
function raw(head: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, "127.0.0.1");
    let text = "";
    socket.setEncoding("utf8");
    socket.on("data", (d: string) => (text += d));
    socket.on("error", reject);
    socket.on("end", () => {
      const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1]);
      let body = text.slice(text.indexOf("\r\n\r\n") + 4);
      if (/\r\ntransfer-encoding: chunked/i.test(text.slice(0, text.indexOf("\r\n\r\n")))) body = unchunk(body);
      resolve({ status, body });
    });
    socket.write(`${head}\r\nconnection: close\r\nauthorization: Bearer ${sys.demo.token}\r\n\r\n`);
  });
}

function unchunk(body: string): string {
  let out = "";
  let rest = body;
  for (;;) {
    const nl = rest.indexOf("\r\n");
    const size = Number.parseInt(rest.slice(0, nl), 16);
    if (!size) return out;
    out += rest.slice(nl + 2, nl + 2 + size);
    rest = rest.slice(nl + 2 + size + 2);
  }
}

describe("absolute-form requests", () => {
  it("reach the agent named by the URI's host, at the URI's path, whatever the Host header says", async () => {
    const agent = await sys.createAgent({ image: "inspect" });
    const byHost = await raw(`GET http://${agent.id}.agents.test/some/path?q=1 HTTP/1.1\r\nhost: ${agent.id}.agents.test`);
    expect(byHost.status).toBe(200);
    expect((JSON.parse(byHost.body) as { url: string }).url).toBe("/some/path?q=1");
    const hostDiffers = await raw(`GET http://${agent.id}.agents.test/other HTTP/1.1\r\nhost: 127.0.0.1:${port}`);
    expect(hostDiffers.status).toBe(200);
    expect((JSON.parse(hostDiffers.body) as { url: string }).url).toBe("/other");
    const byPath = await raw(`GET http://127.0.0.1:${port}/a/${agent.id}/by/path HTTP/1.1\r\nhost: 127.0.0.1:${port}`);
    expect(byPath.status).toBe(200);
    expect((JSON.parse(byPath.body) as { url: string }).url).toBe("/by/path");
  });

  it("for the control API, answer as its origin-form path does", async () => {
    const health = await raw(`GET http://127.0.0.1:${port}/healthz HTTP/1.1\r\nhost: 127.0.0.1:${port}`);
    expect(health).toMatchObject({ status: 200 });
    expect(JSON.parse(health.body)).toEqual({ ok: true });
  });
});

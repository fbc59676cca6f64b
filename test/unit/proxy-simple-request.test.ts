// The raw front's recogniser of simple requests: what it takes, what it leaves to Node, and agreement with Node's parser.
import { once } from "node:events";
import { createServer, type IncomingMessage } from "node:http";
import { connect, type AddressInfo } from "node:net";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { simpleRequest } from "../../gateway/node/fast-path/simple-request.ts";

const b = (s: string) => Buffer.from(s, "latin1");
const get = (headers: string) => `GET /a/agt_x/p?q=1 HTTP/1.1\r\n${headers}\r\n`;

describe("simple requests", () => {
  it("takes a whole bodiless HTTP/1.1 head: method, target, raw headers in order and case, lower-cased lookups", () => {
    const r = simpleRequest(b(get("Host: gw.test\r\nAuthorization: Bearer t\r\nX-Two: a\r\nx-two: b\r\n")), 16_384);
    expect(r).toBeDefined();
    expect(r!.method).toBe("GET");
    expect(r!.url).toBe("/a/agt_x/p?q=1");
    expect(r!.rawHeaders).toEqual(["Host", "gw.test", "Authorization", "Bearer t", "X-Two", "a", "x-two", "b"]);
    expect(r!.headers.host).toBe("gw.test");
    expect(r!.headers.authorization).toBe("Bearer t");
    expect(r!.headers["x-two"]).toBe("a, b");
    expect(r!.headers.constructor).toBeUndefined(); // client-chosen names only
    expect(r!.close).toBe(false);
    expect(simpleRequest(b(get("Host: h\r\nConnection: close\r\n")), 16_384)!.close).toBe(true);
    for (const m of ["HEAD", "DELETE", "OPTIONS"]) expect(simpleRequest(b(`${m} / HTTP/1.1\r\nHost: h\r\n\r\n`), 16_384)?.method).toBe(m);
  });

  it.each([
    ["a body (Content-Length)", `${get("Host: h\r\nContent-Length: 3\r\n")}abc`],
    ["a declared empty body", get("Host: h\r\nContent-Length: 0\r\n")],
    ["Transfer-Encoding", get("Host: h\r\nTransfer-Encoding: chunked\r\n")],
    ["Expect", get("Host: h\r\nExpect: 100-continue\r\n")],
    ["Upgrade", get("Host: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n")],
    ["no Host", get("X-A: 1\r\n")],
    ["two Hosts", get("Host: a\r\nHost: b\r\n")],
    ["two Authorization headers", get("Host: h\r\nAuthorization: a\r\nAuthorization: b\r\n")],
    ["POST", "POST / HTTP/1.1\r\nHost: h\r\n\r\n"],
    ["HTTP/1.0", "GET / HTTP/1.0\r\nHost: h\r\n\r\n"],
    ["absolute form", "GET http://h/ HTTP/1.1\r\nHost: h\r\n\r\n"],
    ["asterisk form", "OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n"],
    ["a space in the target", "GET /a b HTTP/1.1\r\nHost: h\r\n\r\n"],
    ["obsolete line folding", get("Host: h\r\nX-A: 1\r\n 2\r\n")],
    ["a bare LF", "GET / HTTP/1.1\nHost: h\r\n\r\n"],
    ["a bare CR in a value", get("Host: h\r\nX-A: 1\r2\r\n")],
    ["a control character in a value", get("Host: h\r\nX-A: 1\x002\r\n")],
    ["a space before the colon", get("Host: h\r\nX-A : 1\r\n")],
    ["an empty name", get("Host: h\r\n: 1\r\n")],
    ["a head cut short", "GET / HTTP/1.1\r\nHost: h\r\n"],
    ["two requests (pipelined)", "GET / HTTP/1.1\r\nHost: h\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n"],
  ])("leaves %s to Node", (_what, text) => {
    expect(simpleRequest(b(text), 16_384)).toBeUndefined();
  });

  it("leaves heads over the size limit to Node", () => {
    const head = b(get(`Host: h\r\nX-Big: ${"x".repeat(2000)}\r\n`));
    expect(simpleRequest(head, head.length)).toBeDefined();
    expect(simpleRequest(head, head.length - 1)).toBeUndefined();
  });

  describe("agrees with Node's own parser on everything it takes", () => {
    let port = 0;
    const seen: IncomingMessage[] = [];
    const server = createServer((req, res) => {
      seen.push(req);
      res.end();
    });
    beforeAll(async () => {
      server.listen(0, "127.0.0.1");
      await once(server, "listening");
      port = (server.address() as AddressInfo).port;
    });
    afterAll(() => server.close());

    /** What Node makes of `bytes` on a fresh connection (undefined: refused). */
    async function node(bytes: Buffer): Promise<IncomingMessage | undefined> {
      const before = seen.length;
      const s = connect(port, "127.0.0.1");
      s.on("data", () => s.end());
      s.on("error", () => undefined);
      s.write(bytes);
      await once(s, "close");
      return seen.length > before ? seen[seen.length - 1] : undefined;
    }

    const nameChar = fc.constantFrom(..."abcXYZ-_!#~09".split(""));
    const valueChar = fc.constantFrom(..."ab ,;=\t\x01\x7f\x80\xa0\xff:\r\n".split(""));
    const header = fc.tuple(fc.string({ unit: nameChar, minLength: 1, maxLength: 6 }), fc.string({ unit: valueChar, maxLength: 6 }));
    const target = fc.string({ unit: fc.constantFrom(..."/a?=%~ \x7f\x80".split("")), maxLength: 8 });

    it("method, target and headers are the same when it takes a head", async () => {
      let compared = 0;
      await fc.assert(
        fc.asyncProperty(fc.constantFrom("GET", "HEAD", "DELETE", "POST"), target, fc.array(header, { maxLength: 4 }), async (method, path, headers) => {
          const text = `${method} /${path} HTTP/1.1\r\nHost: h\r\n${headers.map(([k, v]) => `${k}: ${v}\r\n`).join("")}\r\n`;
          const ours = simpleRequest(b(text), 16_384);
          if (!ours) return; // left to Node: nothing to compare
          compared++;
          const theirs = await node(b(text));
          expect(theirs, text).toBeDefined();
          expect(ours.method).toBe(theirs!.method);
          expect(ours.url).toBe(theirs!.url);
          expect(ours.rawHeaders).toEqual(theirs!.rawHeaders);
        }),
        { numRuns: 500 },
      );
      expect(compared).toBeGreaterThan(10); // the property saw heads it takes, not only ones it leaves
    });
  });
});

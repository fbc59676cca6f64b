// The fast path's HTTP/1.1 response parser: framing, strictness, and independence from how bytes are split into packets.
import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { ResponseParseError, ResponseParser, type ParserSink, type ResponseHead } from "../../gateway/node/fast-path/response-parser.ts";

interface Seen {
  heads: ResponseHead[];
  body: Buffer[];
  ends: number;
}

function sink(): ParserSink & { seen: Seen } {
  const seen: Seen = { heads: [], body: [], ends: 0 };
  return {
    seen,
    onHead: (h) => void seen.heads.push(h),
    onBody: (c) => void seen.body.push(Buffer.from(c)),
    onEnd: () => void seen.ends++,
  };
}

/** Feeds `bytes` split at `cuts` (offsets), then ends the connection when `close`. */
function parse(bytes: Buffer, opts: { method?: string; cuts?: number[]; close?: boolean; maxHeadBytes?: number } = {}) {
  const s = sink();
  const p = new ResponseParser(s, { maxHeadBytes: opts.maxHeadBytes ?? 8192 });
  p.start(opts.method ?? "GET");
  const cuts = [...new Set(opts.cuts ?? [])].filter((c) => c > 0 && c < bytes.length).sort((a, b) => a - b);
  let from = 0;
  for (const c of [...cuts, bytes.length]) {
    p.execute(bytes.subarray(from, c));
    from = c;
  }
  if (opts.close) p.finish();
  return { ...s.seen, parser: p, bodyText: Buffer.concat(s.seen.body).toString("latin1") };
}

const b = (s: string) => Buffer.from(s, "latin1");

describe("response parser", () => {
  it("parses a sized response, keeps header names' case and order, and can reuse the connection", () => {
    const r = parse(b("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\nhello"));
    expect(r.heads).toHaveLength(1);
    expect(r.heads[0]!.status).toBe(200);
    expect(r.heads[0]!.reason).toBe("OK");
    expect(r.heads[0]!.headers).toEqual(["Content-Type", "text/plain", "Content-Length", "5", "X-A", "1", "x-a", "2"]);
    expect(r.heads[0]!.framing).toBe("length");
    expect(r.bodyText).toBe("hello");
    expect(r.ends).toBe(1);
    expect(r.parser.reusable).toBe(true);
  });

  it("decodes a chunked body with extensions and trailers", () => {
    const r = parse(b("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n"));
    expect(r.heads[0]!.framing).toBe("chunked");
    expect(r.bodyText).toBe("hello world");
    expect(r.ends).toBe(1);
    expect(r.parser.reusable).toBe(true);
  });

  it("reads a body without length until the connection closes, and never reuses that connection", () => {
    const r = parse(b("HTTP/1.1 200 OK\r\n\r\nstreamed until close"), { close: true });
    expect(r.heads[0]!.framing).toBe("close");
    expect(r.bodyText).toBe("streamed until close");
    expect(r.ends).toBe(1);
    expect(r.parser.reusable).toBe(false);
  });

  it("HEAD, 204 and 304 responses have no body whatever their headers say", () => {
    const head = parse(b("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"), { method: "HEAD" });
    expect(head.heads[0]!.framing).toBe("none");
    expect(head.ends).toBe(1);
    expect(head.parser.reusable).toBe(true);
    for (const status of [204, 304]) {
      const r = parse(b(`HTTP/1.1 ${status} X\r\n\r\n`));
      expect(r.heads[0]!.status).toBe(status);
      expect(r.ends).toBe(1);
    }
  });

  it("skips informational responses (100 Continue, 103 Early Hints) before the final one", () => {
    const r = parse(b("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"));
    expect(r.heads.map((h) => h.status)).toEqual([201]);
    expect(r.bodyText).toBe("ok");
  });

  it("Connection: close and HTTP/1.0 make the connection single-use", () => {
    expect(parse(b("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")).parser.reusable).toBe(false);
    expect(parse(b("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")).parser.reusable).toBe(false);
  });

  it("bytes after the end of a response make the connection unusable", () => {
    const r = parse(b("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA"));
    expect(r.bodyText).toBe("ok");
    expect(r.parser.extraBytes).toBe(true);
    expect(r.parser.reusable).toBe(false);
  });

  it.each([
    ["Content-Length with Transfer-Encoding", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"],
    ["conflicting Content-Lengths", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n"],
    ["a non-numeric Content-Length", "HTTP/1.1 200 OK\r\nContent-Length: 3x\r\n\r\n"],
    ["an unsupported transfer coding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"],
    ["obsolete line folding", "HTTP/1.1 200 OK\r\nX-A: 1\r\n  continued\r\nContent-Length: 0\r\n\r\n"],
    ["a control character in a value", "HTTP/1.1 200 OK\r\nX-A: a\x01b\r\nContent-Length: 0\r\n\r\n"],
    ["a space before the colon", "HTTP/1.1 200 OK\r\nX-A : 1\r\nContent-Length: 0\r\n\r\n"],
    ["a malformed status line", "HTTP/1.1 2000 OK\r\n\r\n"],
    ["HTTP/2 framing", "HTTP/2 200\r\n\r\n"],
    ["a bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"],
    ["chunk data without CRLF", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX"],
    ["an unasked-for 101", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"],
  ])("refuses %s", (_what, text) => {
    expect(() => parse(b(text))).toThrow(ResponseParseError);
  });

  it("refuses a head larger than the limit, even when it arrives in pieces", () => {
    const big = `HTTP/1.1 200 OK\r\nX-Big: ${"a".repeat(2000)}\r\nContent-Length: 0\r\n\r\n`;
    expect(() => parse(b(big), { maxHeadBytes: 1024 })).toThrow(/larger than 1024/);
    expect(() => parse(b(big), { maxHeadBytes: 1024, cuts: [100, 600, 1100, 1500] })).toThrow(/larger than 1024/);
    expect(parse(b(big), { maxHeadBytes: 4096, cuts: [100, 600] }).ends).toBe(1);
  });

  it("a connection that closes before or in the middle of a response is an error", () => {
    expect(() => parse(b(""), { close: true })).toThrow(/before a response/);
    expect(() => parse(b("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"), { close: true })).toThrow(/mid-response/);
  });

  it("parses the same whatever the packet boundaries (property)", () => {
    const body = fc.uint8Array({ minLength: 0, maxLength: 3000 });
    fc.assert(
      fc.property(body, fc.array(fc.nat(4000), { maxLength: 12 }), fc.boolean(), (bytes, cuts, chunked) => {
        const payload = Buffer.from(bytes);
        let wire: Buffer;
        if (chunked) {
          // Split the body into chunks of varying sizes, as an agent streaming it would.
          const parts: Buffer[] = [b("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")];
          let at = 0;
          let size = 1;
          while (at < payload.length) {
            const piece = payload.subarray(at, at + size);
            parts.push(b(`${piece.length.toString(16)}\r\n`), piece, b("\r\n"));
            at += piece.length;
            size = (size * 7) % 911 || 1;
          }
          parts.push(b("0\r\n\r\n"));
          wire = Buffer.concat(parts);
        } else {
          wire = Buffer.concat([b(`HTTP/1.1 200 OK\r\ncontent-length: ${payload.length}\r\n\r\n`), payload]);
        }
        const r = parse(wire, { cuts });
        expect(r.heads).toHaveLength(1);
        expect(Buffer.concat(r.body).equals(payload)).toBe(true);
        expect(r.ends).toBe(1);
        expect(r.parser.reusable).toBe(true);
      }),
      { numRuns: 300 },
    );
  });

  it("carries several responses in a row on one connection", () => {
    const s = sink();
    const p = new ResponseParser(s, { maxHeadBytes: 8192 });
    for (let k = 0; k < 3; k++) {
      p.start("GET");
      p.execute(b(`HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n${k}`));
      expect(p.reusable).toBe(true);
    }
    expect(Buffer.concat(s.seen.body).toString()).toBe("012");
    expect(s.seen.ends).toBe(3);
  });

  it("a head repeated on a connection is answered from its last parse, also when a HEAD request changes the framing", () => {
    const s = sink();
    const p = new ResponseParser(s, { maxHeadBytes: 8192 });
    const text = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n";
    for (const [method, bytes] of [
      ["GET", `${text}ab`],
      ["GET", `${text}cd`],
      ["HEAD", text],
      ["GET", `${text}ef`],
      ["GET", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1\r\n\r\ng"],
    ] as const) {
      p.start(method);
      p.execute(b(bytes));
      expect(p.complete).toBe(true);
    }
    expect(s.seen.heads.map((h) => [h.framing, h.contentLength])).toEqual([
      ["length", 2],
      ["length", 2],
      ["none", 2],
      ["length", 2],
      ["length", 1],
    ]);
    expect(s.seen.heads[0]!.headers).toEqual(["Content-Type", "text/plain", "Content-Length", "2"]);
    expect(Buffer.concat(s.seen.body).toString()).toBe("abcdefg");
    expect(s.seen.ends).toBe(5);
  });
});

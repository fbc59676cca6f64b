// An incremental, strict HTTP/1.1 response parser for the fast path's upstream connections: head, then framed body.
//
// Only agents' responses go through it (client requests are parsed by Node's llhttp). Anything ambiguous is an
// error (502), never a guess: Content-Length together with Transfer-Encoding, differing Content-Lengths, codings
// other than `chunked`, obsolete line folding, control characters, heads over the size limit.

import { badHeadChar } from "./head-chars.ts";

export type BodyFraming = "none" | "length" | "chunked" | "close";

/** A parsed head; read-only for its receivers (a repeated head is handed out again). */
export interface ResponseHead {
  status: number;
  reason: string;
  /** Flat [name, value, name, value, …] as the agent sent them (names keep their case). */
  headers: string[];
  framing: BodyFraming;
  /** Body length when `framing` is "length". */
  contentLength: number;
  /** The connection may carry another request after this response (HTTP/1.1 without `Connection: close`). */
  keepAlive: boolean;
}

export interface ParserSink {
  onHead(head: ResponseHead): void;
  onBody(chunk: Buffer): void;
  /** The response is complete (never called for a "close"-framed body until `finish()`). */
  onEnd(): void;
}

export class ResponseParseError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ResponseParseError";
  }
}

const detachedSink: ParserSink = { onHead() {}, onBody() {}, onEnd() {} };

type State = "idle" | "head" | "length" | "chunk-size" | "chunk-data" | "chunk-data-end" | "trailers" | "close" | "done";

const tokenRe = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const statusLineRe = /^HTTP\/1\.([01]) (\d{3})(?: ([^\r\n]*))?$/;
const maxChunkLineBytes = 4096;

export class ResponseParser {
  private state: State = "idle";
  private sink: ParserSink;
  private readonly maxHeadBytes: number;
  private headBuf: Buffer | undefined;
  private lineBuf = "";
  private noBody = false;
  private remaining = 0;
  private keepAlive = false;
  private trailerBytes = 0;
  /** The last final response's head text on this connection, whether it answered a HEAD, and its parse (never changed once made). */
  private lastText: string | undefined;
  private lastNoBody = false;
  private lastHead: ResponseHead | undefined;
  /** Bytes arrived after the end of a response: the connection cannot be reused. */
  extraBytes = false;

  constructor(sink: ParserSink, opts: { maxHeadBytes: number }) {
    this.sink = sink;
    this.maxHeadBytes = opts.maxHeadBytes;
  }

  /** Expects the response to a request with `method` (HEAD responses have no body). */
  start(method: string, sink?: ParserSink): void {
    if (sink) this.sink = sink;
    this.state = "head";
    this.headBuf = undefined;
    this.noBody = method === "HEAD";
    this.extraBytes = false;
  }

  /** Forgets the sink once its exchange is over: an idle connection must not keep a finished exchange alive. */
  detach(): void {
    this.sink = detachedSink;
    this.headBuf = undefined;
  }

  get complete(): boolean {
    return this.state === "done";
  }

  /** True once the head was parsed (the body may still be coming). */
  get headParsed(): boolean {
    return this.state !== "head" && this.state !== "idle";
  }

  get reusable(): boolean {
    return this.state === "done" && this.keepAlive && !this.extraBytes;
  }

  /** Feeds bytes from the connection; throws `ResponseParseError` on a malformed response. */
  execute(chunk: Buffer): void {
    let i = 0;
    const n = chunk.length;
    while (i < n) {
      switch (this.state) {
        case "idle":
        case "done":
          this.extraBytes = true;
          return;
        case "head": {
          const consumed = this.feedHead(chunk, i);
          if (consumed < 0) return; // head incomplete, all of the chunk buffered
          i = consumed;
          break;
        }
        case "length": {
          const take = Math.min(this.remaining, n - i);
          const piece = i === 0 && take === n ? chunk : chunk.subarray(i, i + take);
          this.remaining -= take;
          i += take;
          if (this.remaining === 0) this.state = "done";
          this.sink.onBody(piece);
          if (this.state === "done") this.sink.onEnd();
          break;
        }
        case "close": {
          this.sink.onBody(i === 0 ? chunk : chunk.subarray(i));
          return;
        }
        case "chunk-size":
        case "trailers": {
          const lf = chunk.indexOf(10, i);
          const end = lf < 0 ? n : lf + 1;
          this.lineBuf += chunk.toString("latin1", i, end);
          i = end;
          if (lf < 0) {
            if (this.lineBuf.length > maxChunkLineBytes) throw new ResponseParseError("chunk size line too long");
            break;
          }
          const line = this.lineBuf;
          this.lineBuf = "";
          if (!line.endsWith("\r\n")) throw new ResponseParseError("bare LF in chunked body");
          if (this.state === "chunk-size") this.chunkSizeLine(line.slice(0, -2));
          else this.trailerLine(line);
          break;
        }
        case "chunk-data": {
          const take = Math.min(this.remaining, n - i);
          const piece = chunk.subarray(i, i + take);
          this.remaining -= take;
          i += take;
          if (this.remaining === 0) {
            this.state = "chunk-data-end";
            this.remaining = 2;
          }
          this.sink.onBody(piece);
          break;
        }
        case "chunk-data-end": {
          const expected = this.remaining === 2 ? 13 : 10;
          if (chunk[i] !== expected) throw new ResponseParseError("chunk data not followed by CRLF");
          i++;
          this.remaining--;
          if (this.remaining === 0) this.state = "chunk-size";
          break;
        }
      }
    }
  }

  /** The connection ended: completes a close-delimited body; throws if a response was cut short. */
  finish(): void {
    if (this.state === "close") {
      this.state = "done";
      this.sink.onEnd();
      return;
    }
    if (this.state !== "done" && this.state !== "idle")
      throw new ResponseParseError(this.state === "head" ? "connection closed before a response" : "connection closed mid-response");
  }

  private feedHead(chunk: Buffer, from: number): number {
    let buf: Buffer;
    let searchFrom: number;
    if (this.headBuf) {
      searchFrom = Math.max(0, this.headBuf.length - 3);
      buf = Buffer.concat([this.headBuf, from === 0 ? chunk : chunk.subarray(from)]);
    } else {
      buf = from === 0 ? chunk : chunk.subarray(from);
      searchFrom = 0;
    }
    const end = buf.indexOf("\r\n\r\n", searchFrom, "latin1");
    if (end < 0) {
      if (buf.length > this.maxHeadBytes) throw new ResponseParseError(`response head larger than ${this.maxHeadBytes} bytes`);
      this.headBuf = Buffer.from(buf); // copy: the connection's buffer may be reused
      return -1;
    }
    if (end + 4 > this.maxHeadBytes) throw new ResponseParseError(`response head larger than ${this.maxHeadBytes} bytes`);
    const consumedFromBuf = end + 4;
    const prior = this.headBuf ? this.headBuf.length : 0;
    this.headBuf = undefined;
    const text = buf.toString("latin1", 0, end);
    // The same head as the last final response on this connection (an agent answering the same call again; the Date
    // line changes once a second): its parse is reused, read-only, instead of parsing it again.
    const informational = text === this.lastText && this.noBody === this.lastNoBody ? (this.begin(this.lastHead!), false) : this.parseHead(text);
    if (!informational) {
      this.lastText = text;
      this.lastNoBody = this.noBody;
    }
    if (informational) this.state = "head"; // 1xx: another head follows
    // Bytes of `chunk` consumed: the head's bytes minus what was buffered from earlier chunks.
    return from + (consumedFromBuf - prior);
  }

  /** Parses one head; answers true for an informational (1xx) response that is skipped. */
  private parseHead(text: string): boolean {
    let lineEnd = text.indexOf("\r\n");
    const statusLine = lineEnd < 0 ? text : text.slice(0, lineEnd);
    const m = statusLineRe.exec(statusLine);
    if (!m) throw new ResponseParseError(`malformed status line "${statusLine.slice(0, 80)}"`);
    const minor = m[1];
    const status = Number(m[2]);
    if (status < 100) throw new ResponseParseError(`invalid status ${status}`);
    // Field values: visible ASCII, space, tab and obs-text; checked once over the whole head, not per header.
    const bad = badHeadChar(text);
    if (bad >= 0) {
      const lineStart = text.lastIndexOf("\r\n", bad) + 2;
      const name = text.slice(lineStart, Math.max(lineStart, text.indexOf(":", lineStart)));
      throw new ResponseParseError(`invalid character in header ${name.slice(0, 80)}`);
    }
    const headers: string[] = [];
    let contentLength: string | undefined;
    let transferEncoding: string | undefined;
    let connection = "";
    while (lineEnd >= 0) {
      const start = lineEnd + 2;
      lineEnd = text.indexOf("\r\n", start);
      const line = lineEnd < 0 ? text.slice(start) : text.slice(start, lineEnd);
      if (line.length === 0) throw new ResponseParseError("empty header line");
      const colon = line.indexOf(":");
      if (colon <= 0) throw new ResponseParseError(`malformed header line "${line.slice(0, 80)}"`);
      const name = line.slice(0, colon);
      if (!tokenRe.test(name)) throw new ResponseParseError(`invalid header name "${name.slice(0, 80)}"`);
      const value = line.slice(colon + 1).trim();
      const lower = name.length === 14 || name.length === 17 || name.length === 10 ? name.toLowerCase() : "";
      if (lower === "content-length") {
        if (!/^\d{1,15}$/.test(value)) throw new ResponseParseError(`invalid Content-Length "${value.slice(0, 40)}"`);
        if (contentLength !== undefined && contentLength !== value) throw new ResponseParseError("conflicting Content-Length headers");
        if (contentLength !== undefined) continue; // an identical repeat: pass one on
        contentLength = value;
      } else if (lower === "transfer-encoding") {
        transferEncoding = transferEncoding ? `${transferEncoding}, ${value}` : value;
      } else if (lower === "connection") {
        connection += `,${value.toLowerCase()}`;
      }
      headers.push(name, value);
    }
    if (status < 200) {
      if (status === 101) throw new ResponseParseError("unexpected 101 Switching Protocols");
      return true;
    }
    const head: ResponseHead = { status, reason: m[3] ?? "", headers, framing: "close", contentLength: 0, keepAlive: false };
    head.keepAlive = minor === "1" && (connection === "" || !connection.split(",").some((t) => t.trim() === "close"));
    if (transferEncoding !== undefined) {
      if (contentLength !== undefined) throw new ResponseParseError("both Content-Length and Transfer-Encoding");
      if (transferEncoding.trim().toLowerCase() !== "chunked") throw new ResponseParseError(`unsupported Transfer-Encoding "${transferEncoding.slice(0, 40)}"`);
    }
    if (this.noBody || status === 204 || status === 304) {
      head.framing = "none";
      if (contentLength !== undefined) head.contentLength = Number(contentLength);
    } else if (transferEncoding !== undefined) {
      head.framing = "chunked";
    } else if (contentLength !== undefined) {
      head.framing = "length";
      head.contentLength = Number(contentLength);
    } else {
      head.framing = "close";
      head.keepAlive = false;
    }
    this.lastHead = head;
    this.begin(head);
    return false;
  }

  /** A final response's head is known: its body (if any) is read next; the sink hears of the head (and, without a body, the end). */
  private begin(head: ResponseHead): void {
    this.keepAlive = head.keepAlive;
    if (head.framing === "none" || (head.framing === "length" && head.contentLength === 0)) {
      this.state = "done";
      this.sink.onHead(head);
      this.sink.onEnd();
      return;
    }
    this.state = head.framing === "length" ? "length" : head.framing === "chunked" ? "chunk-size" : "close";
    this.remaining = head.contentLength;
    this.sink.onHead(head);
  }

  private chunkSizeLine(line: string): void {
    const semi = line.indexOf(";");
    const hex = (semi < 0 ? line : line.slice(0, semi)).trim();
    if (!/^[0-9a-fA-F]{1,12}$/.test(hex)) throw new ResponseParseError(`invalid chunk size "${hex.slice(0, 20)}"`);
    const size = parseInt(hex, 16);
    if (size === 0) {
      this.state = "trailers";
      this.trailerBytes = 0;
      return;
    }
    this.state = "chunk-data";
    this.remaining = size;
  }

  private trailerLine(line: string): void {
    // Trailers are dropped (the gateway re-frames the body); only their size is bounded.
    this.trailerBytes += line.length;
    if (this.trailerBytes > this.maxHeadBytes) throw new ResponseParseError("trailers too large");
    if (line === "\r\n") {
      this.state = "done";
      this.sink.onEnd();
    }
  }
}

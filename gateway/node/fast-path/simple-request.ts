// Recognises the one kind of request the raw front takes itself: a whole, bodiless HTTP/1.1 request head alone in its bytes.
//
// This is not an HTTP parser that answers errors: it says "simple" or "not for me". Anything it does not fully
// recognise — a head split over reads, bytes after the head (pipelining), a body, `Expect`, `Upgrade`, a second
// `Host`, obsolete line folding, a character outside the strict grammar, HTTP/1.0 — goes to Node's own parser
// (llhttp), which answers it or its errors as it always did. So the strict rules here can only send more requests
// to Node, never accept what Node would refuse.

import { badHeadChar } from "./head-chars.ts";

/** A request head the raw front can answer itself. */
export interface SimpleRequest {
  method: string;
  url: string;
  /** Flat [name, value, …] as sent (names keep their case), like Node's `rawHeaders`. */
  rawHeaders: string[];
  /** Lower-case names; a repeated header's values joined with ", " (only headers where that is lossless repeat: see below). */
  headers: Record<string, string>;
  /** `Connection: close`: the connection ends after this response. */
  close: boolean;
}

const crlfcrlf = Buffer.from("\r\n\r\n", "latin1");
// Methods whose requests are taken without a body (a body would need framing: those go to Node).
const bodiless = new Set(["GET", "HEAD", "DELETE", "OPTIONS"]);
// request-target in origin form, visible ASCII only.
const requestLineRe = /^([A-Z]+) (\/[\x21-\x7e]*) HTTP\/1\.1$/;
const tokenRe = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
// Client-chosen keys: no Object.prototype behind them (as Node's own headers object). An object whose prototype is an
// empty null-prototype object stays a fast-mode object (one made by Object.create(null) is a dictionary).
const headersProto = Object.create(null) as object;
/** Headers that make a request something other than a plain bodiless exchange. */
const notSimple = new Set(["content-length", "transfer-encoding", "expect", "upgrade", "http2-settings"]);
/** Headers Node keeps the first of (and a repeat of which is a smell): a repeat here goes to Node. */
const single = new Set(["host", "authorization", "user-agent", "proxy-authorization", "cookie"]);

/**
 * The request in `chunk` when it is one simple head and nothing else, at most `maxHeadBytes`; otherwise undefined
 * (the bytes go to Node's parser).
 */
export function simpleRequest(chunk: Buffer, maxHeadBytes: number): SimpleRequest | undefined {
  const n = chunk.length;
  if (n < 18 || n > maxHeadBytes) return undefined;
  // The head must end exactly where the bytes end: nothing before it ends (that would be a body or a second request).
  if (chunk[n - 1] !== 10 || chunk[n - 2] !== 13 || chunk[n - 3] !== 10 || chunk[n - 4] !== 13) return undefined;
  if (chunk.indexOf(crlfcrlf) !== n - 4) return undefined;
  const text = chunk.toString("latin1", 0, n - 4);
  if (badHeadChar(text) >= 0) return undefined; // field values: visible ASCII, space, tab and obs-text
  let lineEnd = text.indexOf("\r\n");
  const m = requestLineRe.exec(lineEnd < 0 ? text : text.slice(0, lineEnd));
  if (!m || !bodiless.has(m[1]!)) return undefined;
  const rawHeaders: string[] = [];
  const headers = Object.create(headersProto) as Record<string, string>;
  let close = false;
  let hosts = 0;
  while (lineEnd >= 0) {
    const start = lineEnd + 2;
    lineEnd = text.indexOf("\r\n", start);
    const line = lineEnd < 0 ? text.slice(start) : text.slice(start, lineEnd);
    const colon = line.indexOf(":");
    if (colon <= 0) return undefined;
    const name = line.slice(0, colon);
    if (!tokenRe.test(name)) return undefined;
    const value = owsTrimmed(line, colon + 1);
    const k = name.toLowerCase();
    if (notSimple.has(k)) return undefined;
    const prior = headers[k];
    if (prior !== undefined) {
      if (single.has(k)) return undefined;
      headers[k] = `${prior}, ${value}`;
    } else headers[k] = value;
    if (k === "host") hosts++;
    else if (k === "connection") {
      for (const t of value.split(",")) {
        const token = t.trim().toLowerCase();
        if (token === "close") close = true;
        else if (token === "upgrade") return undefined;
      }
    }
    rawHeaders.push(name, value);
  }
  if (hosts !== 1) return undefined;
  return { method: m[1]!, url: m[2]!, rawHeaders, headers, close };
}

/** `line` from `from`, without the optional whitespace (space, tab) around a field value: what llhttp strips (not JS's trim, which also strips NBSP). */
function owsTrimmed(line: string, from: number): string {
  let start = from;
  let end = line.length;
  while (start < end && (line.charCodeAt(start) === 32 || line.charCodeAt(start) === 9)) start++;
  while (end > start && (line.charCodeAt(end - 1) === 32 || line.charCodeAt(end - 1) === 9)) end--;
  return line.slice(start, end);
}

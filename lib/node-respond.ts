// Writing our own answers on Node (gateway and host alike): the one error envelope (lib/errors.ts), to a response or a raw socket.
import { STATUS_CODES } from "node:http";
import type { Duplex } from "node:stream";
import { renderError } from "./errors.ts";

/** What an answer is written to: Node's ServerResponse, or the gateway's raw front's response. */
export interface AnswerSink {
  readonly headersSent: boolean;
  readonly destroyed: boolean;
  writeHead(status: number, headers: string[]): unknown;
  end(body?: string): unknown;
  destroy(): unknown;
}

/** Answers with the error envelope unless the response already started (then the connection is cut: a truncated body must look truncated). */
export function sendError(res: AnswerSink, err: unknown, requestId: string, opts: { closeConnection?: boolean } = {}): void {
  if (res.headersSent || res.destroyed) {
    res.destroy();
    return;
  }
  const e = renderError(err, requestId);
  const headers: string[] = [];
  for (const [k, v] of e.headers) headers.push(k, v);
  headers.push("content-length", String(Buffer.byteLength(e.body)));
  // An unread request body would otherwise be read and thrown away before the connection could be reused.
  if (opts.closeConnection) headers.push("connection", "close");
  res.writeHead(e.status, headers);
  res.end(e.body);
}

/** An error envelope straight onto a socket that is not an HTTP response (a refused WebSocket upgrade), then closes it. */
export function sendErrorOnSocket(socket: Duplex, err: unknown, requestId: string, extraHeaders: [string, string][] = []): void {
  if (!socket.destroyed) socket.end(errorResponseText(err, requestId, extraHeaders));
}

/**
 * The whole HTTP answer (head and envelope, `Connection: close`) as text, synchronously: for a writer that must put
 * it on the socket in the same tick it decided to (a refused connection, a cut body), before anything else can write.
 */
export function errorResponseText(err: unknown, requestId: string, extraHeaders: [string, string][] = []): string {
  const e = renderError(err, requestId);
  let head = `HTTP/1.1 ${e.status} ${STATUS_CODES[e.status] ?? ""}\r\n`;
  for (const [k, v] of [...e.headers, ...extraHeaders]) head += `${k}: ${v}\r\n`;
  return `${head}content-length: ${Buffer.byteLength(e.body)}\r\nconnection: close\r\n\r\n${e.body}`;
}

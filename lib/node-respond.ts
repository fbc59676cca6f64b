// Writing our own answers on Node (gateway and host alike): the one error envelope (lib/errors.ts), to a response or a raw socket.
import { STATUS_CODES, type ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import { toErrorResponse } from "./errors.ts";

export interface RenderedError {
  status: number;
  headers: [string, string][];
  body: string;
}

/** The envelope `toErrorResponse` renders (the same one the Hono app answers with), as parts a Node writer can use. */
export async function renderError(err: unknown, requestId: string): Promise<RenderedError> {
  const r = toErrorResponse(err, requestId);
  const headers: [string, string][] = [];
  r.headers.forEach((v, k) => headers.push([k, v]));
  return { status: r.status, headers, body: await r.text() };
}

/** Answers with the error envelope unless the response already started (then the connection is cut: a truncated body must look truncated). */
export async function sendError(res: ServerResponse, err: unknown, requestId: string, opts: { closeConnection?: boolean } = {}): Promise<void> {
  if (res.headersSent || res.destroyed) {
    res.destroy();
    return;
  }
  const e = await renderError(err, requestId);
  if (res.headersSent || res.destroyed) return;
  const headers: string[] = [];
  for (const [k, v] of e.headers) headers.push(k, v);
  headers.push("content-length", String(Buffer.byteLength(e.body)));
  // An unread request body would otherwise be read and thrown away before the connection could be reused.
  if (opts.closeConnection) headers.push("connection", "close");
  res.writeHead(e.status, headers);
  res.end(e.body);
}

/** An error envelope straight onto a socket that is not an HTTP response (a refused WebSocket upgrade), then closes it. */
export async function sendErrorOnSocket(socket: Duplex, err: unknown, requestId: string, extraHeaders: [string, string][] = []): Promise<void> {
  const e = await renderError(err, requestId);
  e.headers.push(...extraHeaders);
  if (socket.destroyed) return;
  let head = `HTTP/1.1 ${e.status} ${STATUS_CODES[e.status] ?? ""}\r\n`;
  for (const [k, v] of e.headers) head += `${k}: ${v}\r\n`;
  head += `content-length: ${Buffer.byteLength(e.body)}\r\nconnection: close\r\n\r\n`;
  socket.end(head + e.body);
}

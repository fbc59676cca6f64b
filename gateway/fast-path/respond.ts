// Writing the gateway's own answers on Node: the one error envelope (lib/errors.ts) and plain answers, to a response or a raw socket.
import { STATUS_CODES, type ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import { AppError, toErrorResponse } from "../../lib/errors.ts";
import type { Logger } from "../../lib/log.ts";
import type { PlainAnswer } from "../proxy-policy.ts";

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

/** Logs a failed call the way the Hono app's error handler does: 5xx as errors, the rest as rejections. */
export function logFailure(log: Logger, err: unknown, fields: { requestId: string; method: string; path: string; agentId?: string }): void {
  const status = err instanceof AppError ? err.status : 500;
  const entry = { ...fields, status, code: err instanceof AppError ? err.code : "internal", err: err instanceof Error ? err.message : String(err) };
  if (status >= 500) log.error("request failed", { ...entry, stack: err instanceof AppError || !(err instanceof Error) ? undefined : err.stack });
  else log.info("request rejected", entry);
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

export function sendPlain(res: ServerResponse, a: PlainAnswer): void {
  const headers: string[] = [];
  for (const [k, v] of Object.entries(a.headers)) headers.push(k, v);
  if (a.status !== 204) headers.push("content-length", String(Buffer.byteLength(a.body)));
  res.writeHead(a.status, headers);
  res.end(a.status === 204 ? undefined : a.body);
}

/** An error envelope straight onto a socket that is not an HTTP response (a refused WebSocket upgrade), then closes it. */
export async function sendErrorOnSocket(socket: Duplex, err: unknown, requestId: string): Promise<void> {
  const e = await renderError(err, requestId);
  if (socket.destroyed) return;
  let head = `HTTP/1.1 ${e.status} ${STATUS_CODES[e.status] ?? ""}\r\n`;
  for (const [k, v] of e.headers) head += `${k}: ${v}\r\n`;
  head += `content-length: ${Buffer.byteLength(e.body)}\r\nconnection: close\r\n\r\n`;
  socket.end(head + e.body);
}

// Plain answers of the gateway's own on the Node fast path (non-waking traffic); errors go through lib/node-respond.ts.
import { STATUS_CODES } from "node:http";
import type { AnswerSink } from "../../../lib/node-respond.ts";
import type { PlainAnswer } from "../../proxy/policy.ts";

export function sendPlain(res: AnswerSink, a: PlainAnswer): void {
  const headers: string[] = [];
  for (const [k, v] of Object.entries(a.headers)) headers.push(k, v);
  if (a.status !== 204) headers.push("content-length", String(Buffer.byteLength(a.body)));
  res.writeHead(a.status, headers);
  res.end(a.status === 204 ? undefined : a.body);
}

/** The same answer as the whole HTTP/1.1 text (`Connection: close`), for a socket no ServerResponse owns (an upgrade). */
export function plainResponseText(a: PlainAnswer): string {
  let head = `HTTP/1.1 ${a.status} ${STATUS_CODES[a.status] ?? ""}\r\n`;
  for (const [k, v] of Object.entries(a.headers)) head += `${k}: ${v}\r\n`;
  const body = a.status === 204 ? "" : a.body;
  return `${head}${a.status === 204 ? "" : `content-length: ${Buffer.byteLength(body)}\r\n`}connection: close\r\n\r\n${body}`;
}

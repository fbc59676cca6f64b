// Plain answers of the gateway's own on the Node fast path (non-waking traffic); errors go through lib/node-respond.ts.
import type { ServerResponse } from "node:http";
import type { PlainAnswer } from "../../proxy/policy.ts";

export function sendPlain(res: ServerResponse, a: PlainAnswer): void {
  const headers: string[] = [];
  for (const [k, v] of Object.entries(a.headers)) headers.push(k, v);
  if (a.status !== 204) headers.push("content-length", String(Buffer.byteLength(a.body)));
  res.writeHead(a.status, headers);
  res.end(a.status === 204 ? undefined : a.body);
}

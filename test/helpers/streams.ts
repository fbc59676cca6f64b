// Real stream clients for tests: a WebSocket opener that reports refusals, and an SSE reader that times arrivals.
import type { IncomingMessage } from "node:http";
import WebSocket from "ws";

export interface Opened {
  ws: WebSocket;
  response: IncomingMessage;
}

/** Opens a WebSocket; rejects with `{status, body, headers}` on a non-101 answer. */
export function openWebSocket(url: string, headers: Record<string, string> = {}): Promise<Opened> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, { headers });
    let response: IncomingMessage | undefined;
    ws.once("upgrade", (res) => (response = res));
    ws.once("open", () => resolve({ ws, response: response! }));
    ws.once("unexpected-response", (_req, res) => {
      let body = "";
      res.on("data", (c: Buffer) => (body += c.toString()));
      res.on("end", () => reject(Object.assign(new Error(`HTTP ${res.statusCode}`), { status: res.statusCode, body, headers: res.headers })));
    });
    ws.once("error", reject);
  });
}

/** Reads an event stream to its end; answers its text and when each event (blank-line ended) arrived. */
export async function readEventStream(res: Response): Promise<{ text: string; arrivals: number[] }> {
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  const arrivals: number[] = [];
  let text = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    const before = (text.match(/\n\n/g) ?? []).length;
    text += decoder.decode(value, { stream: true });
    const after = (text.match(/\n\n/g) ?? []).length;
    for (let i = before; i < after; i++) arrivals.push(Date.now());
  }
  return { text, arrivals };
}

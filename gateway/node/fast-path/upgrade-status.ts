// The status an upgrade was answered with: read off the first HTTP head written to its socket (the relay's 101, or a refusal).
import type { Duplex } from "node:stream";

const statusLine = /^HTTP\/1\.[01] (\d{3})/;

/**
 * Watches the socket's first `write` or `end` with data, then steps aside. The fleet writes most answers itself (its
 * relay's `101`, the agent's or the host's refusal, a failed handshake's envelope) and the gateway the rest: this
 * sees every one of them, whichever fleet relays. Undefined while nothing was written.
 */
export function watchAnswerStatus(socket: Duplex): () => number | undefined {
  let status: number | undefined;
  const { write, end } = socket;
  const restore = () => {
    socket.write = write;
    socket.end = end;
  };
  const peek = (chunk: unknown): void => {
    if (typeof chunk !== "string" && !(chunk instanceof Uint8Array)) return;
    restore();
    const head =
      typeof chunk === "string" ? chunk.slice(0, 16) : Buffer.from(chunk.buffer, chunk.byteOffset, Math.min(16, chunk.byteLength)).toString("latin1");
    const m = statusLine.exec(head);
    if (m) status = Number(m[1]);
  };
  socket.write = function (this: Duplex, chunk: unknown, ...rest: unknown[]): boolean {
    peek(chunk);
    return (write as (...args: unknown[]) => boolean).call(this, chunk, ...rest);
  } as Duplex["write"];
  socket.end = function (this: Duplex, chunk?: unknown, ...rest: unknown[]): Duplex {
    peek(chunk);
    return (end as (...args: unknown[]) => Duplex).call(this, chunk, ...rest);
  } as Duplex["end"];
  return () => status;
}

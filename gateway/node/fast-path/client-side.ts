// What the fast path uses of a client's request and response: Node's IncomingMessage/ServerResponse, or the raw front's.
import type { IncomingHttpHeaders } from "node:http";
import type { Socket } from "node:net";

/** An event listener as Node's emitters type it (any arguments: the events differ). */
// biome-ignore lint/suspicious/noExplicitAny: the listener type of Node's own emitters, which both sides must accept
type Listener = (...args: any[]) => void;

/** A client's request as the fast path reads it (a body, if any, arrives as `data` events). */
export interface ClientRequest {
  readonly method?: string | undefined;
  readonly url?: string | undefined;
  readonly headers: IncomingHttpHeaders;
  readonly rawHeaders: string[];
  readonly socket: Socket;
  /** The whole request (body included) was received. */
  readonly complete: boolean;
  on(event: string, fn: Listener): unknown;
  off(event: string, fn: Listener): unknown;
  pause(): unknown;
  resume(): unknown;
}

/** A response to a client as the fast path writes it. */
export interface ClientResponse {
  readonly headersSent: boolean;
  readonly statusCode: number;
  readonly destroyed: boolean;
  readonly writableEnded: boolean;
  readonly socket: Socket | null;
  on(event: string, fn: Listener): unknown;
  once(event: string, fn: Listener): unknown;
  off(event: string, fn: Listener): unknown;
  setHeader(name: string, value: string): unknown;
  writeHead(status: number, headers: string[]): unknown;
  writeHead(status: number, reason: string, headers: string[]): unknown;
  writeContinue(): void;
  write(chunk: Buffer | string): boolean;
  end(chunk?: Buffer | string): unknown;
  destroy(): unknown;
}

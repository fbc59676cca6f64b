// The SDK's HTTP core over the runtime's fetch: the base URL and token, JSON in and out, the error envelope as AgentVMError, ndjson lines.
import { AgentVMError } from "./errors.ts";

export interface HttpOptions {
  baseUrl: string;
  token: string | undefined;
  fetch: typeof fetch;
  headers: Record<string, string>;
}

export type Query = Record<string, string | number | boolean | undefined>;

export interface RequestOptions {
  query?: Query;
  /** Sent as JSON. */
  json?: unknown;
  /** Sent as is (bytes, a Blob, a stream). */
  body?: BodyInit;
  headers?: Record<string, string>;
  signal?: AbortSignal | undefined;
}

/** Path segments are ids from the API; encoded all the same. */
export const seg = (s: string | number) => encodeURIComponent(String(s));

export class Http {
  readonly baseUrl: string;
  readonly token: string | undefined;
  private readonly doFetch: typeof fetch;
  private readonly headers: Record<string, string>;

  constructor(opts: HttpOptions) {
    this.baseUrl = opts.baseUrl.replace(/\/+$/, "");
    this.token = opts.token;
    this.doFetch = opts.fetch;
    this.headers = opts.headers;
  }

  url(path: string, query?: Query): string {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined) q.set(k, String(v));
    const s = q.toString();
    return `${this.baseUrl}${path}${s ? `?${s}` : ""}`;
  }

  /** The headers every call carries: the bearer token and the client's own. */
  authHeaders(extra?: HeadersInit): Headers {
    const h = new Headers(this.headers);
    if (this.token) h.set("authorization", `Bearer ${this.token}`);
    new Headers(extra).forEach((v, k) => h.set(k, v));
    return h;
  }

  /** A call whose answer is checked: a response that is not 2xx is thrown as its AgentVMError (its body read). */
  async raw(method: string, path: string, opts: RequestOptions = {}): Promise<Response> {
    const headers = this.authHeaders(opts.headers);
    let body: BodyInit | undefined = opts.body;
    if (opts.json !== undefined) {
      body = JSON.stringify(opts.json);
      headers.set("content-type", "application/json");
    }
    const init: RequestInit & { duplex?: "half" } = {
      method,
      headers,
      ...(body !== undefined ? { body } : {}),
      ...(opts.signal ? { signal: opts.signal } : {}),
    };
    // A streamed request body needs half duplex in Node's fetch (and is harmless elsewhere).
    if (body instanceof ReadableStream) init.duplex = "half";
    const response = await this.send(this.url(path, opts.query), init);
    if (!response.ok) throw await AgentVMError.fromResponse(response);
    return response;
  }

  /** fetch, with a gateway that does not answer told as AgentVMError `unreachable` (an abort is rethrown as it is). */
  async send(url: string, init: RequestInit): Promise<Response> {
    try {
      return await this.doFetch(url, init);
    } catch (err) {
      const name = (err as { name?: string } | null)?.name;
      if (name === "AbortError" || name === "TimeoutError") throw err;
      const cause = (err as { cause?: { code?: string; message?: string } }).cause;
      throw new AgentVMError("unreachable", `cannot reach ${this.baseUrl} (${cause?.code ?? cause?.message ?? (err as Error).message})`, { cause: err });
    }
  }

  /** A call answered with JSON (an empty 204 answers undefined). */
  async json<T>(method: string, path: string, opts: RequestOptions = {}): Promise<T> {
    const response = await this.raw(method, path, { ...opts, headers: { accept: "application/json", ...opts.headers } });
    if (response.status === 204) return undefined as T;
    const text = await response.text();
    return (text ? JSON.parse(text) : undefined) as T;
  }
}

/** The lines of a body as they arrive (the last one without its newline too). */
export async function* lines(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  const reader = body.getReader();
  let buffered = "";
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      let nl: number;
      while ((nl = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        if (line.trim()) yield line;
      }
    }
    buffered += decoder.decode();
    if (buffered.trim()) yield buffered;
  } finally {
    // An iterator left early (break, a throw) cancels the rest: the command ends with its connection.
    await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}

/** Bytes as base64, in any runtime (btoa over latin-1 chunks). */
export function toBase64(bytes: Uint8Array): string {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

/** base64 as bytes. */
export function fromBase64(text: string): Uint8Array {
  const s = atob(text);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

/** Reads a process's environment where the runtime has one (Node, Bun, Deno with permission); undefined elsewhere. */
export function envVar(name: string): string | undefined {
  try {
    const env = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env;
    return env?.[name] || undefined;
  } catch {
    return undefined;
  }
}

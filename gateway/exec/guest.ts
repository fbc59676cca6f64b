// One call to an agent's exec server through the Fleet port (target `exec`): woken and held like a proxied call, its answers' faults as the error envelope.
import type { AgentSpec } from "../../contracts/agent.ts";
import type { Fleet, GuestCall } from "../../contracts/fleet.ts";

export type { GuestCall } from "../../contracts/fleet.ts";
import { AppError, errorStatus, type ErrorCode } from "../../lib/errors.ts";
import { concatBytes } from "../../lib/bytes.ts";

/** No limit on a timer the host sweeps (the longest `setTimeout` takes), ms. */
export const noLimitMs = 2_147_483_647;

/**
 * Sends `call` to the agent's exec server, waking the agent (reason `api`, or the call's: not an agent call) and holding it awake
 * until the answer's body is over. A 2xx answer is returned as it streams; the exec server's refusals (400, 403, 404,
 * 409, 413) come back as the envelope's codes (`bad_request`, `forbidden_path`, `not_found`…), with its message.
 */
export async function callGuest(fleet: Fleet, agent: AgentSpec, call: GuestCall): Promise<Response> {
  const init: RequestInit & { duplex?: "half" } = { method: call.method, headers: call.headers ?? {} };
  if (call.body) {
    init.body = call.body as BodyInit;
    init.duplex = "half";
  }
  if (call.signal) init.signal = call.signal;
  const req = new Request(new URL(call.path, "http://exec"), init);
  const res = await fleet.forward(agent, req, {
    requestId: call.requestId,
    reason: call.reason ?? "api",
    target: "exec",
    ...(call.signal ? { signal: call.signal } : {}),
    limits: { responseTimeoutMs: call.responseTimeoutMs, proxyIdleTimeoutMs: call.idleTimeoutMs },
  });
  if (res.status < 300) return res;
  throw await guestError(res, agent.id);
}

/** What the exec server's statuses stand for in the envelope. */
const guestCodes: Record<number, ErrorCode> = {
  400: "bad_request",
  403: "forbidden_path",
  404: "not_found",
  409: "conflict",
  413: "payload_too_large",
};

/** The exec server's refusal as an AppError: its envelope's code and message (`{code, message}`) where the code is one of ours, else by its status. */
export async function guestError(res: Response, agentId: string): Promise<AppError> {
  const { code: given, message } = await shortError(res);
  // 401 (a key this host did not push), 503 (none pushed yet), 5xx: the VM's side is wrong, not the caller's request.
  if (res.status === 401 || res.status >= 500) {
    return new AppError("bad_gateway", `agent ${agentId}'s exec server answered ${res.status}${message ? `: ${message}` : ""}`, {
      ...(res.status === 503 ? { retryAfterS: 1 } : {}),
    });
  }
  const code = given !== undefined && given in errorStatus && errorStatus[given as ErrorCode] === res.status ? (given as ErrorCode) : guestCodes[res.status];
  if (code) return new AppError(code, message || `${res.status} from the exec server`);
  return new AppError("bad_gateway", `agent ${agentId}'s exec server answered ${res.status}${message ? `: ${message}` : ""}`);
}

/** At most 1 KiB of an error answer: its JSON `{code, message}` (or `{error}`), or its first line of text. */
async function shortError(res: Response): Promise<{ code?: string; message: string }> {
  if (!res.body) return { message: "" };
  const reader = res.body.getReader();
  const parts: Uint8Array[] = [];
  let n = 0;
  try {
    while (n < 1024) {
      const next = await reader.read();
      if (next.done) break;
      parts.push(next.value);
      n += next.value.byteLength;
    }
  } catch {
    /* what came is enough */
  } finally {
    void reader.cancel().catch(() => undefined);
  }
  const bytes = new Uint8Array(n);
  let at = 0;
  for (const p of parts) {
    bytes.set(p, at);
    at += p.byteLength;
  }
  const text = new TextDecoder().decode(bytes.subarray(0, 1024)).trim();
  try {
    const parsed = JSON.parse(text) as { code?: unknown; error?: unknown; message?: unknown };
    const code = typeof parsed.code === "string" ? parsed.code : undefined;
    if (typeof parsed.message === "string") return { ...(code ? { code } : {}), message: parsed.message.slice(0, 500) };
    if (typeof parsed.error === "string") return { message: parsed.error.slice(0, 500) };
  } catch {
    /* plain text */
  }
  return { message: text.split("\n")[0]!.slice(0, 500) };
}

/** The body read whole, up to `max` bytes (a JSON answer of the exec server: a process, a listing). */
export async function readAll(res: Response, max: number): Promise<Uint8Array> {
  if (!res.body) return new Uint8Array(0);
  const reader = res.body.getReader();
  const parts: Uint8Array[] = [];
  let n = 0;
  for (;;) {
    const next = await reader.read();
    if (next.done) break;
    n += next.value.byteLength;
    if (n > max) {
      void reader.cancel().catch(() => undefined);
      throw new AppError("bad_gateway", `the exec server's answer passed ${max} bytes`);
    }
    parts.push(next.value);
  }
  return concatBytes(...parts);
}

/** The exec server's JSON answer. */
export async function readJson<T>(res: Response, max = 16 * 1024 * 1024): Promise<T> {
  const bytes = await readAll(res, max);
  try {
    return JSON.parse(new TextDecoder().decode(bytes)) as T;
  } catch (err) {
    throw new AppError("bad_gateway", "the exec server answered JSON that does not parse", { cause: err });
  }
}

/** Bytes as base64 (runtime-free: btoa over chunks). */
export function toBase64(bytes: Uint8Array): string {
  let out = "";
  for (let i = 0; i < bytes.byteLength; i += 0x7ffe) {
    // Chunks of a multiple of 3 bytes: each one's base64 joins the next without padding in between.
    out += btoa(String.fromCharCode(...bytes.subarray(i, Math.min(i + 0x7ffe, bytes.byteLength))));
  }
  return out;
}

/** base64 text as bytes; 400 when it is not base64. */
export function fromBase64(text: string, what: string): Uint8Array {
  const clean = text.replace(/\s+/g, "");
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(clean) || clean.length % 4 === 1) throw new AppError("bad_request", `${what}: not base64`);
  let bin: string;
  try {
    bin = atob(clean);
  } catch {
    throw new AppError("bad_request", `${what}: not base64`);
  }
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

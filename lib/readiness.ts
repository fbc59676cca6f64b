// `/readyz`: whether a process has what it depends on, naming what is missing, within a short timeout (`/healthz` stays a liveness check).
import { AppError, toErrorResponse, type ErrorCode } from "./errors.ts";

export interface ReadinessCheck {
  /** The code the answer carries when this dependency is down (`database_unavailable`, …). */
  code: ErrorCode;
  /** Resolves when the dependency answers. */
  check: () => Promise<unknown>;
}

/** Dependencies by name (`database`, …). */
export type ReadinessChecks = Record<string, ReadinessCheck>;

/** How long one check may take before its dependency counts as down, ms. */
export const readinessTimeoutMs = 1000;

/**
 * `200 {"ok":true,"database":"up",…}` when every check answers within `timeoutMs`; otherwise the error envelope with
 * the first missing dependency's code, `Retry-After`, and `details` naming each dependency `up` or `down`.
 */
export async function readinessResponse(checks: ReadinessChecks, requestId: string, timeoutMs = readinessTimeoutMs): Promise<Response> {
  const names = Object.keys(checks);
  const states = await Promise.all(
    names.map((name) =>
      within(checks[name]!.check(), timeoutMs).then(
        () => "up" as const,
        () => "down" as const,
      ),
    ),
  );
  const details = Object.fromEntries(names.map((name, i) => [name, states[i]!]));
  const down = names.filter((_, i) => states[i] === "down");
  if (down.length === 0) {
    return new Response(JSON.stringify({ ok: true, ...details }), {
      headers: { "content-type": "application/json; charset=utf-8", "cache-control": "no-store", "x-request-id": requestId },
    });
  }
  const res = toErrorResponse(
    new AppError(checks[down[0]!]!.code, `not ready: ${down.map((n) => `${n} down`).join(", ")}`, { retryAfterS: 2, details }),
    requestId,
  );
  res.headers.set("cache-control", "no-store");
  return res;
}

function within<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

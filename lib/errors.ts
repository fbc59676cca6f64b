// One error type for the whole system: a code, a message, and one exhaustive code → HTTP status map.
import type { Logger } from "./log.ts";

export const errorStatus = {
  bad_request: 400,
  invalid_id: 400,
  unauthorized: 401,
  invalid_signature: 401,
  forbidden: 403,
  /** An exec or files call named a path it may not touch: the guest agent's own paths, `/proc`, `/sys`, `/dev`, a device node. */
  forbidden_path: 403,
  /** A token names a tenant that was never created (and first-use provisioning is off). */
  tenant_not_found: 403,
  /** The token's tenant, or the called agent's, is suspended by an operator: nothing answers until it is resumed. */
  tenant_suspended: 403,
  /** The tenant was deleted: its agents are gone, its usage is kept for invoicing. */
  tenant_deleted: 403,
  not_found: 404,
  /** An agent called `/u/<name>/…` at its egress proxy, and its tenant has no upstream of that name. */
  upstream_not_found: 404,
  method_not_allowed: 405,
  /** A request's head or body did not arrive within its deadline (or its body stalled below the progress floor). */
  request_timeout: 408,
  conflict: 409,
  replay: 409,
  /** The agent's guest was built before the exec server (its snapshot carries the old guest): a restart (cold boot) updates it. */
  guest_outdated: 409,
  /** A desktop call (`/v1/agents/{id}/desktop/…`) to an agent whose image has no desktop (not built FROM agentvm/desktop). */
  no_desktop: 409,
  /** A pool's every agent is handed out and it holds `maxSize`: release one, or raise `maxSize`. */
  pool_exhausted: 409,
  /** An upstream call's `Idempotency-Key` was used before by this agent for another request (another request hash). */
  idempotency_conflict: 409,
  /** The first call with this `Idempotency-Key` is still in flight (or its outcome cannot be replayed): `Retry-After`. */
  idempotency_in_flight: 409,
  payload_too_large: 413,
  /** A body route got a media type it does not take. */
  unsupported_media_type: 415,
  headers_too_large: 431,
  unprocessable: 422,
  /** An image build or import failed on its input (a bad Containerfile, a RUN that failed): the message has the log's tail. */
  build_failed: 422,
  /** An uploaded image archive is not an OCI archive or a `docker save` tarball, or is corrupt. */
  bad_archive: 400,
  rate_limited: 429,
  /**
   * The caller closed its connection before the answer (nginx's 499): nobody reads this answer; it is logged as a
   * rejection, not as the agent's or the gateway's failure.
   */
  client_gone: 499,
  /** This client address holds as many connections as it may; `Retry-After`. */
  too_many_connections: 429,
  internal: 500,
  /**
   * Checkpoints cannot be kept here: the host's driver has no memory to copy (the process driver), or this gateway
   * keeps no checkpoint records. 501, not 409: nothing the caller changes about the agent makes it work, and a retry
   * never does; it is this deployment that lacks the capability.
   */
  checkpoints_unsupported: 501,
  /** This gateway was built without an upstream key (UPSTREAM_KEY_FILE; a Worker's UPSTREAM_KEY): it keeps no upstreams. */
  upstreams_unsupported: 501,
  /** The host's driver cannot run commands or reach files inside its VMs. */
  exec_unsupported: 501,
  bad_gateway: 502,
  /**
   * The agent's host cannot be reached now, or its lease ended and the agent is moving to another host (or the call
   * reached a host whose copy of the agent is of an older lease generation): retry after `Retry-After`.
   */
  host_unavailable: 503,
  wake_failed: 503,
  /** The agent's image did not come up: its entrypoint exited, or it never answered on its port within the boot timeout. */
  boot_failed: 503,
  queue_full: 503,
  shutting_down: 503,
  /** The server holds as many connections as it takes in total; `Retry-After`. */
  server_busy: 503,
  /**
   * A component token was refused for its times: the clocks of the host and of its caller (a gateway, or billing for a
   * host's shipment) disagree past the tolerance. The host cannot serve until its clock is right; it drains itself, so
   * its agents move to other hosts as they sleep. `Retry-After`.
   */
  clock_skew: 503,
  /**
   * The agent sleeps on a host that drains, and the host did not wake it: the gateway's call offered to place it
   * elsewhere (`handOff`), or the database did not confirm the host's claim in time. Nothing reached the agent; the
   * gateway places it again and repeats the call there; a client sees it only when it cannot. `Retry-After`.
   */
  host_draining: 503,
  /** Postgres cannot be reached (or timed out): what needs it waits for it to come back; `Retry-After`. */
  database_unavailable: 503,
  gateway_timeout: 504,
} as const satisfies Record<string, number>;

export type ErrorCode = keyof typeof errorStatus;

export class AppError extends Error {
  readonly code: ErrorCode;
  /** Seconds a client should wait before retrying (sent as `Retry-After`). */
  readonly retryAfterS: number | undefined;
  readonly details: unknown;

  constructor(code: ErrorCode, message: string, opts: { retryAfterS?: number; details?: unknown; cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = "AppError";
    this.code = code;
    this.retryAfterS = opts.retryAfterS;
    this.details = opts.details;
  }

  get status(): number {
    return errorStatus[this.code];
  }
}

export interface ErrorBody {
  error: { code: ErrorCode; message: string; requestId: string; details?: unknown };
}

export interface RenderedError {
  status: number;
  headers: [string, string][];
  body: string;
}

/** Any thrown value as the one error envelope's parts, synchronously; unknown errors never leak their message. */
export function renderError(err: unknown, requestId: string): RenderedError {
  const appErr = err instanceof AppError ? err : new AppError("internal", "internal error");
  const body: ErrorBody = { error: { code: appErr.code, message: appErr.message, requestId } };
  if (appErr.details !== undefined) body.error.details = appErr.details;
  const headers: [string, string][] = [
    ["content-type", "application/json; charset=utf-8"],
    ["x-request-id", requestId],
  ];
  if (appErr.retryAfterS !== undefined) headers.push(["retry-after", String(Math.max(1, Math.ceil(appErr.retryAfterS)))]);
  return { status: appErr.status, headers, body: JSON.stringify(body) };
}

/** The envelope as a web `Response` (what the Hono app answers with). */
export function toErrorResponse(err: unknown, requestId: string): Response {
  const e = renderError(err, requestId);
  return new Response(e.body, { status: e.status, headers: e.headers });
}

/**
 * Logs a failed call the same way everywhere: 5xx as errors (with the stack of an unexpected error), the rest as
 * rejections. 501 is a rejection too: the deployment lacks the capability (a driver without checkpoints), no bug.
 */
export function logFailure(log: Logger, err: unknown, fields: { requestId: string; method: string; path: string; agentId?: string }, what = "request"): void {
  const status = err instanceof AppError ? err.status : 500;
  const cause = err instanceof AppError && err.cause !== undefined ? { cause: err.cause instanceof Error ? err.cause.message : String(err.cause) } : {};
  const entry = { ...fields, status, code: err instanceof AppError ? err.code : "internal", err: err instanceof Error ? err.message : String(err), ...cause };
  if (status >= 500 && status !== 501)
    log.error(`${what} failed`, { ...entry, stack: err instanceof AppError || !(err instanceof Error) ? undefined : err.stack });
  else log.info(`${what} rejected`, entry);
}

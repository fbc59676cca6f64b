// Telling "the database cannot be reached" from every other database error, in one place: callers get 503 database_unavailable.
import { sql, type SQL } from "drizzle-orm";
import { AppError } from "../lib/errors.ts";
import type { ReadinessCheck } from "../lib/readiness.ts";

/** What a caller is told to wait before retrying while the database is unavailable, s. */
export const databaseRetryAfterS = 2;

/** The code of the error a query gets at once while the client knows the database is down (schema/db-gate.ts). */
export const gateClosedCode = "DATABASE_UNAVAILABLE";

/** postgres.js's own connection errors, the socket errors a connection attempt fails with, and the gate's. */
const connectionCodes = new Set([
  gateClosedCode,
  "CONNECT_TIMEOUT",
  "CONNECTION_CLOSED",
  "CONNECTION_DESTROYED",
  "CONNECTION_ENDED",
  "ECONNREFUSED",
  "ECONNRESET",
  "ECONNABORTED",
  "ETIMEDOUT",
  "EPIPE",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
]);

/**
 * Server answers that mean "not now" rather than "wrong": shutting down or starting up (57P01–57P03), too many
 * connections (53300), a statement or idle-in-transaction timeout (57014, 25P03), and every connection exception (08…).
 */
const unavailableStates = new Set(["57P01", "57P02", "57P03", "53300", "57014", "25P03"]);

/** `err` and the errors it wraps (drizzle wraps the driver's error as `cause`), innermost last. */
function* causes(err: unknown): Generator<object> {
  let e: unknown = err;
  for (let depth = 0; depth < 6 && typeof e === "object" && e !== null; depth++) {
    yield e;
    e = (e as { cause?: unknown }).cause;
  }
}

/** An error the server sent (postgres.js copies its fields, `severity` among them, onto the error). */
function serverCode(e: object): string | undefined {
  const code = (e as { code?: unknown }).code;
  return "severity" in e && typeof code === "string" ? code : undefined;
}

/**
 * True when `err` or what it wraps says the database is unreachable, went away or timed out. Stops at an AppError
 * (already classified) and at a `fetch` failure (a TypeError: not the database).
 */
export function isDatabaseUnavailable(err: unknown): boolean {
  for (const e of causes(err)) {
    if (e instanceof AppError) return e.code === "database_unavailable";
    if (e instanceof TypeError) return false;
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && connectionCodes.has(code)) return true;
    const state = serverCode(e);
    if (state !== undefined && (unavailableStates.has(state) || state.startsWith("08"))) return true;
  }
  return false;
}

/** Codes that say the connection itself is gone (closed, reset, or ended by the server's shutdown), not just a query. */
const lostCodes = new Set(["CONNECTION_CLOSED", "CONNECTION_DESTROYED", "CONNECTION_ENDED", "ECONNRESET", "EPIPE", "ETIMEDOUT"]);
const lostStates = new Set(["57P01", "57P02", "57P03"]);

/** True when `err` says the connection the query ran on is gone (a statement timeout, say, leaves it usable). */
export function isConnectionLost(err: unknown): boolean {
  for (const e of causes(err)) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && lostCodes.has(code)) return true;
    const state = serverCode(e);
    if (state !== undefined && (lostStates.has(state) || state.startsWith("08"))) return true;
  }
  return false;
}

/** A unique-key violation (23505): a replayed insert that already landed. */
export function isUniqueViolation(err: unknown): boolean {
  for (const e of causes(err)) if (serverCode(e) === "23505") return true;
  return false;
}

/** A transaction Postgres chose to abort against another (deadlock 40P01, serialization 40001): retrying it is the answer. */
export function isTransactionConflict(err: unknown): boolean {
  for (const e of causes(err)) {
    const state = serverCode(e);
    if (state === "40P01" || state === "40001") return true;
  }
  return false;
}

/** The caller's answer to a database outage: 503, `Retry-After`, and no detail of the database (the cause is logged). */
export function databaseUnavailable(cause?: unknown): AppError {
  return new AppError("database_unavailable", "the database is unavailable; retry shortly", { retryAfterS: databaseRetryAfterS, cause });
}

/** A database outage as `database_unavailable`; any other error unchanged. */
export function asDatabaseError(err: unknown): unknown {
  return err instanceof AppError || !isDatabaseUnavailable(err) ? err : databaseUnavailable(err);
}

/** `/readyz`'s database check: `select 1` answered (the readiness answer bounds how long it may take). */
export function databaseCheck(db: { execute(query: SQL): PromiseLike<unknown> }): ReadinessCheck {
  return { code: "database_unavailable", check: async () => db.execute(sql`select 1`) };
}

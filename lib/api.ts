// What every HTTP API route shares: the OpenAPI router, the error envelope as a schema, JSON bodies bounded by the bytes
// read, validation failures as `400 bad_request` with a short message, and opaque cursors for paged lists.
import { OpenAPIHono, z, type RouteConfig } from "@hono/zod-openapi";
import type { Env, MiddlewareHandler } from "hono";
import { HTTPException } from "hono/http-exception";
import { readBodyLimited } from "./body.ts";
import { AppError, errorStatus, type ErrorCode } from "./errors.ts";

export { z };

/** The longest validation message an answer carries: a body naming 50,000 unknown fields must not echo them all. */
const maxIssueText = 300;
const maxIssues = 5;

/** Renders zod's issues as one line: the first few, each path and message shortened. */
export function issuesMessage(issues: readonly { path: readonly PropertyKey[]; message: string }[]): string {
  const shown = issues.slice(0, maxIssues).map((i) => {
    const where = i.path.length > 0 ? `${i.path.map(String).join(".")}: ` : "";
    const text = `${where}${i.message}`;
    return text.length > maxIssueText ? `${text.slice(0, maxIssueText)}…` : text;
  });
  const more = issues.length > maxIssues ? `; and ${issues.length - maxIssues} more` : "";
  return `${shown.join("; ")}${more}`;
}

/** Throws a failed validation as `400 bad_request` (the app's error handler renders it with the request id). */
function failedValidation(result: { success: boolean; error?: unknown }): void {
  if (result.success) return;
  const err = result.error as { issues?: { path: PropertyKey[]; message: string }[] } | undefined;
  throw new AppError("bad_request", issuesMessage(err?.issues ?? []) || "invalid request");
}

/** A router whose routes are described in the OpenAPI document and validated by the same schemas. */
export function apiRouter<E extends Env>(): OpenAPIHono<E> {
  return new OpenAPIHono<E>({ defaultHook: failedValidation });
}

/** The one error envelope, as it appears in the document (lib/errors.ts renders it). */
export const ErrorEnvelope = z
  .object({
    error: z.object({
      code: z.enum(Object.keys(errorStatus) as [ErrorCode, ...ErrorCode[]]),
      message: z.string(),
      requestId: z.string().openapi({ example: "req_V1StGXR8Z5jdHi6B" }),
      details: z.unknown().optional(),
    }),
  })
  .openapi("Error");

const statusText: Record<number, string> = {
  400: "Bad request: a field, a parameter or the body is invalid",
  401: "No valid token",
  403: "The token lacks the scope",
  404: "Not found (another tenant's resources do not exist for the caller)",
  405: "Not allowed here",
  409: "Conflict",
  413: "Body too large",
  415: "Unsupported media type",
  422: "Unprocessable",
  429: "Too many requests (Retry-After)",
  500: "Internal error",
  502: "Bad gateway",
  503: "Unavailable (Retry-After)",
  504: "Timeout",
};

/** The error answers of a route, each with the envelope: `errors(400, 404)`; 401, 403 and 503 are always added. */
export function errors(...statuses: number[]): NonNullable<RouteConfig["responses"]> {
  const all = [...new Set([...statuses, 401, 403, 503])].sort((a, b) => a - b);
  return Object.fromEntries(all.map((s) => [s, { description: statusText[s] ?? "Error", content: { "application/json": { schema: ErrorEnvelope } } }]));
}

/** A JSON answer of a route: `json(AgentSchema, "The agent")`. */
export function json<T extends z.ZodType>(schema: T, description: string) {
  return { description, content: { "application/json": { schema } } } as const;
}

/** A JSON request body of a route (the `jsonBody` middleware must run on the route too). */
export function jsonRequest<T extends z.ZodType>(schema: T) {
  return { body: { content: { "application/json": { schema } }, required: true } } as const;
}

/**
 * JSON bodies of the API, whatever `Content-Type` says (curl's `-d` sends a form type): reads at most `maxBytes` —
 * counted as they arrive, declared or not — then hands the validators the text as `application/json`; an empty body
 * is `{}`; a body with a NUL character (raw or `\u0000`) is `400`. Not for uploads (images) or signed intake
 * (webhooks), which read their bodies themselves.
 */
export function jsonBody(maxBytes: () => number): MiddlewareHandler {
  return async (c, next) => {
    const text = utf8(await readBodyLimited(c.req.raw, maxBytes()));
    // No field takes a NUL (no text Postgres stores can hold one): refused here rather than by the database, as a 500.
    if (nulInJson.test(text)) throw new AppError("bad_request", "the body holds a NUL character (\\u0000)");
    const headers = new Headers(c.req.raw.headers);
    headers.set("content-type", "application/json");
    headers.delete("content-length");
    headers.delete("transfer-encoding");
    const body = text.trim() === "" ? "{}" : text;
    c.req.raw = new Request(c.req.raw.url, { method: c.req.raw.method, headers, body, signal: c.req.raw.signal });
    // The validator parses the text already read rather than encoding it into the new request and reading it back
    // (Hono keeps promises in its body cache, whatever its type says).
    c.req.bodyCache.text = Promise.resolve(body) as unknown as string;
    await next();
  };
}

/** A NUL character in JSON text, raw or escaped (`\u0000` after an even number of backslashes). */
const nulInJson = /\u0000|(?:^|[^\\])(?:\\\\)*\\u0000/i;

/** NUL in a path or query, raw or percent-encoded. */
const nulInUrl = /%00|\u0000/;

/**
 * Every API request: a NUL character in the path or the query is `400 bad_request`. No text Postgres stores can hold
 * one (the query fails with SQLSTATE 22021, a 500), so it is refused before any route or lookup sees it.
 */
export const refuseNul: MiddlewareHandler = async (c, next) => {
  const url = c.req.url;
  if (nulInUrl.test(url.slice(url.indexOf("/", url.indexOf("//") + 2)))) throw new AppError("bad_request", "the path or query holds a NUL character (%00)");
  await next();
};

function utf8(bytes: Uint8Array): string {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw new AppError("bad_request", "body is not UTF-8");
  }
}

/** Hono's own exceptions (a malformed JSON body, a media type refused) as our error, so they get the envelope. */
export function asAppError(thrown: unknown): unknown {
  if (!(thrown instanceof HTTPException)) return thrown;
  const byStatus: Record<number, ErrorCode> = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    413: "payload_too_large",
    415: "unsupported_media_type",
  };
  const code = byStatus[thrown.status];
  return code ? new AppError(code, thrown.message || code.replaceAll("_", " ")) : new AppError("internal", "internal error", { cause: thrown });
}

// ---- Paged lists ----

/** Every list: `limit` items a page by default, at most `maxPageLimit`. */
export const defaultPageLimit = 100;
export const maxPageLimit = 1000;

/** An optional query instant: ISO 8601 with a zone (`Z` or an offset), years 1970 to 9999 (what Postgres holds). */
export const instantQuery = (description: string) =>
  z.iso
    .datetime({ offset: true, error: "must be an ISO-8601 instant with a zone, e.g. 2026-01-31T12:00:00Z" })
    .refine((s) => Number(s.slice(0, 4)) >= 1970, { error: "must be in the years 1970 to 9999" })
    .optional()
    .openapi({ description, example: "2026-01-31T12:00:00Z" });

/** `?cursor=…&limit=…` of every paged list; extend it with the list's own filters. */
export const PageQuery = z.object({
  cursor: z.string().max(1024).optional().openapi({ description: "Opaque: the `nextCursor` of the previous page" }),
  limit: z.coerce
    .number()
    .int()
    .min(1)
    .max(maxPageLimit)
    .default(defaultPageLimit)
    .openapi({ description: `Items per page (default ${defaultPageLimit}, at most ${maxPageLimit})` }),
});

/** `nextCursor` of every page: null on the last one. */
export const NextCursor = z.string().nullable().openapi({ description: "Pass as `cursor` for the next page; null on the last page" });

/** An opaque cursor: the position after the last item shown (the list's sort key), base64url JSON. */
export function encodeCursor(position: readonly (string | number)[]): string {
  const bytes = new TextEncoder().encode(JSON.stringify(position));
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
}

/** A cursor this API did not give (or one of another list): 400. */
export const badCursor = (): AppError => new AppError("bad_request", "cursor is not one this list gave");

/** The position a cursor of ours holds, checked against the shape the list expects; 400 for anything else. */
export function decodeCursor(cursor: string, shape: readonly ("string" | "number")[]): (string | number)[] {
  const bad = badCursor;
  let value: unknown;
  try {
    const bin = atob(cursor.replaceAll("-", "+").replaceAll("_", "/"));
    value = JSON.parse(new TextDecoder().decode(Uint8Array.from(bin, (ch) => ch.charCodeAt(0))));
  } catch {
    throw bad();
  }
  if (!Array.isArray(value) || value.length !== shape.length) throw bad();
  value.forEach((v, i) => {
    if (typeof v !== shape[i] || (typeof v === "number" && !Number.isFinite(v))) throw bad();
  });
  return value as (string | number)[];
}

/** Fetch `limit + 1` rows, show `limit`: the extra one says whether there is a next page. */
export function pageOf<T>(rows: T[], limit: number, position: (last: T) => (string | number)[]): { items: T[]; nextCursor: string | null } {
  if (rows.length <= limit) return { items: rows, nextCursor: null };
  const items = rows.slice(0, limit);
  return { items, nextCursor: encodeCursor(position(items[items.length - 1]!)) };
}

// What billing's routes share: JSON-or-CSV answers, the tenant query parameter's check, their OpenAPI tags.
import type { Context } from "hono";
import { z } from "../../lib/api.ts";
import { AppError } from "../../lib/errors.ts";

export const tags = ["billing"];
export const rateTags = ["rate cards"];

const csvText = z.string().openapi({ description: "RFC 4180 CSV with a header row" });
const nextCursorHeader = z.object({ "x-next-cursor": z.string().optional().openapi({ description: "The next page's cursor, when there is one" }) });

/** A 200 answer that is JSON, or CSV with `format=csv` / `Accept: text/csv`. */
export function jsonOrCsv<T extends z.ZodType>(schema: T, description: string, opts: { paged?: boolean } = {}) {
  return {
    description,
    ...(opts.paged ? { headers: nextCursorHeader } : {}),
    content: { "application/json": { schema }, "text/csv": { schema: csvText } },
  } as const;
}

export function wantsCsv(c: Context, format: "json" | "csv" | undefined): boolean {
  return format !== undefined ? format === "csv" : (c.req.header("accept") ?? "").includes("text/csv");
}

export function csvResponse(c: Context, body: string, name: string, nextCursor: string | null = null): Response {
  return c.body(body, 200, {
    "content-type": "text/csv; charset=utf-8",
    "content-disposition": `attachment; filename="${name}.csv"`,
    ...(nextCursor ? { "x-next-cursor": nextCursor } : {}),
  });
}

/** A `tenantId` query parameter is allowed, but only naming the caller's own tenant. */
export function checkTenantParam(query: { tenantId?: string | undefined; tenant?: string | undefined }, tenantId: string): void {
  const asked = query.tenantId ?? query.tenant;
  if (asked !== undefined && asked !== tenantId) throw new AppError("not_found", "tenant not found");
}

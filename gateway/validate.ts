// Small, explicit validation of JSON request bodies: each field checked, each failure named.
import { AppError } from "../lib/errors.ts";

export type Json = Record<string, unknown>;

/** Reads a JSON object body (size already bounded by the gateway); 400 on anything else. */
export async function jsonBody(req: Request): Promise<Json> {
  const text = await req.text();
  if (text.trim() === "") return {};
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new AppError("bad_request", "body is not valid JSON");
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw new AppError("bad_request", "body must be a JSON object");
  return value as Json;
}

export function optInt(body: Json, key: string, range: { min: number; max: number }): number | undefined {
  const v = body[key];
  if (v === undefined) return undefined;
  if (typeof v !== "number" || !Number.isInteger(v) || v < range.min || v > range.max) {
    throw new AppError("bad_request", `${key} must be an integer from ${range.min} to ${range.max}`);
  }
  return v;
}

export function optBool(body: Json, key: string): boolean | undefined {
  const v = body[key];
  if (v === undefined) return undefined;
  if (typeof v !== "boolean") throw new AppError("bad_request", `${key} must be true or false`);
  return v;
}

export function optString(body: Json, key: string, pattern: RegExp, hint: string): string | undefined {
  const v = body[key];
  if (v === undefined) return undefined;
  if (typeof v !== "string" || !pattern.test(v)) throw new AppError("bad_request", `${key} must be ${hint}`);
  return v;
}

export function optStringList(body: Json, key: string, maxItems: number, maxLength: number): string[] | undefined {
  const v = body[key];
  if (v === undefined) return undefined;
  if (!Array.isArray(v) || v.length > maxItems || v.some((s) => typeof s !== "string" || s.length === 0 || s.length > maxLength)) {
    throw new AppError("bad_request", `${key} must be a list of at most ${maxItems} non-empty strings of at most ${maxLength} characters`);
  }
  return v as string[];
}

export function rejectUnknown(body: Json, known: readonly string[]): void {
  const unknown = Object.keys(body).filter((k) => !known.includes(k));
  if (unknown.length > 0) throw new AppError("bad_request", `unknown field(s): ${unknown.join(", ")}`);
}

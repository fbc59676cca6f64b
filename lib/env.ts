// Typed readers for environment variables, used only by each program's config module at its edge.
import { AppError } from "./errors.ts";

export type Env = Record<string, string | undefined>;

function fail(name: string, why: string): never {
  throw new AppError("bad_request", `configuration: ${name} ${why}`);
}

export function str(env: Env, name: string, fallback: string): string {
  const v = env[name];
  return v === undefined || v === "" ? fallback : v;
}

export function optStr(env: Env, name: string): string | undefined {
  const v = env[name];
  return v === undefined || v === "" ? undefined : v;
}

export function int(env: Env, name: string, fallback: number, range: { min?: number; max?: number } = {}): number {
  const raw = env[name];
  if (raw === undefined || raw === "") return fallback;
  if (!/^-?\d+$/.test(raw.trim())) fail(name, `must be an integer, got "${raw}"`);
  const v = Number(raw);
  if (range.min !== undefined && v < range.min) fail(name, `must be ≥ ${range.min}, got ${v}`);
  if (range.max !== undefined && v > range.max) fail(name, `must be ≤ ${range.max}, got ${v}`);
  return v;
}

export function bool(env: Env, name: string, fallback: boolean): boolean {
  const raw = env[name];
  if (raw === undefined || raw === "") return fallback;
  if (/^(1|true|yes|on)$/i.test(raw)) return true;
  if (/^(0|false|no|off)$/i.test(raw)) return false;
  return fail(name, `must be true or false, got "${raw}"`);
}

export function oneOf<T extends string>(env: Env, name: string, allowed: readonly T[], fallback: T): T {
  const raw = env[name];
  if (raw === undefined || raw === "") return fallback;
  if (!(allowed as readonly string[]).includes(raw)) fail(name, `must be one of ${allowed.join("|")}, got "${raw}"`);
  return raw as T;
}

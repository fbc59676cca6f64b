// Configuration variables: each defined once as a zod schema with its type, unit, default and meaning (`envVar`), parsed once at a program's edge (`parseEnv`); plain readers for the scripts.
import { z } from "zod";
import { AppError } from "./errors.ts";

export type Env = Record<string, string | undefined>;

/** What the generated documentation (docs/configuration.md) says of a variable. */
export interface EnvDoc {
  /** integer, boolean, string, one of …, path, URL, … */
  type: string;
  /** ms, s, bytes, MiB, … */
  unit?: string;
  /** The values accepted, when bounded ("≥ 100", "0–65535"). */
  range?: string;
  /** The default as a reader should see it ("(unset)", "1073741824 (1 GiB)", "the machine's memory"). */
  default: string;
  /** One line of meaning. */
  doc: string;
}

/** Every variable's documentation, keyed by its schema (read by the generator through a program's schema). */
export const envDocs = z.registry<EnvDoc>();

/** A configuration variable: takes the raw string (or undefined), gives the typed value or names what is wrong. */
export type EnvVar<T> = z.ZodType<T, string | undefined>;

/** A reason a raw value is refused; the caller puts the variable's name in front. */
class Refused extends Error {}

function refuse(why: string): never {
  throw new Refused(why);
}

/** The empty string counts as unset, as an unset variable. */
const unset = (raw: string | undefined): raw is undefined | "" => raw === undefined || raw === "";

export interface IntRange {
  min?: number;
  max?: number;
}

function readInt(raw: string | undefined, fallback: number, range: IntRange): number;
function readInt(raw: string | undefined, fallback: number | undefined, range: IntRange): number | undefined;
function readInt(raw: string | undefined, fallback: number | undefined, range: IntRange): number | undefined {
  if (unset(raw)) return fallback;
  if (!/^-?\d+$/.test(raw.trim())) refuse(`must be an integer, got "${raw}"`);
  const v = Number(raw);
  if (range.min !== undefined && v < range.min) refuse(`must be ≥ ${range.min}, got ${v}`);
  if (range.max !== undefined && v > range.max) refuse(`must be ≤ ${range.max}, got ${v}`);
  return v;
}

/** "1|true|yes|on" or "0|false|no|off" (any case); empty or unset: `fallback`. Throws a refusal `envVar` names. */
export function readBool(raw: string | undefined, fallback: boolean): boolean {
  if (unset(raw)) return fallback;
  if (/^(1|true|yes|on)$/i.test(raw)) return true;
  if (/^(0|false|no|off)$/i.test(raw)) return false;
  return refuse(`must be true or false, got "${raw}"`);
}

function readOneOf<T extends string>(raw: string | undefined, allowed: readonly T[], fallback: T): T {
  if (unset(raw)) return fallback;
  if (!(allowed as readonly string[]).includes(raw)) refuse(`must be one of ${allowed.join("|")}, got "${raw}"`);
  return raw as T;
}

/** A variable read by `read`, which throws (through `fail`) to refuse the raw value. */
export function envVar<T>(meta: EnvDoc, read: (raw: string | undefined, fail: (why: string) => never) => T): EnvVar<T> {
  const schema = z
    .string()
    .optional()
    .transform((raw, ctx) => {
      try {
        return read(raw, refuse);
      } catch (err) {
        if (!(err instanceof Refused)) throw err;
        ctx.addIssue({ code: "custom", message: err.message });
        return z.NEVER;
      }
    });
  envDocs.add(schema, meta);
  return schema;
}

type Meta = Omit<EnvDoc, "type" | "default" | "range"> & { default?: string };

const code = (value: string | number | boolean) => `\`${String(value)}\``;

function rangeText(r: IntRange): string | undefined {
  if (r.min !== undefined && r.max !== undefined) return `${r.min}–${r.max}`;
  if (r.min !== undefined) return `≥ ${r.min}`;
  if (r.max !== undefined) return `≤ ${r.max}`;
  return undefined;
}

/** The documentation of an integer: its bounds with it. */
function intDoc(o: Meta & IntRange, fallback: number | undefined): EnvDoc {
  const range = rangeText(o);
  return {
    type: "integer",
    ...(o.unit ? { unit: o.unit } : {}),
    doc: o.doc,
    default: o.default ?? (fallback === undefined ? "(unset)" : code(fallback)),
    ...(range ? { range } : {}),
  };
}

/** The vocabulary of the fragments' schemas. */
export const vars = {
  int(o: Meta & IntRange & { fallback: number }): EnvVar<number> {
    return envVar(intDoc(o, o.fallback), (raw) => readInt(raw, o.fallback, o));
  },
  /** An integer with no default (undefined when unset). */
  optInt(o: Meta & IntRange & { default: string }): EnvVar<number | undefined> {
    return envVar(intDoc(o, undefined), (raw) => readInt(raw, undefined, o));
  },
  bool(o: Meta & { fallback: boolean }): EnvVar<boolean> {
    return envVar({ type: "boolean", ...o, default: o.default ?? code(o.fallback) }, (raw) => readBool(raw, o.fallback));
  },
  str(o: Meta & { fallback: string; type?: string }): EnvVar<string> {
    return envVar({ type: "string", ...o, default: o.default ?? code(o.fallback) }, (raw) => (unset(raw) ? o.fallback : raw));
  },
  optStr(o: Meta & { default: string; type?: string }): EnvVar<string | undefined> {
    return envVar({ type: "string", ...o }, (raw) => (unset(raw) ? undefined : raw));
  },
  oneOf<T extends string>(allowed: readonly T[], o: Meta & { fallback: T }): EnvVar<T> {
    return envVar({ type: `one of ${allowed.map(code).join(", ")}`, ...o, default: o.default ?? code(o.fallback) }, (raw) =>
      readOneOf(raw, allowed, o.fallback),
    );
  },
  /** A comma-separated list, its entries trimmed, empty ones dropped. */
  list(o: Meta & { fallback: string }): EnvVar<string[]> {
    return envVar({ type: "comma-separated list", ...o, default: o.default ?? code(o.fallback) }, (raw) =>
      (unset(raw) ? o.fallback : raw)
        .split(",")
        .map((s) => s.trim())
        .filter(Boolean),
    );
  },
};

/**
 * `variable` as this program requires it: unset (or empty) fails with `is required (why)`; documented as required.
 * The variable stays defined once, in its fragment; a program that needs it says so here.
 */
export function required<T>(variable: EnvVar<T | undefined>, why: string): EnvVar<T> {
  const schema = variable.transform((v, ctx) => {
    if (v === undefined) {
      ctx.addIssue({ code: "custom", message: `is required (${why})` });
      return z.NEVER;
    }
    return v;
  });
  const meta = envDocs.get(variable);
  if (meta) envDocs.add(schema, { ...meta, default: "(required)" });
  return schema;
}

/** One line per refused variable: `NAME must be …`. */
export function envProblems(error: z.ZodError): string[] {
  return error.issues.map((i) => (i.path.length > 0 ? `${String(i.path[0])} ${i.message}` : i.message));
}

/** Parses `env` against `schema` once; every refused variable is named in the one error thrown. */
export function parseEnv<S extends z.ZodObject>(schema: S, env: Record<string, unknown>): z.output<S> {
  const r = schema.safeParse(env);
  if (!r.success) throw new AppError("bad_request", `configuration: ${envProblems(r.error).join("; ")}`);
  return r.data;
}

/** The documentation of one variable of a schema (undefined for a schema not built by `envVar`). */
export function envDocOf(schema: unknown): EnvDoc | undefined {
  return envDocs.get(schema as z.ZodType);
}

// Plain readers, for the commands that are no program (benchmarks, fuzzers): the same rules, the variable named in the error.

function named<T>(name: string, read: () => T): T {
  try {
    return read();
  } catch (err) {
    if (err instanceof Refused) throw new AppError("bad_request", `configuration: ${name} ${err.message}`);
    throw err;
  }
}

export function str(env: Env, name: string, fallback: string): string {
  const v = env[name];
  return unset(v) ? fallback : v;
}

export function optStr(env: Env, name: string): string | undefined {
  const v = env[name];
  return unset(v) ? undefined : v;
}

export function int(env: Env, name: string, fallback: number, range: IntRange = {}): number {
  return named(name, () => readInt(env[name], fallback, range));
}

export function bool(env: Env, name: string, fallback: boolean): boolean {
  return named(name, () => readBool(env[name], fallback));
}

export function oneOf<T extends string>(env: Env, name: string, allowed: readonly T[], fallback: T): T {
  return named(name, () => readOneOf(env[name], allowed, fallback));
}

// Values that fit a JSON Schema, roughly (types, enums, bounds, patterns, objects, arrays): the "valid" bodies and parameters.
import fc from "fast-check";
import type { JsonSchema } from "./document.ts";

const maxDepth = 4;

function types(schema: JsonSchema): string[] {
  const t = schema.type;
  if (Array.isArray(t)) return t.map(String);
  if (typeof t === "string") return [t];
  if (schema.properties) return ["object"];
  if (schema.items) return ["array"];
  return [];
}

/** A pattern JavaScript can compile with the `u` flag dropped, or none. */
function pattern(schema: JsonSchema): RegExp | undefined {
  if (typeof schema.pattern !== "string") return undefined;
  try {
    return new RegExp(schema.pattern);
  } catch {
    return undefined;
  }
}

/** fast-check refuses some regular expressions (lookarounds, back references): those fall back to plain strings. */
function canMatch(re: RegExp): boolean {
  try {
    fc.stringMatching(re);
    return true;
  } catch {
    return false;
  }
}

function stringOf(schema: JsonSchema): fc.Arbitrary<string> {
  if (schema.format === "date-time")
    return fc.date({ min: new Date("1970-01-01T00:00:00Z"), max: new Date("2100-01-01T00:00:00Z"), noInvalidDate: true }).map((d) => d.toISOString());
  if (schema.format === "date")
    return fc
      .date({ min: new Date("1970-01-01T00:00:00Z"), max: new Date("2100-01-01T00:00:00Z"), noInvalidDate: true })
      .map((d) => d.toISOString().slice(0, 10));
  const re = pattern(schema);
  const minLength = typeof schema.minLength === "number" ? schema.minLength : 0;
  const maxLength = typeof schema.maxLength === "number" ? Math.min(schema.maxLength, 200) : 40;
  const examples = [schema.example, schema.default, ...((schema.examples as unknown[] | undefined) ?? [])].filter((v): v is string => typeof v === "string");
  const base =
    re && canMatch(re)
      ? fc.stringMatching(re).filter((s) => s.length >= minLength && s.length <= (typeof schema.maxLength === "number" ? schema.maxLength : Infinity))
      : fc.string({ minLength, maxLength: Math.max(minLength, maxLength), unit: fc.constantFrom(..."abcdefghijklmnopqrstuvwxyz0123456789-_ .:/") });
  return examples.length > 0 ? fc.oneof({ arbitrary: fc.constantFrom(...examples), weight: 2 }, { arbitrary: base, weight: 3 }) : base;
}

function numberOf(schema: JsonSchema, integer: boolean): fc.Arbitrary<number> {
  const min = typeof schema.minimum === "number" ? schema.minimum : typeof schema.exclusiveMinimum === "number" ? schema.exclusiveMinimum + 1 : -1_000_000;
  const max = typeof schema.maximum === "number" ? schema.maximum : typeof schema.exclusiveMaximum === "number" ? schema.exclusiveMaximum - 1 : 1_000_000;
  const edges = fc.constantFrom(min, max, ...(min <= 0 && max >= 0 ? [0] : []));
  const any = integer
    ? fc.integer({ min: Math.max(min, Number.MIN_SAFE_INTEGER), max: Math.min(max, Number.MAX_SAFE_INTEGER) })
    : fc.double({ min, max, noNaN: true, noDefaultInfinity: true });
  return fc.oneof(edges, any);
}

/** An arbitrary of values the schema accepts (as far as this rough reading of it goes). */
export function arbitraryOf(schema: JsonSchema, depth = 0): fc.Arbitrary<unknown> {
  if ("const" in schema) return fc.constant(schema.const);
  if (Array.isArray(schema.enum) && schema.enum.length > 0) return fc.constantFrom(...(schema.enum as unknown[]));
  for (const key of ["oneOf", "anyOf"] as const) {
    const alts = schema[key];
    if (Array.isArray(alts) && alts.length > 0) return fc.oneof(...(alts as JsonSchema[]).map((s) => arbitraryOf(s, depth)));
  }
  if (Array.isArray(schema.allOf)) {
    const merged = Object.assign({}, ...(schema.allOf as JsonSchema[]), { ...schema, allOf: undefined }) as JsonSchema;
    delete merged.allOf;
    return arbitraryOf(merged, depth);
  }
  const ts = types(schema);
  if (ts.length === 0) return depth >= maxDepth ? fc.constant(null) : fc.jsonValue({ maxDepth: 2 });
  return fc.oneof(...ts.map((t) => ofType(t, schema, depth)));
}

function ofType(t: string, schema: JsonSchema, depth: number): fc.Arbitrary<unknown> {
  switch (t) {
    case "string":
      return stringOf(schema);
    case "integer":
      return numberOf(schema, true);
    case "number":
      return numberOf(schema, false);
    case "boolean":
      return fc.boolean();
    case "null":
      return fc.constant(null);
    case "array": {
      if (depth >= maxDepth) return fc.constant([]);
      const items = (schema.items as JsonSchema | undefined) ?? {};
      const minLength = typeof schema.minItems === "number" ? schema.minItems : 0;
      const maxLength = Math.min(typeof schema.maxItems === "number" ? schema.maxItems : 5, 5);
      return fc.array(arbitraryOf(items, depth + 1), { minLength: Math.min(minLength, maxLength), maxLength });
    }
    case "object": {
      if (depth >= maxDepth) return fc.constant({});
      const props = (schema.properties as Record<string, JsonSchema> | undefined) ?? {};
      const required = new Set((schema.required as string[] | undefined) ?? []);
      const model = Object.fromEntries(Object.entries(props).map(([k, s]) => [k, arbitraryOf(s, depth + 1)]));
      const requiredKeys = Object.keys(props).filter((k) => required.has(k));
      return fc.record(model, { requiredKeys });
    }
    default:
      return fc.constant(null);
  }
}

// Keeps postgres.js 3.4.x off its per-connection type fetch, whose failure ends the process, and gives it the built-in array types that fetch would have found.
//
// With `fetch_types` (its default) postgres.js sends a `pg_type` query as the first statement of every new connection
// and drops the promise of the function awaiting it (`ReadyForQuery` → `return fetchArrayTypes()`, connection.js).
// When the connection dies while that query is out — Postgres stopping or restarting while the pool reconnects — the
// query is rejected (`read ECONNRESET`, `write CONNECTION_CLOSED`, or the next attempt's `connect ECONNREFUSED`) and the
// rejection reaches nobody: an unhandled rejection, which ends a Node process (porsager/postgres#1192, #1205, #1223,
// #279). Reproduced here: transactions under load while Postgres stops and starts (test/integration/db-outage.test.ts)
// crashed the process in 1 run of 8 on an idle machine and in most runs on a loaded one, always with that query. No
// caller can catch it, so the client is opened with `fetch_types: false`, and since that also drops the array types
// the fetch would have registered (JS arrays then go out as `a,b` — "malformed array literal", porsager/postgres#1164 —
// and array columns come back as text), the built-in ones are registered here the way the fetch does it, from their
// fixed oids.

/** The parts of a postgres.js client's parsed options the fetch fills in (`sql.options`). */
export interface PostgresTypeOptions {
  parsers: Record<number, ((raw: string) => unknown) | undefined>;
  serializers: Record<number, ((value: never) => unknown) | undefined>;
  shared: { typeArrayMap: Record<number, number> };
  transform: { undefined?: unknown };
}

/** Element type oid → its array type oid, for the built-in types (fixed since Postgres 8; checked against a server in test/integration/postgres-guard.test.ts). */
export const builtinArrayTypes: Readonly<Record<number, number>> = {
  16: 1000, // bool
  17: 1001, // bytea
  18: 1002, // char
  19: 1003, // name
  20: 1016, // int8
  21: 1005, // int2
  23: 1007, // int4
  25: 1009, // text
  26: 1028, // oid
  114: 199, // json
  142: 143, // xml
  650: 651, // cidr
  700: 1021, // float4
  701: 1022, // float8
  869: 1041, // inet
  1042: 1014, // bpchar
  1043: 1015, // varchar
  1082: 1182, // date
  1083: 1183, // time
  1114: 1115, // timestamp
  1184: 1185, // timestamptz
  1186: 1187, // interval
  1266: 1270, // timetz
  1700: 1231, // numeric
  2950: 2951, // uuid
  3802: 3807, // jsonb
};

/**
 * Registers `builtinArrayTypes` on a client's options, as postgres.js's own fetch does (`addArrayType`): a JS array
 * parameter of one of them is sent as an array literal of its elements (each through the element's serializer), and
 * an array column is parsed into a JS array (each element through the element's parser). Element handlers are looked
 * up when a value is converted, so ones set after this call (drizzle replaces the date ones) apply, as they do after a
 * fetch. Types a client already handles are left alone.
 */
export function registerBuiltinArrayTypes(options: PostgresTypeOptions): void {
  for (const [elementKey, arrayOid] of Object.entries(builtinArrayTypes)) {
    const element = Number(elementKey);
    if (options.parsers[arrayOid] && options.serializers[arrayOid]) continue;
    options.shared.typeArrayMap[element] = arrayOid;
    options.parsers[arrayOid] = (raw: string) => parseArrayLiteral(raw, options.parsers[element]);
    options.serializers[arrayOid] = ((value: unknown) =>
      serializeArray(value, options.serializers[element] as ((v: unknown) => unknown) | undefined, options)) as (value: never) => unknown;
  }
}

/** A JS array as a Postgres array literal (`{"a","b"}`, nested for nested arrays); anything else unchanged (postgres.js's `arraySerializer`). */
export function serializeArray(value: unknown, element: ((v: unknown) => unknown) | undefined, options: Pick<PostgresTypeOptions, "transform">): unknown {
  if (!Array.isArray(value)) return value;
  const items = value.map((x: unknown) => {
    // A nested plain array is a dimension; a postgres.js Parameter (`{ type, value }`) is an element.
    if (Array.isArray(x)) return serializeArray(x, element, options) as string;
    let v = x;
    if (v === undefined) {
      v = options.transform.undefined;
      if (v === undefined) throw Object.assign(new Error("Undefined values are not allowed"), { code: "UNDEFINED_VALUE" });
    }
    if (v === null) return "null";
    const inner = typeof v === "object" && "type" in v && "value" in v ? (v as { value: unknown }).value : v;
    const text = element ? element(inner) : inner;
    return `"${String(text).replace(/\\/g, "\\\\").replace(/"/g, '\\"')}"`;
  });
  return `{${items.join(",")}}`;
}

/**
 * A Postgres array literal (text output) as a JS array: quoted elements unescaped, an unquoted `NULL` as null, nested
 * braces as nested arrays, each element through `element`. A leading dimension decoration (`[0:1]=`) is skipped.
 */
export function parseArrayLiteral(raw: string, element: ((s: string) => unknown) | undefined): unknown[] {
  const convert = (s: string) => (element ? element(s) : s);
  let i = raw.startsWith("[") ? raw.indexOf("=") + 1 : 0;
  const list = (): unknown[] => {
    const out: unknown[] = [];
    i++; // past "{"
    if (raw[i] === "}") {
      i++;
      return out;
    }
    while (i < raw.length) {
      if (raw[i] === "{") out.push(list());
      else if (raw[i] === '"') {
        let s = "";
        for (i++; i < raw.length && raw[i] !== '"'; i++) s += raw[i] === "\\" ? raw[++i] : raw[i];
        i++; // past the closing quote
        out.push(convert(s));
      } else {
        const start = i;
        while (i < raw.length && raw[i] !== "," && raw[i] !== "}") i++;
        const token = raw.slice(start, i);
        out.push(token.toUpperCase() === "NULL" ? null : convert(token));
      }
      if (raw[i++] !== ",") break; // "}" ends this dimension
    }
    return out;
  };
  return raw[i] === "{" ? list() : [];
}

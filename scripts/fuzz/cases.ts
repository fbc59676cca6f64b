// The fuzzer's requests as data: per operation, path parameters, query strings, bodies, headers, credentials and framing.
import fc from "fast-check";
import type { JsonSchema, Operation, Param } from "./document.ts";
import { arbitraryOf } from "./schema-arb.ts";

/** A path parameter: literal text (already as it goes on the wire) or the `n`-th id of a kind this run has seen. */
export type Segment = { raw: string } | { pool: string; n: number };

/** Which credentials a request carries (target.ts mints them). */
export type AuthKind =
  | "demo"
  | "operator"
  | "none"
  | "garbage"
  | "otherTenant"
  | "expired"
  | "noScopes"
  | "readOnly"
  | "wrongKey"
  | "algNone"
  | "notYetValid"
  | "twoHeaders";

/** How a body goes on the wire; all but `length`, `none` and `chunked` need a raw socket. */
export type Framing = "length" | "none" | "chunked" | "short" | "long" | "trickle" | "trickleChunked" | "abort" | "badChunk";

export type BodyPlan =
  | { kind: "json"; value: unknown }
  | { kind: "text"; text: string }
  | { kind: "bytes"; bytes: number[] }
  /** `{"f0":0,…}` with `n` fields nobody asked for. */
  | { kind: "unknownFields"; n: number }
  /** `[[[…]]]` or `{"a":{"a":…}}`, `depth` levels. */
  | { kind: "deep"; depth: number; objects: boolean }
  /** A JSON object of exactly `bytes` bytes (one long string field `field`). */
  | { kind: "sized"; bytes: number; field: string };

export interface Plan {
  /** The operation's id; undefined for a method or path the document does not have. */
  op: string | undefined;
  method: string;
  /** The path template and the values of its parameters. */
  template: string;
  params: Record<string, Segment>;
  /** `name=value` pairs, already percent-encoded (or deliberately not). */
  query: [string, string][];
  auth: AuthKind;
  headers: [string, string][];
  body: BodyPlan | undefined;
  contentType: string | undefined;
  framing: Framing;
  transport: "undici" | "raw";
  /** For trickled bodies: pause between pieces, ms. */
  trickleMs: number;
}

/** Body sizes around the limits the gateway enforces (webhook admin 64 KiB, admin API 1 MiB by default). */
export const bodyLimits = [64 * 1024, 1024 * 1024];

const hugeText = (n: number) => "a".repeat(n);

const nastyCommon = [
  "",
  "%00",
  "..",
  ".",
  "%2e%2e",
  "%2F",
  "%zz",
  "%E0%A4%A",
  "%C0%AE",
  "%F0%9F%98%80",
  encodeURIComponent("ü😀\u202e"),
  encodeURIComponent("'; select pg_sleep(1); --"),
  encodeURIComponent("../../etc/passwd"),
  encodeURIComponent('{"a":1}'),
  "null",
  "true",
];
const nastyNumbers = [
  "-1",
  "0",
  "1.5",
  "1e3",
  "1e309",
  "99999999999999999999999",
  "-99999999999999999999",
  "NaN",
  "Infinity",
  "0x10",
  "%201",
  "abc",
  "1001",
  "2147483648",
];
const nastyInstants = [
  "0000-01-01",
  "0000-01-01T00:00:00Z",
  "99999-01-01",
  "+099999-01-01T00:00:00Z",
  "-000001-01-01T00:00:00Z",
  "1969-12-31T23:59:59Z",
  "1900-01-01",
  "2026-02-30",
  "2026-13-01",
  "2026-03-01T25:00:00Z",
  "2026-03-01T00:00:00%2B25:00",
  "9999-12-31T23:59:59.999Z",
  "10000-01-01",
  "294277-01-01T00:00:00Z",
  "1970-01-01",
  "2026-03-01T00:00:00",
  "2026-03-01T00:00:00.1234567890Z",
  "2026-W10",
  "now",
];
const nastyMonths = ["0000-01", "99999-12", "2026-00", "2026-13", "2026-3", "1969-12", "9999-12", "2026-03-01"];
const b64url = (s: string) => Buffer.from(s).toString("base64url");
const nastyCursors = [
  "x",
  "!!!!",
  b64url("[]"),
  b64url('["a"]'),
  b64url("[1e999]"),
  b64url('["a",1]'),
  b64url('[1,"a"]'),
  b64url('{"a":1}'),
  b64url("null"),
  b64url('["2026-01-01T00:00:00Z","x"]'),
  hugeText(1024),
  hugeText(1025),
];
const nastyZones = ["Mars/Olympus", "UTC", "Europe/Berlin", "%2B25:00", "Etc/GMT%2B14", encodeURIComponent("../../../etc/localtime"), hugeText(300)];

/** Long values: a query string past the head limit is a 431 from the parser, one below it reaches the route. */
const longValues = [hugeText(5000), hugeText(20_000)];

function nastyFor(param: Param): string[] {
  const s = param.schema;
  const name = param.name.toLowerCase();
  const out = [...nastyCommon];
  if (s.type === "integer" || s.type === "number" || /limit|tail/.test(name)) out.push(...nastyNumbers);
  if (s.format === "date-time" || /from|to|until|since|at$|before|after/.test(name)) out.push(...nastyInstants);
  if (/month/.test(name)) out.push(...nastyMonths);
  if (/cursor/.test(name)) out.push(...nastyCursors);
  if (/tz|zone/.test(name)) out.push(...nastyZones);
  return out;
}

const enc = (v: unknown) => encodeURIComponent(typeof v === "string" ? v : JSON.stringify(v));

/** A query parameter's value: one the schema accepts, or one meant to hurt. */
function paramValue(param: Param): fc.Arbitrary<string> {
  return fc.oneof(
    { arbitrary: arbitraryOf(param.schema).map((v) => (typeof v === "string" ? encodeURIComponent(v) : enc(v))), weight: 4 },
    { arbitrary: fc.constantFrom(...nastyFor(param)), weight: 4 },
    { arbitrary: fc.constantFrom(...longValues), weight: 1 },
  );
}

function queryOf(op: Operation | undefined): fc.Arbitrary<[string, string][]> {
  const params = op?.params.filter((p) => p.in === "query") ?? [];
  const each = params.map((p) =>
    fc.oneof(
      { arbitrary: fc.constant([] as [string, string][]), weight: p.required ? 1 : 3 },
      { arbitrary: paramValue(p).map((v) => [[p.name, v]] as [string, string][]), weight: p.required ? 6 : 3 },
      {
        arbitrary: fc.tuple(paramValue(p), paramValue(p)).map(
          ([a, b]) =>
            [
              [p.name, a],
              [p.name, b],
            ] as [string, string][],
        ),
        weight: 1,
      },
    ),
  );
  const unknown = fc.oneof(
    { arbitrary: fc.constant([] as [string, string][]), weight: 6 },
    {
      arbitrary: fc.constantFrom<[string, string][]>(
        [["unknown", "1"]],
        [["__proto__", "x"]],
        [["constructor", "x"]],
        [["", ""]],
        [["%zz", "%zz"]],
        [["a[b]", "1"]],
      ),
      weight: 2,
    },
    { arbitrary: fc.constant(Array.from({ length: 500 }, (_, i) => [`p${i}`, "1"] as [string, string])), weight: 1 },
  );
  return fc.tuple(fc.tuple(...each), unknown).map(([parts, extra]) => [...parts.flat(), ...extra]);
}

/** The id prefix a path parameter takes: from its example (`agt_…`), its name, or the path segment before it. */
export function prefixFor(op: Operation, param: Param): string | undefined {
  const example = typeof param.schema.example === "string" ? /^([a-z]{2,5})_/.exec(param.schema.example)?.[1] : undefined;
  if (example) return example;
  const byName: Record<string, string> = {
    agentId: "agt",
    leaseId: "lse",
    tenantId: "ten",
    deliveryId: "dlv",
    invoiceId: "inv",
    imageId: "img",
    buildId: "bld",
  };
  if (byName[param.name]) return byName[param.name];
  const segs = op.path.split("/");
  const before = segs[segs.indexOf(`{${param.name}}`) - 1] ?? "";
  const bySegment: Record<string, string> = {
    agents: "agt",
    tenants: "ten",
    "webhook-deliveries": "dlv",
    invoices: "inv",
    images: "img",
    builds: "bld",
    leases: "lse",
    "rate-cards": "rc",
    audit: "evt",
  };
  return bySegment[before];
}

const idChars = "0123456789abcdefghijklmnopqrstuvwxyz";
const randomId = (prefix: string) => fc.string({ unit: fc.constantFrom(...idChars), minLength: 16, maxLength: 16 }).map((s) => `${prefix}_${s}`);

function segmentOf(op: Operation, param: Param): fc.Arbitrary<Segment> {
  const prefix = prefixFor(op, param);
  const isMonth = /month/i.test(param.name);
  const isName = !prefix && !isMonth;
  const pool = prefix ?? (isName ? "name" : "month");
  const valid: fc.Arbitrary<Segment>[] = [];
  if (prefix) valid.push(randomId(prefix).map((raw) => ({ raw })));
  if (isMonth)
    valid.push(
      fc.tuple(fc.integer({ min: 1970, max: 2100 }), fc.integer({ min: 1, max: 12 })).map(([y, m]) => ({ raw: `${y}-${String(m).padStart(2, "0")}` })),
    );
  if (isName) valid.push(fc.stringMatching(/^[a-z][a-z0-9-]{0,30}$/).map((raw) => ({ raw })));
  return fc.oneof(
    { arbitrary: fc.nat(1000).map((n) => ({ pool, n })), weight: 6 },
    { arbitrary: fc.oneof(...valid), weight: 3 },
    {
      arbitrary: fc
        .constantFrom("agt", "lse", "ten", "img", "xyz")
        .chain(randomId)
        .map((raw) => ({ raw })),
      weight: 1,
    },
    {
      arbitrary: fc
        .constantFrom(...nastyCommon, "AGT_0123456789ABCDEF", `agt_${"a".repeat(41)}`, "0123456789abcdef", hugeText(5000), ...(isMonth ? nastyMonths : []))
        .map((raw) => ({ raw })),
      weight: 3,
    },
  );
}

const contentTypes = [
  "application/json",
  "application/json; charset=utf-8",
  "text/plain",
  "application/x-www-form-urlencoded",
  "multipart/form-data; boundary=x",
  "application/octet-stream",
  "application/x-tar",
  "application/json; charset=utf-16",
  "garbage",
  "",
];

/** Broken bodies of every shape: wrong types, extra fields, many fields, deep, huge, not JSON, empty, not UTF-8. */
function brokenBody(valid: fc.Arbitrary<unknown>): fc.Arbitrary<BodyPlan> {
  const wrongTyped = fc.tuple(valid, fc.jsonValue({ maxDepth: 1 }), fc.nat()).map(([v, other, i]) => {
    if (typeof v !== "object" || v === null || Array.isArray(v)) return { kind: "json" as const, value: other };
    const keys = Object.keys(v);
    const key = keys.length > 0 ? keys[i % keys.length]! : "x";
    return { kind: "json" as const, value: { ...v, [key]: other } };
  });
  // A NUL in a string no Postgres text column can hold: it must be refused at the edge, not by the database.
  const withNul = fc.tuple(valid, fc.nat()).map(([v, i]) => {
    if (typeof v !== "object" || v === null || Array.isArray(v)) return { kind: "json" as const, value: "a\u0000b" };
    const keys = Object.keys(v).filter((k) => typeof (v as Record<string, unknown>)[k] === "string");
    return { kind: "json" as const, value: { ...v, [keys.length > 0 ? keys[i % keys.length]! : "name"]: "a\u0000b" } };
  });
  const w = (arbitrary: fc.Arbitrary<BodyPlan>, weight: number) => ({ arbitrary, weight });
  return fc.oneof(
    w(wrongTyped, 4),
    w(withNul, 1),
    w(
      fc
        .tuple(valid, fc.dictionary(fc.string({ maxLength: 10 }), fc.jsonValue({ maxDepth: 1 }), { maxKeys: 5 }))
        .map(([v, extra]) => ({ kind: "json" as const, value: typeof v === "object" && v !== null ? { ...extra, ...v } : extra })),
      2,
    ),
    w(
      fc.jsonValue({ maxDepth: 3 }).map((value) => ({ kind: "json" as const, value })),
      2,
    ),
    w(
      fc.constantFrom(50_000, 1000).map((n) => ({ kind: "unknownFields" as const, n })),
      1,
    ),
    w(
      fc.tuple(fc.constantFrom(100, 10_000, 100_000), fc.boolean()).map(([depth, objects]) => ({ kind: "deep" as const, depth, objects })),
      1,
    ),
    w(
      fc
        .tuple(fc.constantFrom(...bodyLimits.flatMap((l) => [l - 1, l, l + 1]), 2 * 1024 * 1024), fc.constantFrom("name", "zz"))
        .map(([bytes, field]) => ({ kind: "sized" as const, bytes, field })),
      1,
    ),
    w(
      fc
        .constantFrom(
          "{",
          "}",
          "[",
          '{"a":',
          "nul",
          "'x'",
          "{'a':1}",
          '{"a":1}{"b":2}',
          "\ufeff{}",
          "a=1&b=2",
          "   ",
          "\u0000",
          '{"__proto__":{"x":1}}',
          '{"a":1e999}',
          '"\\ud800"',
          '{"name":"a\\u0000b"}',
          '{"name":"a\u0000b"}',
        )
        .map((text) => ({ kind: "text" as const, text })),
      2,
    ),
    w(
      fc.array(fc.integer({ min: 0, max: 255 }), { minLength: 1, maxLength: 64 }).map((bytes) => ({ kind: "bytes" as const, bytes })),
      1,
    ),
    w(fc.constant({ kind: "bytes" as const, bytes: [0x7b, 0x22, 0xff, 0xfe, 0x22, 0x3a, 0x31, 0x7d] }), 1),
    w(fc.constant({ kind: "text" as const, text: "" }), 1),
  );
}

function bodyOf(op: Operation | undefined): fc.Arbitrary<{ body: BodyPlan | undefined; contentType: string | undefined }> {
  const declared = op?.body[0];
  const valid = declared ? arbitraryOf(declared.schema) : fc.constant({});
  const media = declared?.mediaType && declared.mediaType !== "*/*" ? declared.mediaType : "application/json";
  const ct = fc.oneof(
    { arbitrary: fc.constant(media), weight: 6 },
    { arbitrary: fc.constantFrom(...contentTypes), weight: 2 },
    { arbitrary: fc.constant(undefined), weight: 1 },
  );
  if (!declared)
    return fc.oneof(
      { arbitrary: fc.constant({ body: undefined, contentType: undefined }), weight: 8 },
      { arbitrary: fc.tuple(brokenBody(valid), ct).map(([body, contentType]) => ({ body, contentType })), weight: 2 },
    );
  return fc.oneof(
    { arbitrary: fc.tuple(valid, ct).map(([value, contentType]) => ({ body: { kind: "json" as const, value }, contentType })), weight: 5 },
    { arbitrary: fc.tuple(brokenBody(valid), ct).map(([body, contentType]) => ({ body, contentType })), weight: 5 },
    { arbitrary: fc.constant({ body: undefined, contentType: undefined }), weight: 1 },
  );
}

const authKinds = fc.oneof(
  { arbitrary: fc.constant<AuthKind>("demo"), weight: 14 },
  { arbitrary: fc.constant<AuthKind>("operator"), weight: 3 },
  {
    arbitrary: fc.constantFrom<AuthKind>(
      "none",
      "garbage",
      "otherTenant",
      "expired",
      "noScopes",
      "readOnly",
      "wrongKey",
      "algNone",
      "notYetValid",
      "twoHeaders",
    ),
    weight: 6,
  },
);

/** Headers beside the credentials; those that only a raw socket can send say so with `raw`. */
const extraHeaders = fc.oneof(
  { arbitrary: fc.constant({ headers: [] as [string, string][], raw: false }), weight: 14 },
  {
    arbitrary: fc
      .constantFrom<[string, string][]>(
        [["accept", "text/csv"]],
        [["accept", "application/x-ndjson"]],
        [["accept", "*/*;q=0"]],
        [["x-forwarded-for", "1.2.3.4, garbage"]],
        [["content-encoding", "gzip"]],
        [["expect", "100-continue"]],
        [
          ["connection", "upgrade"],
          ["upgrade", "websocket"],
        ],
        [["x-request-id", "req_forged"]],
      )
      .map((headers) => ({ headers, raw: false })),
    weight: 3,
  },
  { arbitrary: fc.constant({ headers: [["x-big", hugeText(20_000)]] as [string, string][], raw: false }), weight: 1 },
  { arbitrary: fc.constant({ headers: Array.from({ length: 300 }, (_, i) => [`x-h${i}`, "v"] as [string, string]), raw: false }), weight: 1 },
  {
    arbitrary: fc
      .constantFrom<[string, string][]>(
        [["host", "second.example"]],
        [["host", "agt_0123456789abcdef.localhost"]],
        [["x-uni", "ü😀"]],
        [
          ["transfer-encoding", "chunked"],
          ["content-length", "5"],
        ],
        [["x bad", "1"]],
        [["x-nl", "a\rb"]],
      )
      .map((headers) => ({ headers, raw: true })),
    weight: 2,
  },
);

const framings = fc.oneof(
  { arbitrary: fc.constant<Framing>("length"), weight: 10 },
  { arbitrary: fc.constant<Framing>("chunked"), weight: 3 },
  { arbitrary: fc.constantFrom<Framing>("short", "long", "abort", "badChunk"), weight: 2 },
  { arbitrary: fc.constantFrom<Framing>("trickle", "trickleChunked"), weight: 1 },
);

/** The methods nothing in the document has for a path, and the ones Node treats specially. */
const otherMethods = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD", "TRACE", "PROPFIND", "FOO"];

/** A request to one operation of the document. */
export function planFor(op: Operation, trickleMs: { min: number; max: number }): fc.Arbitrary<Plan> {
  const pathParams = op.params.filter((p) => p.in === "path");
  const params = fc.record(Object.fromEntries(pathParams.map((p) => [p.name, segmentOf(op, p)])));
  return fc
    .record({
      params,
      query: queryOf(op),
      auth: authKinds,
      extra: extraHeaders,
      body: bodyOf(op),
      framing: framings,
      viaRaw: fc.boolean(),
      trickleMs: fc.integer(trickleMs),
    })
    .map(({ params, query, auth, extra, body, framing, viaRaw, trickleMs }) => {
      const raw = viaRaw || extra.raw || auth === "twoHeaders" || !["length", "none", "chunked"].includes(framing);
      return {
        op: op.id,
        method: op.method,
        template: op.path,
        params,
        query,
        auth,
        headers: extra.headers,
        body: body.body,
        contentType: body.contentType,
        framing: body.body ? framing : "none",
        transport: raw ? "raw" : "undici",
        trickleMs,
      } satisfies Plan;
    });
}

/** A request the document has no operation for: another method on a known path, or a path next to known ones. */
export function strayPlan(ops: Operation[]): fc.Arbitrary<Plan> {
  const byPath = new Map<string, Set<string>>();
  for (const op of ops) byPath.set(op.path, (byPath.get(op.path) ?? new Set()).add(op.method));
  const paths = [...byPath.keys()];
  const wrongMethod = fc
    .tuple(fc.constantFrom(...paths), fc.constantFrom(...otherMethods))
    .filter(([p, m]) => !byPath.get(p)!.has(m) && !(m === "HEAD" && byPath.get(p)!.has("GET")));
  const strayPath = fc
    .constantFrom(
      "/v1/agentsx",
      "/v1/agents/",
      "//v1/agents",
      "/v1/../etc/passwd",
      "/%00",
      "/v1/%2e%2e/healthz",
      "/v2/agents",
      "/v1",
      "/",
      "/hooks",
      "/hooks/",
      "/a/",
      "/a/agt_missing0000000/x",
      "/openapi.json/x",
      `/${hugeText(3000)}`,
      `/v1/${hugeText(12_000)}`,
      "*",
    )
    .map((p) => [p, "GET"] as [string, string]);
  return fc
    .record({ target: fc.oneof(wrongMethod, strayPath), auth: authKinds, body: bodyOf(undefined), framing: framings, viaRaw: fc.boolean() })
    .map(({ target, auth, body, framing, viaRaw }) => {
      const raw = viaRaw || auth === "twoHeaders" || target[0] === "*" || !["length", "none", "chunked"].includes(framing);
      return {
        op: undefined,
        method: target[1],
        template: target[0],
        params: {},
        query: [],
        auth,
        headers: [],
        body: body.body,
        contentType: body.contentType,
        framing: body.body ? framing : "none",
        transport: raw ? "raw" : "undici",
        trickleMs: 0,
      } satisfies Plan;
    });
}

/** Every request the fuzzer sends: operations of the document (each as likely as the others), and strays. */
export function planArbitrary(ops: Operation[], opts: { slow: boolean; trickleMs?: { min: number; max: number } }): fc.Arbitrary<Plan> {
  const trickle = opts.trickleMs ?? { min: 50, max: 400 };
  const any = fc.oneof({ arbitrary: fc.oneof(...ops.map((op) => planFor(op, trickle))), weight: 9 }, { arbitrary: strayPlan(ops), weight: 1 });
  return opts.slow ? any : any.map((p) => (p.framing === "trickle" || p.framing === "trickleChunked" ? { ...p, framing: "length" as const } : p));
}

export type { JsonSchema };

// The fuzzer's path parameters and query strings per operation: valid values, known ids, foreign ids and nasty ones.
import fc from "fast-check";
import type { Operation, Param } from "./document.ts";
import { hugeText, longValues, nastyCommon, nastyFor, nastyMonths } from "./nasty-values.ts";
import type { Segment } from "./plan.ts";
import { arbitraryOf } from "./schema-arb.ts";

const enc = (v: unknown) => encodeURIComponent(typeof v === "string" ? v : JSON.stringify(v));

/** A query parameter's value: one the schema accepts, or one meant to hurt. */
function paramValue(param: Param): fc.Arbitrary<string> {
  return fc.oneof(
    { arbitrary: arbitraryOf(param.schema).map((v) => (typeof v === "string" ? encodeURIComponent(v) : enc(v))), weight: 4 },
    { arbitrary: fc.constantFrom(...nastyFor(param)), weight: 4 },
    { arbitrary: fc.constantFrom(...longValues), weight: 1 },
  );
}

export function queryOf(op: Operation | undefined): fc.Arbitrary<[string, string][]> {
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

export function segmentOf(op: Operation, param: Param): fc.Arbitrary<Segment> {
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

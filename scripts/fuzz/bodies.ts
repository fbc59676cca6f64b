// The fuzzer's request bodies and content types: valid per the document, or broken in every shape.
import fc from "fast-check";
import type { Operation } from "./document.ts";
import type { BodyPlan } from "./plan.ts";
import { arbitraryOf } from "./schema-arb.ts";

/** Body sizes around the limits the gateway enforces (webhook admin 64 KiB, admin API 1 MiB by default). */
export const bodyLimits = [64 * 1024, 1024 * 1024];

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

export function bodyOf(op: Operation | undefined): fc.Arbitrary<{ body: BodyPlan | undefined; contentType: string | undefined }> {
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

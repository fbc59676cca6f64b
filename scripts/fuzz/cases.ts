// The fuzzer's requests: one to an operation of the document, or a stray one, composed from the parameter, body and header cases.
import fc from "fast-check";
import { bodyOf } from "./bodies.ts";
import type { JsonSchema, Operation } from "./document.ts";
import { authKinds, extraHeaders, framings } from "./headers.ts";
import { hugeText } from "./nasty-values.ts";
import { queryOf, segmentOf } from "./params.ts";
import type { Plan } from "./plan.ts";

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

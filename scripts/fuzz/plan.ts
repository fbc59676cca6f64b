// The fuzzer's request plan as data: what one generated request is (path parameters, query, credentials, headers, body, framing).
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

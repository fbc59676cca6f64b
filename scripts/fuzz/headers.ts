// The fuzzer's credentials, extra headers and body framings, each weighted toward the ordinary case.
import fc from "fast-check";
import { hugeText } from "./nasty-values.ts";
import type { AuthKind, Framing } from "./plan.ts";

export const authKinds = fc.oneof(
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
export const extraHeaders = fc.oneof(
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

export const framings = fc.oneof(
  { arbitrary: fc.constant<Framing>("length"), weight: 10 },
  { arbitrary: fc.constant<Framing>("chunked"), weight: 3 },
  { arbitrary: fc.constantFrom<Framing>("short", "long", "abort", "badChunk"), weight: 2 },
  { arbitrary: fc.constantFrom<Framing>("trickle", "trickleChunked"), weight: 1 },
);

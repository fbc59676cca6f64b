// What every answer must be: a status the document lists (or a generic one), the one error envelope, small, with nothing internal.
import { errorStatus } from "../../lib/errors.ts";
import type { Framing } from "./plan.ts";
import type { Answer } from "./wire.ts";

/**
 * Statuses any route may answer whatever its document says, because layers in front of every route give them:
 * 400 (the parser, a bad path parameter), 401/403 (auth, scopes, tenant state), 404 (no such route or resource),
 * 405, 408 (head or body deadline), 413 (body limit), 415, 429 (per-client limits), 431 (head too large).
 * No 5xx is generic: while Postgres is up any 5xx is a finding, except a 501 the operation documents (the deployment
 * lacks the capability, e.g. checkpoints on the process driver).
 */
export const genericStatuses: ReadonlySet<number> = new Set([400, 401, 403, 404, 405, 408, 413, 415, 429, 431]);

/** The largest error answer allowed, bytes. */
export const maxErrorBytes = 8 * 1024;

/** Text an answer must never carry: stacks, source paths, SQL and driver messages. */
const internalDetail: [string, RegExp][] = [
  ["stack frame", /\n\s+at |\bat [\w.<>]+ \(/],
  ["source path", /(?:\/[\w.-]+)+\.(?:ts|js|mjs|cjs)\b|node_modules|\/work\/|file:\/\//],
  [
    "SQL",
    /\b(?:select .+ from|insert into|update .+ set|delete from)\b|violates|relation "|syntax error at|duplicate key|out of range for type|invalid input syntax|PostgresError|ECONNREFUSED/i,
  ],
  ["JS error", /TypeError|ReferenceError|RangeError|SyntaxError: Unexpected|Cannot read propert|is not a function|undefined is not/],
];

export interface Verdict {
  ok: boolean;
  problems: string[];
}

/**
 * Judges one answer. `documented`: the operation's statuses (undefined for a request no operation has: `stray`).
 * `mayGoUnanswered`: a request that broke off (aborted, body shorter than declared, a request line Node refuses).
 */
export function judge(
  answer: Answer,
  opts: { documented: ReadonlySet<number> | undefined; method: string; framing: Framing; mayGoUnanswered: boolean; stray: boolean },
): Verdict {
  const problems: string[] = [];
  if (answer.status === undefined) {
    if (!opts.mayGoUnanswered) problems.push(`no answer (${answer.error ?? "closed"})`);
    return { ok: problems.length === 0, problems };
  }
  if (answer.error === "timeout") problems.push(`answer not finished within the timeout (status ${answer.status})`);
  const status = answer.status;
  if (status >= 500 && !(status === 501 && opts.documented?.has(501))) problems.push(`5xx: ${status}`);
  // A path no operation has may still be one after URL normalisation (`/v1/%2e%2e/healthz` is `/healthz`), or `/`
  // (a redirect to the dashboard): any success or redirect will do there, errors must be generic ones.
  else if (!(opts.documented?.has(status) ?? false) && !genericStatuses.has(status) && !(opts.stray && status < 400))
    problems.push(`status ${status} is neither documented for the operation nor generic`);
  if (status >= 400) problems.push(...envelopeProblems(answer, opts.method));
  if (status === 503 || status === 429) if (!answer.headers["retry-after"]?.length) problems.push(`${status} without Retry-After`);
  return { ok: problems.length === 0, problems };
}

function envelopeProblems(answer: Answer, method: string): string[] {
  const out: string[] = [];
  const requestId = answer.headers["x-request-id"];
  if (requestId?.length !== 1) out.push(`x-request-id header: ${JSON.stringify(requestId)}`);
  if (answer.body.length > maxErrorBytes || answer.bodyCut)
    out.push(`error answer of ${answer.body.length}${answer.bodyCut ? "+" : ""} bytes (limit ${maxErrorBytes})`);
  if (method === "HEAD") return out;
  const type = answer.headers["content-type"]?.[0] ?? "";
  if (!/^application\/json/.test(type)) out.push(`error content-type ${JSON.stringify(type)}`);
  const text = answer.body.toString("utf8");
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    out.push(`error body is not JSON: ${JSON.stringify(text.slice(0, 200))}`);
    return out;
  }
  const err = (parsed as { error?: { code?: unknown; message?: unknown; requestId?: unknown } }).error;
  if (typeof err !== "object" || err === null || typeof err.code !== "string" || typeof err.message !== "string" || typeof err.requestId !== "string")
    out.push(`not the envelope {error:{code,message,requestId}}: ${text.slice(0, 200)}`);
  else {
    if (requestId?.[0] !== err.requestId) out.push(`requestId ${err.requestId} differs from x-request-id ${requestId?.[0]}`);
    const codeStatus = (errorStatus as Record<string, number>)[err.code];
    if (codeStatus === undefined) out.push(`unknown error code ${err.code}`);
    else if (codeStatus !== answer.status) out.push(`code ${err.code} is ${codeStatus}, answered ${answer.status}`);
  }
  for (const [what, re] of internalDetail) if (re.test(text)) out.push(`${what} in the answer: ${JSON.stringify(text.slice(0, 300))}`);
  return out;
}

// One fuzz run against a started gateway: requests from the route table, every answer judged, then health and memory checked.
import fc from "fast-check";
import { Agent } from "undici";
import { fetchOperations, type Operation } from "./document.ts";
import { planArbitrary } from "./cases.ts";
import type { Plan, Segment } from "./plan.ts";
import type { Target } from "./target.ts";
import { judge } from "./verdict.ts";
import { bodyBytes, send, type Answer, type WireRequest } from "./wire.ts";

export interface CampaignOptions {
  seed: number;
  /** Requests after the warm-up (the run stops at whichever of `runs` and `seconds` comes first). */
  runs: number;
  seconds: number;
  /** Requests before RSS is first read. */
  warmupRuns: number;
  /** Requests in flight at once. */
  concurrency: number;
  /** Trickled bodies (pieces with pauses) included. */
  slow: boolean;
  /** Pause between trickled pieces, ms (8 pieces a body). */
  trickleMs?: { min: number; max: number };
  /** How long an answer may take, ms (trickled requests get their trickle time on top). */
  requestTimeoutMs: number;
  log?: (line: string) => void;
}

/** A kind of failure, with how often it happened and the first request that showed it. */
export interface Finding {
  key: string;
  count: number;
  problems: string[];
  request: string;
  answer: string;
  /** The gateway's log lines with the answer's request id. */
  logged: string[];
}

export interface CampaignResult {
  seed: number;
  requests: number;
  operations: number;
  statuses: Record<string, number>;
  findings: Finding[];
  rssKiB: { warmup: number; end: number; peak: number };
  errorLines: string[];
  warnLines: number;
  durationS: number;
  after: { healthz: number | undefined; adminList: number | undefined; agentCall: number | undefined };
}

/** Ids this run has seen in answers, per prefix (`agt`, `lse`, …), and webhook endpoint names; never the canary's. */
class Pool {
  private readonly ids = new Map<string, string[]>();
  private readonly excluded: ReadonlySet<string>;
  constructor(excluded: ReadonlySet<string>) {
    this.excluded = excluded;
  }
  add(kind: string, value: string): void {
    if (this.excluded.has(value)) return;
    const list = this.ids.get(kind) ?? [];
    if (list.includes(value) || list.length >= 50) return;
    list.push(value);
    this.ids.set(kind, list);
  }
  pick(kind: string, n: number): string | undefined {
    const list = this.ids.get(kind);
    return list && list.length > 0 ? list[n % list.length] : undefined;
  }
  /** Walks a JSON answer for ids (`agt_…`) and endpoint names. */
  harvest(value: unknown, depth = 0): void {
    if (depth > 6) return;
    if (typeof value === "string") {
      const m = /^([a-z]{2,5})_[0-9a-z]{4,40}$/.exec(value);
      if (m) this.add(m[1]!, value);
    } else if (Array.isArray(value)) for (const v of value.slice(0, 20)) this.harvest(v, depth + 1);
    else if (typeof value === "object" && value !== null)
      for (const [k, v] of Object.entries(value)) {
        if (k === "name" && typeof v === "string" && /^[a-z0-9][a-z0-9_-]{0,62}$/.test(v)) this.add("name", v);
        this.harvest(v, depth + 1);
      }
  }
}

/** Headers undici refuses to send itself: a request with one goes over a raw socket. */
const undiciRefuses = new Set(["host", "connection", "upgrade", "expect", "transfer-encoding", "content-length", "keep-alive"]);

function segmentText(seg: Segment, pool: Pool): string {
  if ("raw" in seg) return seg.raw;
  const found = pool.pick(seg.pool, seg.n);
  if (found) return encodeURIComponent(found);
  return seg.pool === "name" ? "fuzz" : seg.pool === "month" ? "2026-03" : `${seg.pool}_0000000000000000`;
}

function materialize(plan: Plan, pool: Pool, target: Target, seq: number): WireRequest {
  const path = plan.template === "*" ? "*" : plan.template.replace(/\{(\w+)\}/g, (_, name: string) => segmentText(plan.params[name] ?? { raw: "x" }, pool));
  const query = plan.query.map(([k, v]) => `${k}=${v}`).join("&");
  const auth = target.auth[plan.auth];
  const headers: [string, string][] = [];
  if (plan.auth === "garbage") headers.push(["authorization", auth[seq % auth.length]!]);
  else for (const v of auth) headers.push(["authorization", v]);
  if (plan.contentType !== undefined) headers.push(["content-type", plan.contentType]);
  headers.push(...plan.headers);
  const raw = plan.transport === "raw" || headers.some(([k]) => undiciRefuses.has(k.toLowerCase())) || /[^\x21-\x7e]/.test(path);
  return {
    method: plan.method,
    target: query ? `${path}?${query}` : path,
    headers,
    body: plan.body ? bodyBytes(plan.body) : undefined,
    framing: plan.framing,
    transport: raw ? "raw" : "undici",
    trickleMs: plan.trickleMs,
  };
}

function describe(req: WireRequest): string {
  const body = req.body ? `${req.body.length} bytes ${JSON.stringify(req.body.subarray(0, 160).toString("latin1"))}` : "none";
  const headers = req.headers.map(([k, v]) => `${k}: ${v.length > 80 ? `${v.slice(0, 40)}…(${v.length})` : v}`).slice(0, 8);
  const target = req.target.length > 300 ? `${req.target.slice(0, 300)}…(${req.target.length})` : req.target;
  return `${req.method} ${target} [${req.transport}, ${req.framing}${req.framing.startsWith("trickle") ? ` ${req.trickleMs} ms` : ""}] headers {${headers.join("; ")}${req.headers.length > 8 ? `; +${req.headers.length - 8}` : ""}} body ${body}`;
}

function describeAnswer(a: Answer): string {
  return `${a.status ?? "none"} ${a.error ?? ""} ${JSON.stringify(a.body.subarray(0, 300).toString("utf8"))}`.trim();
}

/**
 * Requests that may end with no answer: aborted, a body shorter than declared or a broken chunk (the connection is
 * cut), and a body the server answered early and closed on while the fuzzer was still sending it (Node closes without
 * lingering: the reset the unread rest causes can destroy the answer before the client reads it).
 */
const mayGoUnanswered = (req: WireRequest, answer: Answer) =>
  req.framing === "short" ||
  req.framing === "abort" ||
  req.framing === "badChunk" ||
  (req.body !== undefined && /EPIPE|ECONNRESET|other side closed/.test(answer.error ?? ""));

export async function runCampaign(target: Target, opts: CampaignOptions): Promise<CampaignResult> {
  const log = opts.log ?? (() => {});
  const started = Date.now();
  const ops = await fetchOperations(target.url);
  const byId = new Map<string, Operation>(ops.map((o) => [o.id, o]));
  const pool = new Pool(new Set([target.demo.tenantId, target.demo.agentId]));
  // Idle connections are dropped well before the server's keep-alive timeout (5 s), so a reused one is never closing.
  const dispatcher = new Agent({
    connections: opts.concurrency * 2,
    headersTimeout: opts.requestTimeoutMs,
    bodyTimeout: opts.requestTimeoutMs,
    keepAliveTimeout: 1000,
    keepAliveMaxTimeout: 1000,
  });
  log(
    `fuzz: ${ops.length} operations from GET /openapi.json; seed ${opts.seed}; warm-up ${opts.warmupRuns}, then up to ${opts.runs} requests or ${opts.seconds} s, ${opts.concurrency} at a time`,
  );

  // Ids to aim at: two agents of the demo tenant (never the demo agent itself, which is checked at the end).
  for (let i = 0; i < 2; i++) {
    const res = await fetch(`${target.url}/v1/agents`, {
      method: "POST",
      headers: { authorization: `Bearer ${target.demo.token}`, "content-type": "application/json" },
      body: JSON.stringify({ name: `fuzz-${i}`, idleTimeoutMs: 2000 }),
    });
    pool.harvest(await res.json());
  }

  const arb = planArbitrary(ops, { slow: opts.slow, ...(opts.trickleMs ? { trickleMs: opts.trickleMs } : {}) });
  let batch = 0;
  let queue: Plan[] = [];
  const nextPlan = (): Plan => {
    if (queue.length === 0) queue = fc.sample(arb, { seed: opts.seed + batch++, numRuns: 100 });
    return queue.shift()!;
  };

  const statuses: Record<string, number> = {};
  const findings = new Map<string, Finding>();
  let seq = 0;
  let measuredAfterWarmup: number | undefined;
  let peak = target.rssKiB();
  const total = opts.warmupRuns + opts.runs;
  const stopAt = () => Date.now() - started > opts.seconds * 1000;
  const sampler = setInterval(() => {
    try {
      peak = Math.max(peak, target.rssKiB());
    } catch {
      /* exited: found below */
    }
  }, 500);
  let lastProgress = Date.now();

  const worker = async () => {
    while (seq < total && !(measuredAfterWarmup !== undefined && stopAt()) && target.exited() === undefined) {
      const n = seq++;
      const plan = nextPlan();
      const req = materialize(plan, pool, target, n);
      const timeout = opts.requestTimeoutMs + (req.framing.startsWith("trickle") ? 8 * req.trickleMs : 0);
      let answer = await send(target.url, req, dispatcher, timeout);
      // A kept-alive connection the server closed as undici reused it (a race every keep-alive client has): once more,
      // counted as `retried` in the histogram so a server that closes connections often shows.
      if (req.transport === "undici" && /other side closed|ECONNRESET/.test(answer.error ?? "")) {
        statuses.retried = (statuses.retried ?? 0) + 1;
        answer = await send(target.url, req, dispatcher, timeout);
      }
      const key = answer.status === undefined ? `none:${answer.error?.split(":")[0] ?? "closed"}` : String(answer.status);
      statuses[key] = (statuses[key] ?? 0) + 1;
      if (answer.status !== undefined && answer.status < 300 && /json/.test(answer.headers["content-type"]?.[0] ?? "") && !answer.bodyCut) {
        try {
          pool.harvest(JSON.parse(answer.body.toString("utf8")));
        } catch {
          /* a truncated or non-JSON success: nothing to learn */
        }
      }
      const op = plan.op ? byId.get(plan.op) : undefined;
      const verdict = judge(answer, {
        documented: op?.statuses,
        method: req.method,
        framing: req.framing,
        mayGoUnanswered: mayGoUnanswered(req, answer),
        stray: plan.op === undefined,
      });
      if (!verdict.ok) {
        const fkey = `${plan.op ?? `${plan.method} ${plan.template.slice(0, 40)}`} → ${verdict.problems[0]!.replace(/\d{3,}/g, "N").slice(0, 80)}`;
        const known = findings.get(fkey);
        if (known) known.count++;
        else {
          const requestId = answer.headers["x-request-id"]?.[0];
          findings.set(fkey, {
            key: fkey,
            count: 1,
            problems: verdict.problems,
            request: describe(req),
            answer: describeAnswer(answer),
            logged: requestId ? target.errors.filter((l) => l.line.includes(requestId)).map((l) => l.line.slice(0, 600)) : [],
          });
          log(`FINDING ${fkey}\n  request ${describe(req)}\n  answer  ${describeAnswer(answer)}`);
        }
      }
      if (n + 1 === opts.warmupRuns) measuredAfterWarmup = target.rssKiB();
      if (Date.now() - lastProgress > 10_000) {
        lastProgress = Date.now();
        log(`fuzz: ${seq} requests, ${Math.round((Date.now() - started) / 1000)} s, RSS ${target.rssKiB()} KiB, statuses ${JSON.stringify(statuses)}`);
      }
    }
  };
  try {
    await Promise.all(Array.from({ length: opts.concurrency }, worker));
  } finally {
    clearInterval(sampler);
  }
  // Errors logged for requests whose answers were already judged arrive a little later; so do slow log writes.
  await new Promise((r) => setTimeout(r, 500));
  const end = target.rssKiB();
  const after = await afterChecks(target);
  await dispatcher.close();
  for (const f of findings.values())
    if (f.logged.length === 0) {
      const id = /"requestId":"(req_\w+)"/.exec(f.answer)?.[1];
      if (id) f.logged = target.errors.filter((l) => l.line.includes(id)).map((l) => l.line.slice(0, 600));
    }
  return {
    seed: opts.seed,
    requests: seq,
    operations: ops.length,
    statuses,
    findings: [...findings.values()],
    rssKiB: { warmup: measuredAfterWarmup ?? end, end, peak: Math.max(peak, end) },
    errorLines: target.errors.map((l) => l.line.slice(0, 600)),
    warnLines: target.warnings.length,
    durationS: Math.round((Date.now() - started) / 100) / 10,
    after,
  };
}

/** After the run: the process answers, a real admin call succeeds, the demo agent answers through the proxy. */
async function afterChecks(target: Target): Promise<CampaignResult["after"]> {
  const status = async (path: string, init: RequestInit = {}) => {
    try {
      const res = await fetch(`${target.url}${path}`, { ...init, signal: AbortSignal.timeout(30_000) });
      await res.arrayBuffer();
      return res.status;
    } catch {
      return undefined;
    }
  };
  const auth = { authorization: `Bearer ${target.demo.token}` };
  return {
    healthz: await status("/healthz"),
    adminList: await status("/v1/agents?limit=5", { headers: auth }),
    agentCall: await status(`/a/${target.demo.agentId}/counter`, { method: "POST", headers: auth }),
  };
}

/** What makes a run fail: findings, `error` lines, a check after the run, RSS grown past `rssMarginKiB` over the warm-up's. */
export function campaignFailures(r: CampaignResult, opts: { rssMarginKiB: number; minRequests: number }): string[] {
  const out: string[] = [];
  for (const f of r.findings)
    out.push(
      `${f.count}× ${f.key}\n    request ${f.request}\n    answer  ${f.answer}${f.logged.length ? `\n    logged  ${f.logged.join("\n            ")}` : ""}`,
    );
  if (r.errorLines.length > 0) out.push(`${r.errorLines.length} error lines in the gateway's log, first: ${r.errorLines.slice(0, 5).join("\n    ")}`);
  if (r.after.healthz !== 200) out.push(`GET /healthz after the run: ${r.after.healthz}`);
  if (r.after.adminList !== 200) out.push(`GET /v1/agents after the run: ${r.after.adminList}`);
  if (r.after.agentCall !== 200) out.push(`POST /a/<demo>/counter after the run: ${r.after.agentCall}`);
  if (r.rssKiB.end > r.rssKiB.warmup + opts.rssMarginKiB)
    out.push(`RSS grew from ${r.rssKiB.warmup} KiB after the warm-up to ${r.rssKiB.end} KiB (margin ${opts.rssMarginKiB} KiB)`);
  if (r.requests < opts.minRequests) out.push(`only ${r.requests} requests (at least ${opts.minRequests} expected)`);
  return out;
}

/** The run in one line (`RESULT {json}`): what a long run prints last. */
export function resultLine(r: CampaignResult, failures: string[]): string {
  return `RESULT ${JSON.stringify({ seed: r.seed, requests: r.requests, operations: r.operations, durationS: r.durationS, statuses: r.statuses, rssKiB: r.rssKiB, findings: r.findings.map((f) => ({ key: f.key, count: f.count })), errorLines: r.errorLines.length, warnLines: r.warnLines, after: r.after, failed: failures.length })}`;
}

// Pure rules of a call to an agent, shared by the Hono proxy and the Node fast path: routing, authorization, non-waking traffic.
import { AppError } from "../lib/errors.ts";
import type { NonWakingRules } from "../schema/core.ts";
import type { Caller } from "../contracts/caller.ts";
import type { Json } from "./validate.ts";

/** Where a request goes: an agent and the path (with query) inside it. */
export interface AgentTarget {
  agentId: string;
  pathInside: string;
}

/**
 * `/a/{agentId}[/path][?query]` → the agent and `/path?query`; `{agentId}.{domain}` hosts → the whole URL.
 * Undefined for everything else (the control API). The agent id is not validated here (the caller answers 400).
 */
export function agentTarget(url: string, hostHeader: string | undefined, domain: string | undefined): AgentTarget | undefined {
  if (domain && hostHeader) {
    const host = hostHeader.toLowerCase().replace(/:\d+$/, "");
    if (host.endsWith(`.${domain}`)) {
      const agentId = host.slice(0, -domain.length - 1);
      if (agentId !== "" && !agentId.includes(".")) return { agentId, pathInside: url.startsWith("/") ? url : `/${url}` };
    }
  }
  if (!url.startsWith("/a/")) return undefined;
  let end = 3;
  while (end < url.length) {
    const ch = url.charCodeAt(end);
    if (ch === 47 /* / */ || ch === 63 /* ? */) break;
    end++;
  }
  if (end === 3) return undefined;
  const rest = url.slice(end);
  return { agentId: url.slice(3, end), pathInside: rest === "" ? "/" : rest.startsWith("?") ? `/${rest}` : rest };
}

/** Who may call an agent: anyone when it is public; else a token of its tenant with `agents:invoke` (another tenant's agent is 404). */
export function authorizeCall(agent: { id: string; tenantId: string; public: boolean }, caller: Caller | undefined): void {
  if (agent.public) return;
  if (!caller) throw new AppError("unauthorized", "missing bearer token");
  if (caller.tenantId !== agent.tenantId) throw new AppError("not_found", `agent ${agent.id} not found`);
  if (!caller.scopes.has("agents:invoke")) throw new AppError("forbidden", "token lacks the agents:invoke scope");
}

/**
 * Traffic a sleeping agent should not be woken for. Probes and crawlers hit every URL on a schedule; answering them
 * here costs nothing, waking a VM for them costs a restore and an idle timeout of metered time.
 */
export const defaultNonWakingRules: NonWakingRules = {
  paths: ["/healthz", "/health", "/robots.txt", "/favicon.ico"],
  methods: [],
  userAgents: [
    // uptime monitors and load-balancer health checks
    "UptimeRobot",
    "Pingdom",
    "StatusCake",
    "Better Stack",
    "Uptime-Kuma",
    "Site24x7",
    "kube-probe",
    "ELB-HealthChecker",
    "GoogleHC",
    // search and AI crawlers
    "Googlebot",
    "bingbot",
    "DuckDuckBot",
    "YandexBot",
    "Baiduspider",
    "AhrefsBot",
    "SemrushBot",
    "GPTBot",
    "ClaudeBot",
    "CCBot",
    "Bytespider",
  ],
};

/** The rules in force for an agent: its own when set, else the defaults. */
export function effectiveNonWaking(rules: NonWakingRules | null | undefined): NonWakingRules {
  return rules ?? defaultNonWakingRules;
}

export type NonWakingMatch = "path" | "method" | "user-agent";
export type NonWakingMatcher = (method: string, pathInside: string, userAgent: string | undefined) => NonWakingMatch | undefined;

/**
 * The rules as a matcher, prepared once per agent (exact paths in a set, prefixes, lower-cased user agents): asking
 * costs a few lookups per call. Paths match exactly, or by prefix with a trailing `*`; user agents by substring,
 * ignoring case; methods exactly (upper case).
 */
export function compileNonWaking(rules: NonWakingRules): NonWakingMatcher {
  const exact = new Set(rules.paths.filter((p) => !p.endsWith("*")));
  const prefixes = rules.paths.filter((p) => p.endsWith("*")).map((p) => p.slice(0, -1));
  const methods = new Set(rules.methods);
  const agents = rules.userAgents.map((u) => u.toLowerCase());
  return (method, pathInside, userAgent) => {
    const q = pathInside.indexOf("?");
    const path = q < 0 ? pathInside : pathInside.slice(0, q);
    if (exact.has(path)) return "path";
    for (const p of prefixes) if (path.startsWith(p)) return "path";
    if (methods.size > 0 && methods.has(method.toUpperCase())) return "method";
    if (userAgent && agents.length > 0) {
      const ua = userAgent.toLowerCase();
      for (const u of agents) if (ua.includes(u)) return "user-agent";
    }
    return undefined;
  };
}

/** Which rule (if any) says this request is answered by the gateway (see `compileNonWaking`). */
export function matchNonWaking(rules: NonWakingRules, method: string, pathInside: string, userAgent: string | undefined): NonWakingMatch | undefined {
  return compileNonWaking(rules)(method, pathInside, userAgent);
}

/** A response the gateway gives itself, in a form both entries can write. */
export interface PlainAnswer {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/**
 * The gateway's own answer to non-waking traffic: a disallow-all robots.txt, 204 for a favicon, else 200 with the
 * agent's state. Always from the gateway (also while the agent is awake), so probes never reset its idle timer.
 */
export function nonWakingAnswer(match: NonWakingMatch, method: string, pathInside: string, agentId: string, state: string, requestId: string): PlainAnswer {
  const q = pathInside.indexOf("?");
  const path = q < 0 ? pathInside : pathInside.slice(0, q);
  const headers: Record<string, string> = { "x-wake": "none", "x-request-id": requestId, "cache-control": "no-store", "x-non-waking": match };
  const head = method.toUpperCase() === "HEAD";
  if (path === "/robots.txt") {
    headers["content-type"] = "text/plain; charset=utf-8";
    return { status: 200, headers, body: head ? "" : "User-agent: *\nDisallow: /\n" };
  }
  if (path === "/favicon.ico") return { status: 204, headers, body: "" };
  headers["content-type"] = "application/json; charset=utf-8";
  return { status: 200, headers, body: head ? "" : JSON.stringify({ ok: true, agent: agentId, state, answeredBy: "gateway" }) };
}

const pathRe = /^\/[\x21-\x7e]{0,200}$/;
const methodRe = /^[A-Z]{1,20}$/;

/** Validates `nonWaking` in an API body: null resets to the defaults; lists are bounded. */
export function parseNonWaking(body: Json, key: string): NonWakingRules | null | undefined {
  const v = body[key];
  if (v === undefined) return undefined;
  if (v === null) return null;
  if (typeof v !== "object" || Array.isArray(v)) throw new AppError("bad_request", `${key} must be an object {paths, methods, userAgents} or null`);
  const o = v as Json;
  const unknown = Object.keys(o).filter((k) => !["paths", "methods", "userAgents"].includes(k));
  if (unknown.length > 0) throw new AppError("bad_request", `${key}: unknown field(s): ${unknown.join(", ")}`);
  const list = (name: string, re: RegExp, hint: string): string[] => {
    const items = o[name] ?? [];
    if (!Array.isArray(items) || items.length > 100 || items.some((s) => typeof s !== "string" || !re.test(s))) {
      throw new AppError("bad_request", `${key}.${name} must be a list of at most 100 ${hint}`);
    }
    return items as string[];
  };
  return {
    paths: list("paths", pathRe, "paths starting with / (a trailing * matches a prefix)"),
    methods: list("methods", methodRe, "upper-case HTTP methods"),
    userAgents: list("userAgents", /^[\x20-\x7e]{2,100}$/, "user-agent substrings of 2–100 printable characters"),
  };
}

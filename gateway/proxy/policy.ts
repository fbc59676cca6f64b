// Pure rules of a call to an agent, shared by the Hono proxy and the Node fast path: routing, authorization, non-waking traffic.
import { AppError } from "../../lib/errors.ts";
import type { NonWakingRules } from "../../schema/core.ts";
import type { Caller } from "../../contracts/caller.ts";
import { z } from "../../lib/api.ts";

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
  // Absolute form (`GET http://host/path`, as a client sends to a proxy): the URI's authority is the host and the Host
  // header is ignored (RFC 9112 §3.2.2); what follows it is the path.
  if (url.charCodeAt(0) !== 47 /* / */) {
    const absolute = /^https?:\/\/([^/?#]*)(.*)$/i.exec(url);
    if (absolute) {
      hostHeader = absolute[1]!.replace(/^[^@]*@/, "");
      url = absolute[2] === "" ? "/" : absolute[2]!.startsWith("?") ? `/${absolute[2]}` : absolute[2]!;
    }
  }
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
const userAgentRe = /^[\x20-\x7e]{2,100}$/;
/** Entries a list of the rules holds at most. */
const maxRuleEntries = 100;

/** A list of the rules: at most 100 strings, each matching `re`; absent: empty. */
function ruleList(re: RegExp, hint: string) {
  const message = `must be a list of at most ${maxRuleEntries} ${hint}`;
  return z
    .array(z.string({ error: message }).regex(re, { error: message }), { error: message })
    .max(maxRuleEntries, { error: message })
    .default([])
    .openapi({ description: `At most ${maxRuleEntries} ${hint}` });
}

/** An object schema's own failures in words: the unknown fields it refuses, else what it must be. */
export function objectError(what: string) {
  return (issue: { code?: string; keys?: string[] }) =>
    issue.code === "unrecognized_keys" ? `unknown field(s): ${(issue.keys ?? []).join(", ")}` : `must be ${what}`;
}

/**
 * `nonWaking` in an API body (the routes make it nullable: null resets to the defaults): unknown fields refused,
 * each list bounded; paths start with `/` (a trailing `*` matches a prefix), methods are upper case, user agents
 * are substrings of 2–100 printable characters. A list left out is empty.
 */
export const NonWakingRulesInput = z
  .strictObject(
    {
      paths: ruleList(pathRe, "paths starting with / (a trailing * matches a prefix)"),
      methods: ruleList(methodRe, "upper-case HTTP methods"),
      userAgents: ruleList(userAgentRe, "user-agent substrings of 2–100 printable characters"),
    },
    { error: objectError("an object {paths, methods, userAgents} or null") },
  )
  .openapi("NonWakingRulesInput", { description: "Traffic the gateway answers itself without waking the agent" });

/** The rules as the API shows them. */
export const NonWakingRulesSchema = z
  .object({ paths: z.array(z.string()), methods: z.array(z.string()), userAgents: z.array(z.string()) })
  .openapi("NonWakingRules", { description: "Paths match exactly or by prefix (trailing *), methods exactly, user agents by substring ignoring case" });

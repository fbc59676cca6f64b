// What every entry of the proxy shares (Hono route, Node fast path, WebSocket relay): agent lookup, limits, and the steps admission.ts takes.
import { AppError } from "../../lib/errors.ts";
import { isId } from "../../lib/ids.ts";
import type { Logger } from "../../lib/log.ts";
import { noopMetrics, type Metrics } from "../../lib/metrics.ts";
import { defaultUpstreamTimeouts } from "../../lib/shared-env.ts";
import type { Fleet } from "../../contracts/fleet.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import type { NonWakingRules } from "../../schema/core.ts";
import { agentSpec, type AgentRepo, type AgentRow } from "../agents/repo.ts";
import type { Caller } from "../../contracts/caller.ts";
import { createAgentCache, type AgentCache, type AgentLimitOverrides, type AgentSettingsStore } from "./agents.ts";
import { TenantLimiter } from "./tenant-limiter.ts";
import type { TenantGate } from "../tenants/gate.ts";
import {
  authorizeCall,
  compileNonWaking,
  effectiveNonWaking,
  nonWakingAnswer,
  type NonWakingMatch,
  type NonWakingMatcher,
  type PlainAnswer,
} from "./policy.ts";

/** The proxy's global settings (environment variables in gateway/config.ts and fleet-agent/config.ts). */
export interface ProxyConfig {
  /** Concurrent proxied calls per tenant; more get 429. */
  tenantMaxConcurrent: number;
  /** A call or stream with no bytes either way for this long is ended (per-agent override: proxyIdleTimeoutMs). */
  proxyIdleTimeoutMs: number;
  /** From the request being sent to the agent's response headers (per-agent override: responseTimeoutMs). */
  responseTimeoutMs: number;
  /** Connecting to an agent's endpoint. */
  connectTimeoutMs: number;
  /** Largest request head a client may send, bytes (431 beyond). */
  maxHeaderBytes: number;
  /** How long a client may take to send its request head, ms. */
  clientHeadersTimeoutMs: number;
  /** How long an agent row is trusted from memory. */
  agentCacheTtlMs: number;
  /** Node entry: agent traffic takes the fast path (false: everything goes through the Hono app; no WebSockets). */
  fastPath: boolean;
  /** Node fast path beside the host: simple bodiless calls answered off the socket, without node:http (raw-front.ts). */
  rawFront: boolean;
}

/** The proxy's defaults: the variables' fallbacks (gateway/config.ts) and the inert parts' configuration both read these. */
export const defaultProxyConfig: ProxyConfig = {
  tenantMaxConcurrent: 1000,
  proxyIdleTimeoutMs: 600_000,
  responseTimeoutMs: defaultUpstreamTimeouts.headersTimeoutMs,
  connectTimeoutMs: defaultUpstreamTimeouts.connectTimeoutMs,
  maxHeaderBytes: 16_384,
  clientHeadersTimeoutMs: 10_000,
  agentCacheTtlMs: 2_000,
  fastPath: true,
  rawFront: true,
};

export interface EffectiveLimits {
  responseTimeoutMs: number;
  proxyIdleTimeoutMs: number;
  maxBodyBytes: number;
}

/** An agent as a call sees it: row, host spec, the rules and limits in force. */
export interface ResolvedAgent {
  row: AgentRow;
  spec: AgentSpec;
  nonWaking: NonWakingRules;
  /** The rules, prepared for matching. */
  matchNonWaking: NonWakingMatcher;
  limits: EffectiveLimits;
}

export interface ProxyCoreDeps {
  agents: AgentRepo;
  settings?: AgentSettingsStore | undefined;
  fleet: Fleet;
  log: Logger;
  maxBodyBytes: number;
  proxy: ProxyConfig;
  metrics?: Metrics | undefined;
  /** Tenant statuses (cached): a suspended, deleted or unknown tenant's calls are refused; none: not checked. */
  tenants?: TenantGate | undefined;
}

export interface ProxyCore {
  readonly config: ProxyConfig;
  readonly fleet: Fleet;
  readonly log: Logger;
  /** Where every entry counts the calls it proxied (`noopMetrics` unless given). */
  readonly metrics: Metrics;
  // The steps of admission (admission.ts runs them in its one order; an entry does not call them itself).
  /** The agent by id (cached), with its tenant's status loaded (cached): 400 for a malformed id, 404 when there is none. */
  resolve(agentId: string): Promise<ResolvedAgent>;
  /** The agent from memory without waiting, its tenant's status in memory too (undefined: ask `resolve`). */
  peek(agentId: string): ResolvedAgent | undefined;
  /** The caller's tenant status is in memory (a warm call decides synchronously); else `admitCaller` first. */
  callerReady(caller: Caller): boolean;
  /** The caller's tenant must be active (403 tenant_*; provisioned on first use when configured). */
  admitCaller(caller: Caller, requestId: string): Promise<void>;
  /** 401/403/404 unless `caller` may call the agent; then 403 tenant_* unless the agent's tenant (and the caller's) is active. */
  authorize(agent: ResolvedAgent, caller: Caller | undefined): void;
  /** The gateway's answer for a request `agent.matchNonWaking` matched (it reports the agent's state). */
  nonWakingAnswer(agent: ResolvedAgent, match: NonWakingMatch, method: string, pathInside: string, requestId: string): Promise<PlainAnswer>;
  /** 413 when a declared body is over the agent's limit. */
  checkDeclaredBody(agent: ResolvedAgent, contentLength: string | null | undefined): void;
  /** Counts a call against its tenant's limit (429 at the limit); returns the way out. */
  enter(agent: ResolvedAgent): () => void;
  /** Forgets a cached agent after a change through this process. */
  invalidate(agentId: string): void;
  limitsOf(row: AgentRow, overrides: AgentLimitOverrides): EffectiveLimits;
}

export function createProxyCore(deps: ProxyCoreDeps): ProxyCore {
  const cfg = deps.proxy;
  const cache: AgentCache = createAgentCache(deps.agents, deps.settings, {
    ttlMs: cfg.agentCacheTtlMs,
    maxStaleMs: Math.max(cfg.agentCacheTtlMs * 15, 30_000),
    maxEntries: 100_000,
  });
  const limiter = new TenantLimiter(cfg.tenantMaxConcurrent);
  const resolved = new WeakMap<AgentRow, ResolvedAgent>();
  const tenants = deps.tenants;

  function limitsOf(_row: AgentRow, o: AgentLimitOverrides): EffectiveLimits {
    return {
      responseTimeoutMs: o.responseTimeoutMs ?? cfg.responseTimeoutMs,
      proxyIdleTimeoutMs: o.proxyIdleTimeoutMs ?? cfg.proxyIdleTimeoutMs,
      // The global limit is the operator's ceiling: an agent may only lower it.
      maxBodyBytes: o.maxBodyBytes === null ? deps.maxBodyBytes : Math.min(o.maxBodyBytes, deps.maxBodyBytes),
    };
  }

  /** One ResolvedAgent per cached row: a warm call allocates nothing here. */
  function resolvedOf(loaded: { row: AgentRow; overrides: AgentLimitOverrides }): ResolvedAgent {
    let r = resolved.get(loaded.row);
    if (!r) {
      const nonWaking = effectiveNonWaking(loaded.row.nonWaking);
      r = {
        row: loaded.row,
        spec: agentSpec(loaded.row),
        nonWaking,
        matchNonWaking: compileNonWaking(nonWaking),
        limits: limitsOf(loaded.row, loaded.overrides),
      };
      resolved.set(loaded.row, r);
    }
    return r;
  }

  async function answer(agent: ResolvedAgent, match: NonWakingMatch, method: string, pathInside: string, requestId: string): Promise<PlainAnswer> {
    const status = await deps.fleet.status(agent.row.id).catch(() => undefined);
    return nonWakingAnswer(match, method, pathInside, agent.row.id, status?.state ?? agent.row.state, requestId);
  }

  return {
    config: cfg,
    fleet: deps.fleet,
    log: deps.log,
    metrics: deps.metrics ?? noopMetrics,
    limitsOf,
    async resolve(agentId) {
      if (!isId("agent", agentId)) throw new AppError("invalid_id", `"${agentId.slice(0, 64)}" is not an agent id`);
      const loaded = await cache.get(agentId);
      if (!loaded) throw new AppError("not_found", `agent ${agentId} not found`);
      await tenants?.load(loaded.row.tenantId);
      return resolvedOf(loaded);
    },
    peek(agentId) {
      const loaded = cache.peek(agentId);
      if (!loaded || (tenants && !tenants.ready(loaded.row.tenantId))) return undefined;
      return resolvedOf(loaded);
    },
    callerReady(caller) {
      return !tenants || tenants.ready(caller.tenantId);
    },
    async admitCaller(caller, requestId) {
      await tenants?.admit(caller, requestId);
    },
    authorize(agent, caller) {
      // Who may call first: another tenant's private agent stays a 404, whatever its tenant's status.
      authorizeCall(agent.row, caller);
      if (!tenants) return;
      tenants.assertActive(agent.row.tenantId);
      if (caller && caller.tenantId !== agent.row.tenantId) tenants.assertActive(caller.tenantId);
    },
    nonWakingAnswer: answer,
    checkDeclaredBody(agent, contentLength) {
      if (!contentLength) return;
      const declared = Number(contentLength);
      const max = agent.limits.maxBodyBytes;
      if (declared > max) throw new AppError("payload_too_large", `request body of ${declared} bytes exceeds the limit of ${max} bytes`);
    },
    enter(agent) {
      return limiter.enter(agent.row.tenantId);
    },
    invalidate(agentId) {
      cache.invalidate(agentId);
    },
  };
}

// What the agents' admin routes share: their tag, the scope gate, and per-router helpers (the agent's view, the caller's own agent, the audit record).
import type { Context, MiddlewareHandler } from "hono";
import type { VmStatus } from "../../contracts/agent.ts";
import { jsonBody } from "../../lib/api.ts";
import { scopeGate, type Caller, type GatewayEnv } from "../../contracts/caller.ts";
import { callerAction } from "../../schema/audit-log.ts";
import type { CheckpointGatewayDeps } from "../checkpoints/routes.ts";
import type { GatewayDeps } from "../deps.ts";
import type { ProxyCore } from "../proxy/core.ts";
import { noOverrides } from "../proxy/agents.ts";
import { ownAgent as findOwnAgent, type AgentRow } from "./repo.ts";
import { agentJson } from "./view.ts";

export const tags = ["agents"];

/** The caller must hold `agents:admin`: checked before the body is read or validated. */
export const admin = scopeGate("agents:admin");

export interface AgentRouteContext {
  deps: GatewayDeps & CheckpointGatewayDeps;
  proxy: ProxyCore;
  /** The JSON body reader, bounded by the configured maximum. */
  body: MiddlewareHandler;
  view(row: AgentRow, status: VmStatus | undefined): Promise<ReturnType<typeof agentJson>>;
  ownAgent(caller: Caller, id: string): Promise<AgentRow>;
  audit(c: Context<GatewayEnv>, caller: Caller, action: string, target: string, detail?: Record<string, unknown>): Promise<unknown>;
}

export function agentRouteContext(deps: GatewayDeps & CheckpointGatewayDeps, proxy: ProxyCore): AgentRouteContext {
  const { agents, config, settings } = deps;
  const body = jsonBody(() => config.maxApiBodyBytes);

  /** The agent as the API shows it: with the non-waking rules and the limits in force. */
  async function view(row: AgentRow, status: VmStatus | undefined) {
    const overrides = settings ? await settings.limits(row.id) : noOverrides;
    return agentJson(row, status, proxy.limitsOf(row, overrides));
  }

  const ownAgent = (caller: Caller, id: string) => findOwnAgent(agents, caller, id);

  function audit(c: Context<GatewayEnv>, caller: Caller, action: string, target: string, detail?: Record<string, unknown>) {
    return deps.audit.record(callerAction(caller, c.get("requestId"), action, target, detail));
  }

  return { deps, proxy, body, view, ownAgent, audit };
}

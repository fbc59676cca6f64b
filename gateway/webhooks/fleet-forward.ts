// The `forward` a gateway gives the webhook module: look the agent up, check its tenant, then wake it and call it through the fleet (reason "webhook").
import { AppError } from "../../lib/errors.ts";
import type { Fleet } from "../../contracts/fleet.ts";
import { agentSpec, type AgentRepo } from "../agents/repo.ts";
import type { TenantGate } from "../tenants/gate.ts";
import type { WebhookDeps } from "./types.ts";

/**
 * With `tenants`, a suspended or deleted tenant's agent is not woken: the attempt fails with the tenant's refusal and
 * is retried with backoff (dead-lettered after the endpoint's attempts, replayable once the tenant is resumed).
 */
export function fleetForward(
  agents: Pick<AgentRepo, "get">,
  fleet: Pick<Fleet, "forward">,
  tenants?: Pick<TenantGate, "load" | "assertActive">,
): WebhookDeps["forward"] {
  return async (agentId, req, ctx) => {
    const row = await agents.get(agentId);
    if (!row) throw new AppError("not_found", `agent ${agentId} not found`);
    if (tenants) {
      await tenants.load(row.tenantId);
      tenants.assertActive(row.tenantId);
    }
    return fleet.forward(agentSpec(row), req, { requestId: ctx.requestId, reason: ctx.reason, signal: req.signal });
  };
}

// The `forward` a gateway gives the webhook module: look the agent up, then wake it and call it through the fleet (reason "webhook").
import { AppError } from "../../lib/errors.ts";
import type { Fleet } from "../../contracts/fleet.ts";
import { agentSpec, type AgentRepo } from "../agent-repo.ts";
import type { WebhookDeps } from "./types.ts";

export function fleetForward(agents: Pick<AgentRepo, "get">, fleet: Pick<Fleet, "forward">): WebhookDeps["forward"] {
  return async (agentId, req, ctx) => {
    const row = await agents.get(agentId);
    if (!row) throw new AppError("not_found", `agent ${agentId} not found`);
    return fleet.forward(agentSpec(row), req, { requestId: ctx.requestId, reason: ctx.reason, signal: req.signal });
  };
}

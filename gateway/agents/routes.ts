// Admin API under /v1/agents: create (or fork from a checkpoint), list (paged), get, update, delete, hibernate, wake, keep-awake leases, the event log; checkpoints and warm pools beside them.
import type { OpenAPIHono } from "@hono/zod-openapi";
import { apiRouter } from "../../lib/api.ts";
import type { GatewayEnv } from "../../contracts/caller.ts";
import type { GatewayDeps } from "../deps.ts";
import type { ProxyCore } from "../proxy/core.ts";
import { checkpointRoutes, type CheckpointGatewayDeps } from "../checkpoints/routes.ts";
import { poolRoutes } from "../pools/routes.ts";
import { registerCreateAgent } from "./create-routes.ts";
import { registerAgentCrud } from "./crud-routes.ts";
import { registerAgentLifecycle } from "./lifecycle-routes.ts";
import { agentRouteContext } from "./route-context.ts";

// Registered in this order: the OpenAPI document lists the operations as they are registered.
export function agentRoutes(deps: GatewayDeps & CheckpointGatewayDeps, proxy: ProxyCore): OpenAPIHono<GatewayEnv> {
  const r = apiRouter<GatewayEnv>();
  const ctx = agentRouteContext(deps, proxy);
  registerCreateAgent(r, ctx);
  registerAgentCrud(r, ctx);
  registerAgentLifecycle(r, ctx);
  r.route("/", checkpointRoutes(deps, ctx.view));
  r.route("/", poolRoutes(deps, ctx.view));
  return r;
}

// The operator's templates API: `GET /v1/templates`, the warm templates of every live host (read-only).
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import { apiRouter, errors, json } from "../../lib/api.ts";
import { requireScope, scopeGate, type GatewayEnv } from "../../contracts/caller.ts";
import type { Fleet } from "../../contracts/fleet.ts";
import { TemplateListSchema } from "./api-schemas.ts";

const listTemplatesRoute = createRoute({
  method: "get",
  path: "/v1/templates",
  operationId: "listTemplates",
  summary: "The warm templates new agents are cloned from, on every live host: ready, building, or failed (operator)",
  tags: ["templates"],
  middleware: [scopeGate("operator", { tenantGate: "not-operators" })],
  // 502/504 never: a host that does not answer is left out of the list (and logged), not the list's failure.
  responses: { 200: json(TemplateListSchema, "Every live host's templates, by host then key"), ...errors() },
});

export function templateRoutes(deps: { fleet: Pick<Fleet, "templates"> }): OpenAPIHono<GatewayEnv> {
  const r = apiRouter<GatewayEnv>();
  r.openapi(listTemplatesRoute, async (c) => {
    requireScope(c, "operator");
    // A fleet without templates (the process driver, QEMU_TEMPLATES off, a placement that cannot list hosts) lists none.
    return c.json({ templates: (await deps.fleet.templates?.()) ?? [] }, 200);
  });
  return r;
}

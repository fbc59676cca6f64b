// The webhook routes as one Hono app the gateway mounts: intake and admin, answering errors in the one envelope.
import { Hono } from "hono";
import type { GatewayEnv } from "../../contracts/caller.ts";
import { AppError, toErrorResponse } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import { createAdminRoutes } from "./admin-routes.ts";
import { createIntakeRoutes } from "./intake-routes.ts";
import { withWebhookStore } from "./deps.ts";
import type { WebhookDeps } from "./types.ts";

export interface WebhookRouteOptions {
  /** Called after a delivery is stored or requeued, e.g. to wake an in-process worker at once. */
  onQueued?: () => void;
}

export function createWebhookRoutes(deps: WebhookDeps, opts: WebhookRouteOptions = {}): Hono<GatewayEnv> {
  const onQueued = opts.onQueued ?? (() => {});
  const resolved = withWebhookStore(deps);
  const app = new Hono<GatewayEnv>();
  app.route("/", createIntakeRoutes(resolved, onQueued));
  app.route("/", createAdminRoutes(resolved, onQueued));
  app.onError((err, c) => {
    const requestId = c.get("requestId") ?? newId("request");
    if (!(err instanceof AppError)) deps.log.error("webhook route failed", { requestId, err: err instanceof Error ? err : String(err) });
    return toErrorResponse(err, requestId);
  });
  return app;
}

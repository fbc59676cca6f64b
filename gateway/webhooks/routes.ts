// The webhook routes as one OpenAPI router the gateway mounts: intake and admin, answering errors in the one envelope.
import type { GatewayEnv } from "../../contracts/caller.ts";
import { apiRouter, asAppError } from "../../lib/api.ts";
import { logFailure, toErrorResponse } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import { asDatabaseError } from "../../schema/db-errors.ts";
import { createAdminRoutes } from "./admin-routes.ts";
import { createIntakeRoutes } from "./intake-routes.ts";
import { withWebhookStore } from "./deps.ts";
import type { WebhookDeps } from "./types.ts";

export interface WebhookRouteOptions {
  /** Called after a delivery is stored or requeued, e.g. to wake an in-process worker at once. */
  onQueued?: () => void;
}

export function createWebhookRoutes(deps: WebhookDeps, opts: WebhookRouteOptions = {}) {
  const onQueued = opts.onQueued ?? (() => {});
  const resolved = withWebhookStore(deps);
  const app = apiRouter<GatewayEnv>();
  app.route("/", createIntakeRoutes(resolved, onQueued));
  app.route("/", createAdminRoutes(resolved, onQueued));
  // Mounted, this router's handler is the one its routes' errors meet (Hono keeps a sub-app's own): it renders them as
  // the gateway's does, validation and framework errors included, a database outage as 503 with Retry-After.
  app.onError((thrown, c) => {
    const requestId = c.get("requestId") ?? newId("request");
    const err = asDatabaseError(asAppError(thrown));
    logFailure(deps.log, err, { requestId, method: c.req.method, path: c.req.path });
    return toErrorResponse(err, requestId);
  });
  return app;
}

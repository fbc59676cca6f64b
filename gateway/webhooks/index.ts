// Webhook-triggered wakeups: what the gateway mounts (routes) and starts (the delivery worker), wired together.
import type { Hono } from "hono";
import type { GatewayEnv } from "../../contracts/caller.ts";
import { createWebhookRoutes } from "./routes.ts";
import { createDeliveryWorker, type DeliveryWorker } from "./worker.ts";
import { withWebhookStore } from "./deps.ts";
import type { WebhookDeps } from "./types.ts";

export { createWebhookRoutes, type WebhookRouteOptions } from "./routes.ts";
export { createDeliveryWorker, type DeliveryWorker } from "./worker.ts";
export { webhookConfigFromEnv, validateWebhookConfig } from "./config.ts";
export { defaultWebhookConfig, type WebhookConfig, type WebhookDeps, type ForwardContext } from "./types.ts";
export { createDbWebhookStore } from "./store.ts";
export type { WebhookStore } from "./store-types.ts";
export { fleetForward } from "./fleet-forward.ts";
export { signStandard, signGithub, verifyWebhook } from "./signature.ts";

export interface WebhookModule {
  routes: Hono<GatewayEnv>;
  worker: DeliveryWorker;
}

/** Routes and worker of one process, over one store; a stored delivery kicks the local worker so it is attempted at once, not at the next poll. */
export function createWebhookModule(webhookDeps: WebhookDeps, opts: { workerId?: string } = {}): WebhookModule {
  const deps = withWebhookStore(webhookDeps);
  const worker = createDeliveryWorker(deps, opts);
  const routes = createWebhookRoutes(deps, { onQueued: () => worker.kick() });
  return { routes, worker };
}

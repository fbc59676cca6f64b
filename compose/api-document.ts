// The OpenAPI document of the running gateway: the real app assembled over inert parts, so nothing is called to describe it.
import type { OpenAPIHono } from "@hono/zod-openapi";
import type { GatewayEnv } from "../contracts/caller.ts";
import type { Fleet } from "../contracts/fleet.ts";
import { systemClock } from "../lib/clock.ts";
import { silentLogger } from "../lib/log.ts";
import type { Db } from "../schema/db.ts";
import { apiDocumentHead } from "../gateway/app.ts";
import type { Authenticator } from "../gateway/auth.ts";
import { parseGatewayConfig } from "../gateway/config.ts";
import { webhookConfigFromEnv } from "../gateway/webhooks/config.ts";
import type { ImageBuilder } from "../images/builds.ts";
import { assembleGatewayApp } from "./gateway-app.ts";

/** A stand-in whose every use throws: building the app must not touch it, and describing it never runs a handler. */
function inert<T extends object>(name: string): T {
  return new Proxy({} as T, {
    get(_target, key) {
      if (key === "then") return undefined; // not a thenable
      throw new Error(`the API document touched ${name}.${String(key)}: describing the API must call nothing`);
    },
  });
}

/** The document `/openapi.json` serves, as a Node gateway beside its hosts (with an image builder) serves it. */
export function apiDocument(): ReturnType<OpenAPIHono["getOpenAPI31Document"]> {
  return apiApp().getOpenAPI31Document(apiDocumentHead);
}

/** The gateway app itself over the inert parts: its route table is what the document must cover. */
export function apiApp(): OpenAPIHono<GatewayEnv> {
  const { gateway } = parseGatewayConfig({}, ["demo"]);
  const { app } = assembleGatewayApp({
    db: inert<Db>("db"),
    fleet: inert<Fleet>("fleet"),
    auth: inert<Authenticator>("auth"),
    log: silentLogger,
    clock: systemClock,
    config: gateway,
    webhooks: webhookConfigFromEnv({}),
    componentKey: new Uint8Array(32),
    imageBuilder: inert<ImageBuilder>("imageBuilder"),
    onWebhookQueued: () => {},
  });
  return app as OpenAPIHono<GatewayEnv>;
}

// Meter ingest: hosts ship their segments with a component token of audience billing, idempotent per segment id.
import { createRoute } from "@hono/zod-openapi";
import type { MiddlewareHandler } from "hono";
import type { GatewayVariables } from "../../contracts/caller.ts";
import { errors, json, jsonBody, jsonRequest } from "../../lib/api.ts";
import { verifyComponentToken } from "../../lib/host-token.ts";
import { MeterBatch, MeterIngestResult } from "../api-schemas.ts";
import { ingestSegments } from "../ingest.ts";
import type { BillingRouteContext, BillingRouter } from "./context.ts";
import { tags } from "./http.ts";

/** Largest ingest body accepted (10,000 segments take about 3.5 MB). */
export const maxIngestBytes = 16 * 1024 * 1024;

/** The meter route's context: the host its component token names. */
type MeterEnv = { Variables: GatewayVariables & { meterHostId: string } };

const ingestRoute = createRoute({
  method: "post",
  path: "/v1/meter-segments",
  operationId: "ingestMeterSegments",
  summary: "Ship meter segments (a host, with its component token of audience billing); idempotent per segment id",
  tags,
  request: jsonRequest(MeterBatch),
  responses: { 200: json(MeterIngestResult, "Each segment accepted, a duplicate, or rejected with its code"), ...errors(400, 413) },
});

export function addMeterRoutes(app: BillingRouter, deps: BillingRouteContext): void {
  /** Before the body is read: only a host with a billing component token ships segments, and only its own. */
  const hostToken: MiddlewareHandler<MeterEnv> = async (c, next) => {
    const auth = c.req.header("authorization");
    const token = auth?.startsWith("Bearer ") ? auth.slice(7).trim() : undefined;
    c.set("meterHostId", (await verifyComponentToken(deps.componentKey, token, "billing")).sub);
    await next();
  };

  const ingestMiddleware: [typeof hostToken, MiddlewareHandler<MeterEnv>] = [hostToken, jsonBody(() => maxIngestBytes)];
  app.openapi({ ...ingestRoute, middleware: ingestMiddleware }, async (c) => {
    const hostId = c.get("meterHostId");
    const { segments } = c.req.valid("json");
    const result = await ingestSegments(deps.db, segments, deps.clock, {
      hostId,
      log: deps.log.child({ hostId, requestId: c.get("requestId") }),
      ...(deps.metrics ? { metrics: deps.metrics } : {}),
    });
    return c.json(result, 200);
  });
}

// GET /metrics for operators: the Prometheus text behind `Authorization: Bearer <METRICS_TOKEN>` (compared in constant time), off without a token.
import { Hono } from "hono";
import { AppError, toErrorResponse } from "./errors.ts";
import { newId } from "./ids.ts";

export interface MetricsEndpoint {
  /** METRICS_TOKEN; unset: `/metrics` answers 404 (metrics are off). */
  token: string | undefined;
  text(): Promise<string>;
  contentType: string;
}

export const metricsPath = "/metrics";

/** The scrape's answer; throws 404 when metrics are off, 401 without the token (the caller renders the envelope). */
export async function metricsResponse(endpoint: MetricsEndpoint | undefined, authorization: string | undefined): Promise<Response> {
  if (endpoint?.token === undefined) throw new AppError("not_found", "metrics are off: set METRICS_TOKEN");
  const presented = /^Bearer\s+(\S+)\s*$/i.exec(authorization ?? "")?.[1];
  if (presented === undefined || !(await sameSecret(presented, endpoint.token)))
    throw new AppError("unauthorized", "GET /metrics needs Authorization: Bearer <METRICS_TOKEN>");
  return new Response(await endpoint.text(), { headers: { "content-type": endpoint.contentType, "cache-control": "no-store" } });
}

/** `/metrics` alone, with the error envelope: for a listener that serves it beside (not through) its app. */
export function metricsApp(endpoint: MetricsEndpoint | undefined): Hono {
  const app = new Hono();
  app.onError((err) => toErrorResponse(err, newId("request")));
  app.get(metricsPath, (c) => metricsResponse(endpoint, c.req.header("authorization")));
  app.notFound(() => toErrorResponse(new AppError("method_not_allowed", `only GET ${metricsPath}`), newId("request")));
  return app;
}

/** Equal digests, compared without an early exit: how long it takes says nothing of how much of the token matched. */
async function sameSecret(a: string, b: string): Promise<boolean> {
  const enc = new TextEncoder();
  const [da, db] = await Promise.all([crypto.subtle.digest("SHA-256", enc.encode(a)), crypto.subtle.digest("SHA-256", enc.encode(b))]);
  const x = new Uint8Array(da);
  const y = new Uint8Array(db);
  let diff = 0;
  for (let i = 0; i < x.length; i++) diff |= x[i]! ^ y[i]!;
  return diff === 0;
}

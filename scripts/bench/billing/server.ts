// bench:billing's server: billing's routes over real HTTP on loopback, the caller named by a bench header, on a clock just past the month.
import { serve } from "@hono/node-server";
import { Hono } from "hono";
import { createBillingRoutes } from "../../../billing/routes.ts";
import { allScopes, type GatewayEnv } from "../../../contracts/caller.ts";
import { systemClock, type Clock } from "../../../lib/clock.ts";
import { toErrorResponse } from "../../../lib/errors.ts";
import { silentLogger } from "../../../lib/log.ts";
import type { Db } from "../../../schema/db.ts";
import { freePort } from "../../postgres-server.ts";

/** Billing's clock in the bench: real time, started just after the benchmarked month ends (so drafts count everything). */
export function benchClock(startWall: number): Clock {
  const mono0 = performance.now();
  return { now: () => startWall + Math.round(performance.now() - mono0), monotonic: () => performance.now(), setTimeout: systemClock.setTimeout };
}

/** Serves billing's routes on 127.0.0.1; a request's `x-bench-tenant` header makes it that tenant's, with every scope. */
export async function serveBilling(opts: {
  db: Db;
  clock: Clock;
  componentKey: Uint8Array;
  reportParts: number | undefined;
}): Promise<{ base: string; close(): void }> {
  const routes = createBillingRoutes({
    db: opts.db,
    clock: opts.clock,
    log: silentLogger,
    componentKey: opts.componentKey,
    ...(opts.reportParts === undefined ? {} : { usageParts: opts.reportParts }),
  });
  const app = new Hono<GatewayEnv>();
  app.use(async (c, next) => {
    c.set("requestId", "req_bench");
    const tenant = c.req.header("x-bench-tenant");
    c.set("caller", tenant ? { tenantId: tenant, subject: "bench", scopes: new Set(allScopes) } : undefined);
    await next();
  });
  app.onError((e, c) => toErrorResponse(e, c.get("requestId") ?? "req_bench"));
  app.route("/", routes);
  const port = await freePort();
  const server = serve({ fetch: app.fetch, port, hostname: "127.0.0.1" });
  return { base: `http://127.0.0.1:${port}`, close: () => server.close() };
}

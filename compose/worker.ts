// Cloudflare Workers entry: the same gateway app as on Node, built once per isolate; Postgres via Hyperdrive per request, hosts via fetch.
import { AsyncLocalStorage } from "node:async_hooks";
import { systemClock } from "../lib/clock.ts";
import { AppError, toErrorResponse } from "../lib/errors.ts";
import { newId } from "../lib/ids.ts";
import { createLogger, type Logger } from "../lib/log.ts";
import { openPostgresDb, type Db } from "../schema/postgres.ts";
import { createJwtAuthenticator } from "../gateway/auth.ts";
import { createDbPlacement } from "../gateway/placement.ts";
import { createFetchProbe } from "../gateway/host-probe.ts";
import { createRemoteFleet } from "../gateway/remote-fleet.ts";
import { defaultTenantGateConfig } from "../gateway/tenants/gate.ts";
import { createDeliveryWorker } from "../gateway/webhooks/index.ts";
import { assembleGatewayApp, type GatewayApp } from "./gateway-app.ts";
import { parseWorkerEnv, type ParsedWorkerEnv, type WorkerBindings, type WorkerConfig } from "./worker-env.ts";

/** The parts of Workers' ExecutionContext and ScheduledController used here. */
interface ExecutionContext {
  waitUntil(promise: Promise<unknown>): void;
}
interface ScheduledController {
  cron: string;
  scheduledTime: number;
}

/**
 * What one request (or cron run) owns: its postgres.js client through Hyperdrive (Workers forbid I/O objects across
 * requests, so each opens its own; Hyperdrive pools the real connections) and its background work.
 */
interface RequestScope {
  db: Db;
  background: Background;
}
const scope = new AsyncLocalStorage<RequestScope>();

/** The database of the request in progress: the app is built once, its queries go to the current request's client. */
const requestDb = new Proxy({} as Db, {
  get(_target, prop) {
    const current = scope.getStore()?.db;
    if (!current) throw new Error("the database was used outside a request");
    const value = Reflect.get(current, prop, current) as unknown;
    return typeof value === "function" ? (value as (...args: unknown[]) => unknown).bind(current) : value;
  },
});

/** What lives as long as the isolate: the validated config (per env object), the app with its token cache, JWKS and placement cache. */
interface Isolate {
  parsed: ParsedWorkerEnv;
  log?: Logger;
  gateway?: GatewayApp;
}
const isolates = new WeakMap<object, Isolate>();

function isolateFor(env: WorkerBindings): Isolate {
  let iso = isolates.get(env);
  if (iso) return iso;
  const parsed = parseWorkerEnv(env);
  iso = { parsed };
  if (parsed.ok) {
    const { config } = parsed;
    const log = createLogger({ level: config.logLevel, base: { component: "gateway-worker" } });
    const placement = createDbPlacement(requestDb, { ...config.placement, clock: systemClock, probe: createFetchProbe() });
    const fleet = createRemoteFleet({ placement, key: config.componentKey, log: log.child({ component: "remote-fleet" }) });
    iso.log = log;
    iso.gateway = assembleGatewayApp({
      db: requestDb,
      fleet,
      hostHealth: { liveWindowMs: config.placement.liveWindowMs, maxClockSkewMs: config.placement.maxClockSkewMs },
      auth: createJwtAuthenticator({ keys: config.keys, ...config.auth }),
      log,
      clock: systemClock,
      // Nothing of an agent row is kept across requests here (the proxy's agent cache would refresh with another request's client).
      // Tenant statuses are kept (TENANT_CACHE_TTL_MS) but a stale one is re-read within the request that needs it.
      config: {
        ...config.gateway,
        ...(config.gateway.proxy ? { proxy: { ...config.gateway.proxy, agentCacheTtlMs: 0 } } : {}),
        tenants: { ...(config.gateway.tenants ?? defaultTenantGateConfig), serveStale: false },
      },
      webhooks: config.webhooks,
      componentKey: config.componentKey,
      ...(config.upstreamKey ? { upstreamKey: config.upstreamKey } : {}),
      clientIp: (c) => c.req.header("cf-connecting-ip"),
      // A stored delivery is attempted right after the 202 (waitUntil); the cron picks up whatever that leaves.
      onWebhookQueued: () => scope.getStore()?.background.add(createDeliveryWorker(iso!.gateway!.webhookDeps).runOnce()),
      // A pool's top-up and an acquired agent's wake run after the answer, on the request's client (waitUntil).
      background: (work) => scope.getStore()?.background.add(work),
    });
  }
  isolates.set(env, iso);
  return iso;
}

/** Background work of one request (webhook delivery after intake, a pool's top-up); the request's db client closes after it. */
class Background {
  private readonly tasks = new Set<Promise<unknown>>();
  private readonly ctx: ExecutionContext;
  private readonly log: Logger;

  constructor(ctx: ExecutionContext, log: Logger) {
    this.ctx = ctx;
    this.log = log;
  }

  add(task: Promise<unknown>): void {
    const tracked = task.catch((err: unknown) => this.log.error("background task failed", { err: err instanceof Error ? err.message : String(err) }));
    this.tasks.add(tracked);
    void tracked.finally(() => this.tasks.delete(tracked));
    this.ctx.waitUntil(tracked);
  }

  async settled(): Promise<void> {
    while (this.tasks.size > 0) await Promise.allSettled([...this.tasks]);
  }
}

function configError(problems: string[]): Response {
  // A clear 500 naming what is missing, on every request, until the deployment is fixed.
  return toErrorResponse(new AppError("internal", `gateway misconfigured: ${problems.join("; ")}`), newId("request"));
}

/** Runs `fn` with its own database client, closed once `fn` and the background work it started are done. */
function inScope<T>(config: WorkerConfig, ctx: ExecutionContext, log: Logger, fn: () => Promise<T>): Promise<T> {
  const pg = openPostgresDb(config.connectionString, { max: config.dbMaxConnections, fetchTypes: false });
  const background = new Background(ctx, log);
  return scope.run({ db: pg.db, background }, async () => {
    try {
      return await fn();
    } finally {
      ctx.waitUntil(background.settled().then(() => pg.close()));
    }
  });
}

export default {
  async fetch(request: Request, env: WorkerBindings, ctx: ExecutionContext): Promise<Response> {
    const iso = isolateFor(env);
    if (!iso.parsed.ok) {
      console.error(JSON.stringify({ level: "error", msg: "gateway misconfigured", problems: iso.parsed.problems }));
      return configError(iso.parsed.problems);
    }
    const { app } = iso.gateway!;
    return inScope(iso.parsed.config, ctx, iso.log!, async () => app.fetch(request));
  },

  /** Cron: delivers due webhooks (new ones, retries after backoff, those an ended isolate left) within a time budget. */
  async scheduled(controller: ScheduledController, env: WorkerBindings, ctx: ExecutionContext): Promise<void> {
    const iso = isolateFor(env);
    if (!iso.parsed.ok) {
      console.error(JSON.stringify({ level: "error", msg: "gateway misconfigured", problems: iso.parsed.problems }));
      throw new Error(`gateway misconfigured: ${iso.parsed.problems.join("; ")}`);
    }
    const { config } = iso.parsed;
    const log = iso.log!.child({ cron: controller.cron });
    const run = inScope(config, ctx, log, async () => {
      const worker = createDeliveryWorker(iso.gateway!.webhookDeps);
      const deadline = Date.now() + config.cronBudgetMs;
      let attempted = 0;
      for (;;) {
        const n = await worker.runOnce();
        attempted += n;
        // A short batch means nothing more is due now.
        if (n < config.webhooks.concurrency || Date.now() >= deadline) break;
      }
      if (attempted > 0) log.info("cron delivered webhooks", { attempted });
    });
    ctx.waitUntil(run);
    await run;
  },
};

// Cloudflare Workers entry: the same gateway app as on Node, built from the Worker's env; Postgres via Hyperdrive, hosts via fetch.
import { systemClock } from "../lib/clock.ts";
import { AppError, toErrorResponse } from "../lib/errors.ts";
import { newId } from "../lib/ids.ts";
import { createLogger, type Logger } from "../lib/log.ts";
import { openPostgresDb, type Db } from "../schema/postgres.ts";
import { createBillingRoutes } from "../billing/routes.ts";
import { createGateway } from "./app.ts";
import { createAgentSettingsStore } from "./proxy-agents.ts";
import { createAgentRepo } from "./agent-repo.ts";
import { createJwtAuthenticator, type Authenticator } from "./auth.ts";
import { createDbPlacement, type PlacementCache } from "./placement.ts";
import { createRemoteFleet } from "./remote-fleet.ts";
import { createDeliveryWorker, createWebhookRoutes, fleetForward, type WebhookDeps } from "./webhooks/index.ts";
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
 * What lives as long as the isolate: the validated config (per env object), verified-token cache and JWKS,
 * logger, placement cache. Sockets do not: Workers forbid I/O objects across requests, so each request
 * (and each cron run) opens its own postgres.js client through Hyperdrive, which pools the real connections.
 */
interface Isolate {
  parsed: ParsedWorkerEnv;
  auth?: Authenticator;
  log?: Logger;
  placementCache: PlacementCache;
}
const isolates = new WeakMap<object, Isolate>();

function isolateFor(env: WorkerBindings): Isolate {
  let iso = isolates.get(env);
  if (!iso) {
    const parsed = parseWorkerEnv(env);
    iso = { parsed, placementCache: new Map() };
    if (parsed.ok) {
      const { config } = parsed;
      iso.log = createLogger({ level: config.logLevel, base: { component: "gateway-worker" } });
      iso.auth = createJwtAuthenticator({ keys: config.keys, ...config.auth });
    }
    isolates.set(env, iso);
  }
  return iso;
}

/** Background work of one request (webhook delivery after intake); the request's db client closes after it. */
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

function webhookDeps(config: WorkerConfig, db: Db, log: Logger, forward: WebhookDeps["forward"]): WebhookDeps {
  return { db, clock: systemClock, log: log.child({ component: "webhooks" }), forward, config: config.webhooks };
}

function remoteFleet(config: WorkerConfig, iso: Isolate, db: Db, log: Logger) {
  const placement = createDbPlacement(db, { ...config.placement, clock: systemClock }, iso.placementCache);
  return createRemoteFleet({ placement, key: config.componentKey, log: log.child({ component: "remote-fleet" }) });
}

function configError(problems: string[]): Response {
  // A clear 500 naming what is missing, on every request, until the deployment is fixed.
  return toErrorResponse(new AppError("internal", `gateway misconfigured: ${problems.join("; ")}`), newId("request"));
}

export default {
  async fetch(request: Request, env: WorkerBindings, ctx: ExecutionContext): Promise<Response> {
    const iso = isolateFor(env);
    if (!iso.parsed.ok) {
      console.error(JSON.stringify({ level: "error", msg: "gateway misconfigured", problems: iso.parsed.problems }));
      return configError(iso.parsed.problems);
    }
    const { config } = iso.parsed;
    const log = iso.log!;
    const pg = openPostgresDb(config.connectionString, { max: config.dbMaxConnections, fetchTypes: false });
    const background = new Background(ctx, log);
    try {
      const agents = createAgentRepo(pg.db);
      const fleet = remoteFleet(config, iso, pg.db, log);
      const deps = webhookDeps(config, pg.db, log, fleetForward(agents, fleet));
      // A stored delivery is attempted right after the 202 (waitUntil); the cron picks up whatever that leaves.
      const webhooks = createWebhookRoutes(deps, { onQueued: () => background.add(createDeliveryWorker(deps).runOnce()) });
      const app = createGateway({
        agents,
        fleet,
        auth: iso.auth!,
        log,
        config: config.gateway,
        clientIp: (c) => c.req.header("cf-connecting-ip"),
        routes: [webhooks, createBillingRoutes({ db: pg.db, clock: systemClock, log, componentKey: config.componentKey })],
        // Per request, like the database client: agent settings (PATCH) work; the agent cache and the
        // per-tenant concurrency limit do not span requests on Workers (an isolate's limit is not global anyway).
        settings: createAgentSettingsStore(pg.db),
      });
      return await app.fetch(request);
    } finally {
      ctx.waitUntil(background.settled().then(() => pg.close()));
    }
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
    const pg = openPostgresDb(config.connectionString, { max: config.dbMaxConnections, fetchTypes: false });
    const run = (async () => {
      try {
        const fleet = remoteFleet(config, iso, pg.db, log);
        const worker = createDeliveryWorker(webhookDeps(config, pg.db, log, fleetForward(createAgentRepo(pg.db), fleet)));
        const deadline = Date.now() + config.cronBudgetMs;
        let attempted = 0;
        for (;;) {
          const n = await worker.runOnce();
          attempted += n;
          // A short batch means nothing more is due now.
          if (n < config.webhooks.concurrency || Date.now() >= deadline) break;
        }
        if (attempted > 0) log.info("cron delivered webhooks", { attempted });
      } finally {
        await pg.close();
      }
    })();
    ctx.waitUntil(run);
    await run;
  },
};

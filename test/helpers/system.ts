// The whole system in-process for end-to-end tests: real Postgres, real sockets, a real driver.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { silentLogger, createLogger, type Logger } from "../../lib/log.ts";
import type { Scope } from "../../contracts/caller.ts";
import type { VmDriver } from "../../fleet-agent/drivers/driver.ts";
import type { ExchangeObserver } from "../../fleet-agent/egress/exchanges.ts";
import type { DriverUpstreams } from "../../fleet-agent/drivers/select.ts";
import { ProcessDriver, type ProcessImages } from "../../fleet-agent/drivers/process/driver.ts";
import { parseAllInOneConfig, startAllInOne, type System } from "../../compose/all-in-one.ts";
import { mintToken } from "../../compose/dev-keys.ts";
import { freshDatabase } from "./db.ts";
import { and, eq } from "drizzle-orm";
import { tenants, vmEvents } from "../../schema/core.ts";

export interface TestSystem extends System {
  dataDir: string;
  /** Inserts an active tenant (the gateway refuses tokens of tenants that do not exist: 403 tenant_not_found). */
  ensureTenant(id: string): Promise<void>;
  /** A token for `tenant` (default: the demo tenant) with `scopes` (default: all). */
  token(opts?: { tenant?: string; scopes?: Scope[]; ttlS?: number }): Promise<string>;
  /** Creates an agent through the admin API and answers its JSON. */
  createAgent(body?: Record<string, unknown>, token?: string): Promise<{ id: string } & Record<string, unknown>>;
  /** fetch() to the gateway with the demo tenant's token unless `token` is given ("" for none). */
  call(path: string, init?: RequestInit & { token?: string }): Promise<Response>;
  /** The agent's state as the admin API reports it. */
  state(agentId: string): Promise<string>;
  /** How many times the agent became running, from the event log (after the host flushed its writes). */
  wakes(agentId: string): Promise<number>;
}

export interface StartSystemOptions {
  /** A driver; default the process driver with `images` added. */
  driver?: VmDriver;
  images?: ProcessImages;
  /** Environment variables as the start script would read them (REAPER_INTERVAL_MS, WAKE_QUEUE_LIMIT, …). */
  env?: Record<string, string>;
  log?: Logger | "stderr";
  /** The observer the driver's egress proxy was built with (`LateExchangeObserver`): bound to the host's doze. */
  exchanges?: { bind(target: ExchangeObserver): void };
  /** The driver's egress proxy's upstream path (its slot, config and destination check): served by the host. */
  upstreams?: DriverUpstreams;
}

export async function startSystem(opts: StartSystemOptions = {}): Promise<TestSystem> {
  const dataDir = mkdtempSync(join(tmpdir(), "agentvm-test-"));
  const driver = opts.driver ?? new ProcessDriver({ images: opts.images });
  const env = { REAPER_INTERVAL_MS: "100", DRAIN_TIMEOUT_MS: "2000", PORT: "0", DATA_DIR: dataDir, ...opts.env };
  const images = opts.driver ? ["demo"] : ["demo", ...Object.keys(opts.images ?? {})];
  const database = await freshDatabase({ maxConnections: 10 });
  const log = opts.log === "stderr" ? createLogger({ level: "debug" }) : (opts.log ?? silentLogger);
  const system = await startAllInOne(parseAllInOneConfig(env, images), {
    driver,
    log,
    database,
    ...(opts.exchanges ? { exchanges: opts.exchanges } : {}),
    ...(opts.upstreams ? { upstreams: opts.upstreams } : {}),
  });
  const base = system;
  const baseStop = system.stop;

  const token: TestSystem["token"] = (t = {}) =>
    mintToken(base.keys.privateJwk, {
      tenant: t.tenant ?? base.demo.tenantId,
      scopes: t.scopes ?? ["agents:invoke", "agents:admin", "images:read", "images:write", "usage:read"],
      ttlS: t.ttlS ?? 3600,
    });

  const call: TestSystem["call"] = async (path, init = {}) => {
    const { token: explicit, ...rest } = init;
    const headers = new Headers(rest.headers);
    const bearer = explicit ?? base.demo.token;
    if (bearer) headers.set("authorization", `Bearer ${bearer}`);
    return fetch(base.url + path, { ...rest, headers });
  };

  return Object.assign(system, {
    dataDir,
    token,
    call,
    async ensureTenant(id: string) {
      await base.database.db.insert(tenants).values({ id, name: id }).onConflictDoNothing();
    },
    async createAgent(body: Record<string, unknown> = {}, tok?: string) {
      const res = await call("/v1/agents", {
        method: "POST",
        body: JSON.stringify(body),
        headers: { "content-type": "application/json" },
        token: tok ?? base.demo.token,
      });
      if (res.status !== 201) throw new Error(`create agent: ${res.status} ${await res.text()}`);
      return (await res.json()) as { id: string } & Record<string, unknown>;
    },
    async state(agentId: string) {
      return ((await (await call(`/v1/agents/${agentId}`)).json()) as { state: string }).state;
    },
    async wakes(agentId: string) {
      await base.host.flush();
      const rows = await base.database.db
        .select()
        .from(vmEvents)
        .where(and(eq(vmEvents.agentId, agentId), eq(vmEvents.toState, "running")));
      return rows.length;
    },
    async stop() {
      await baseStop();
      await database.close();
      rmSync(dataDir, { recursive: true, force: true });
    },
  });
}

// Postgres stopped and started under load, with the gateway (`npm run gateway`) and a host (`npm run fleet-agent`) as separate processes.
//
// Before: warm calls failed once the gateway's placement TTL ran out (it asked Postgres on every call), callers waited
// up to 17 s for a 500 without Retry-After, webhook intake answered 500, `/healthz` was the only probe, and the host
// dropped the transitions it made meanwhile. Here: what the gateway knows keeps answering, what needs Postgres answers
// 503 database_unavailable + Retry-After at once, `/readyz` says so, and after Postgres returns everything answers
// within ~2 s and the event log holds every transition of the outage, in order.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtempSync, readFileSync, rmSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { asc, eq } from "drizzle-orm";
import { agents, runs, tenants, vmEvents } from "../../schema/core.ts";
import { meterSegments } from "../../schema/billing.ts";
import { openDatabase, type Database } from "../../schema/db.ts";
import { startPostgres, type PgServer } from "../../scripts/postgres-server.ts";
import { ensureDevKeys, mintToken } from "../../compose/dev-keys.ts";
import { spawn } from "node:child_process";
import { repoRoot, spawnNode, testComponentSecret, waitFor, type Child } from "../helpers/worker-stack.ts";
import { standardHeaders } from "../helpers/webhook-fixtures.ts";

/** How long Postgres stays down, ms. */
const outageMs = 6000;
/** One round of the load every this many ms (each round: one call per target). */
const tickMs = 100;

let pg: PgServer;
let database: Database;
let host: Child & { match: RegExpMatchArray };
let gateway: Child & { match: RegExpMatchArray };
let gatewayUrl: string;
let hostUrl: string;
let hostId: string;
let hostDir: string;
let token: string;
const dirs: string[] = [];

beforeAll(async () => {
  // A server of our own: stopping it must not disturb the shared test server.
  pg = await startPostgres();
  database = await openDatabase({ url: pg.url, maxConnections: 3 });
  hostDir = mkdtempSync(join(tmpdir(), "agentvm-outage-host-"));
  const gatewayDir = mkdtempSync(join(tmpdir(), "agentvm-outage-gw-"));
  dirs.push(hostDir, gatewayDir);
  const common = { DATABASE_URL: pg.url, COMPONENT_SECRET: testComponentSecret, LOG_LEVEL: "error" };
  [host, gateway] = await Promise.all([
    spawnNode(
      "scripts/fleet-agent.ts",
      {
        ...common,
        DATA_DIR: hostDir,
        INGRESS_PORT: "0",
        DRIVER: "process",
        REAPER_INTERVAL_MS: "100",
        HEARTBEAT_INTERVAL_MS: "500",
        METER_HEARTBEAT_MS: "1000",
        DRAIN_TIMEOUT_MS: "2000",
      },
      /fleet-agent (host_[0-9a-z]+) serving gateways at (http:\/\/\S+)/,
    ),
    spawnNode("scripts/gateway.ts", { ...common, DATA_DIR: gatewayDir, PORT: "0", PLACEMENT_CACHE_MS: "500" }, /gateway listening at (http:\/\/\S+)/),
  ]);
  hostId = host.match[1]!;
  hostUrl = host.match[2]!;
  gatewayUrl = gateway.match[1]!;
  const keys = await ensureDevKeys(gatewayDir);
  token = await mintToken(keys.privateJwk, { tenant: "ten_outage", scopes: ["agents:invoke", "agents:admin", "usage:read"] });
  await database.db.insert(tenants).values({ id: "ten_outage", name: "outage" });
}, 120_000);

afterAll(async () => {
  await gateway?.stop();
  await host?.stop();
  await database?.close();
  await pg?.stop();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

interface Answer {
  status: number;
  ms: number;
  code: string | undefined;
  retryAfter: string | null;
  body: unknown;
}

/** One call, timed; a call that gets no answer within 20 s counts as status 0. */
async function timed(url: string, init: RequestInit = {}): Promise<Answer> {
  const started = performance.now();
  try {
    const res = await fetch(url, { ...init, signal: AbortSignal.timeout(20_000) });
    const text = await res.text();
    let body: unknown = text;
    try {
      body = JSON.parse(text);
    } catch {
      /* not JSON */
    }
    const code = (body as { error?: { code?: string } } | undefined)?.error?.code;
    return { status: res.status, ms: performance.now() - started, code, retryAfter: res.headers.get("retry-after"), body };
  } catch {
    return { status: 0, ms: performance.now() - started, code: undefined, retryAfter: null, body: undefined };
  }
}

function api(path: string, init: RequestInit = {}): Promise<Answer> {
  const headers = new Headers(init.headers);
  headers.set("authorization", `Bearer ${token}`);
  if (init.body) headers.set("content-type", "application/json");
  return timed(gatewayUrl + path, { ...init, headers });
}

async function createAgent(idleTimeoutMs: number): Promise<string> {
  const res = await api("/v1/agents", { method: "POST", body: JSON.stringify({ idleTimeoutMs }) });
  expect(res.status).toBe(201);
  return (res.body as { id: string }).id;
}

async function webhook(agentId: string, secret: string, id: string): Promise<Answer> {
  const body = JSON.stringify({ type: "ping", id });
  const headers = await standardHeaders(secret, body, { id, timestampS: Math.floor(Date.now() / 1000) });
  return timed(`${gatewayUrl}/hooks/${agentId}/events`, { method: "POST", headers, body });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const byStatus = (answers: Answer[]) =>
  answers.reduce<Record<string, number>>(
    (acc, a) => ((acc[`${a.status}${a.code ? ` ${a.code}` : ""}`] = (acc[`${a.status}${a.code ? ` ${a.code}` : ""}`] ?? 0) + 1), acc),
    {},
  );
const longest = (answers: Answer[]) => Math.round(Math.max(...answers.map((a) => a.ms)));

describe("Postgres down under load", () => {
  it("known agents keep answering, what needs Postgres answers 503 at once, /readyz says so, and nothing the host did is lost", async () => {
    // Before: an agent that stays awake, one that hibernated, and a webhook endpoint.
    const awake = await createAgent(600_000);
    const sleeper = await createAgent(1500);
    const hook = await api(`/v1/agents/${awake}/webhooks`, { method: "POST", body: JSON.stringify({ name: "events", scheme: "standard", path: "/counter" }) });
    expect(hook.status).toBe(201);
    const secret = (hook.body as { secret: string }).secret;
    expect((await api(`/a/${awake}/counter`, { method: "POST" })).status).toBe(200);
    expect((await api(`/a/${sleeper}/counter`, { method: "POST" })).status).toBe(200);
    await waitFor(
      async () => (await database.db.select({ state: agents.state }).from(agents).where(eq(agents.id, sleeper)))[0]?.state === "hibernated",
      10_000,
      "the sleeper hibernated",
    );
    const eventsBefore = await database.db.select({ id: vmEvents.id }).from(vmEvents).where(eq(vmEvents.agentId, sleeper));
    const lastBefore = Math.max(...eventsBefore.map((e) => e.id));
    expect((await timed(`${gatewayUrl}/readyz`)).body).toEqual({ ok: true, database: "up" });
    expect((await timed(`${hostUrl}/readyz`)).body).toEqual({ ok: true, database: "up" });

    // Down, under a bounded load: one call per target every 100 ms.
    await pg.halt();
    const downAt = Date.now();
    const load: Record<"awake" | "sleeper" | "intake" | "dbOnly" | "readyz" | "hostReadyz", Answer[]> = {
      awake: [],
      sleeper: [],
      intake: [],
      dbOnly: [],
      readyz: [],
      hostReadyz: [],
    };
    const dbOnlyRoutes: [string, RequestInit][] = [
      ["/v1/agents", {}],
      ["/v1/agents", { method: "POST", body: JSON.stringify({}) }],
      [`/v1/agents/${sleeper}/wake`, { method: "POST" }],
      ["/v1/usage?from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z", {}],
    ];
    const inFlight: Promise<void>[] = [];
    let spoolSeen = 0;
    for (let tick = 0; Date.now() - downAt < outageMs; tick++) {
      const push = (key: keyof typeof load, p: Promise<Answer>) => inFlight.push(p.then((a) => void load[key].push(a)));
      push("awake", api(`/a/${awake}/counter`));
      // The hibernated agent is called early in the outage (it wakes), then left alone (it hibernates again by idle).
      if (tick < 3) push("sleeper", api(`/a/${sleeper}/counter`, { method: "POST" }));
      push("intake", webhook(awake, secret, `msg_outage_${tick}`));
      const [path, init] = dbOnlyRoutes[tick % dbOnlyRoutes.length]!;
      push("dbOnly", api(path, init));
      push("readyz", timed(`${gatewayUrl}/readyz`));
      push("hostReadyz", timed(`${hostUrl}/readyz`));
      const spool = join(hostDir, "hosts", hostId, "events", "store.ndjson");
      if (existsSync(spool)) spoolSeen = Math.max(spoolSeen, readFileSync(spool, "utf8").split("\n").filter(Boolean).length);
      await sleep(tickMs);
    }
    await Promise.all(inFlight);

    // Nothing crashed meanwhile.
    for (const child of [host, gateway]) expect(child.proc.exitCode, child.output().slice(-4000)).toBeNull();

    // Up again: how long until what needs Postgres answers again, with no restart of anything.
    await pg.restart();
    const upAt = Date.now();
    const recovered = await waitFor(async () => (await api("/v1/agents")).status === 200, 10_000, "the admin API back");
    const intakeBack = await waitFor(async () => (await webhook(awake, secret, `msg_after_${Date.now()}`)).status === 202, 10_000, "webhook intake back");
    const readyBack = await waitFor(
      async () => {
        const [g, h] = [await timed(`${gatewayUrl}/readyz`), await timed(`${hostUrl}/readyz`)];
        return g.status === 200 && h.status === 200;
      },
      10_000,
      "/readyz up",
    );
    const summary = Object.fromEntries(Object.entries(load).map(([k, v]) => [k, { byStatus: byStatus(v), longestMs: longest(v) }]));
    console.log(
      `outage ${outageMs} ms:`,
      JSON.stringify(summary),
      `recovery: admin ${recovered} ms, intake ${intakeBack} ms, readyz ${readyBack} ms; host spool held ${spoolSeen} writes`,
    );

    // The agent that stayed awake answered every call (placement and agent row from memory); so did the one that woke.
    expect(load.awake.length).toBeGreaterThan(outageMs / tickMs / 2);
    expect(byStatus(load.awake)).toEqual({ "200": load.awake.length });
    expect(longest(load.awake)).toBeLessThan(1500);
    expect(byStatus(load.sleeper)).toEqual({ "200": load.sleeper.length });
    // What needs Postgres: 503 database_unavailable with Retry-After, within the bound (no 500, no hang).
    expect(byStatus(load.dbOnly)).toEqual({ "503 database_unavailable": load.dbOnly.length });
    expect(load.dbOnly.every((a) => a.retryAfter === "2")).toBe(true);
    expect(longest(load.dbOnly)).toBeLessThan(2000);
    // Webhook senders are told to retry: nothing was stored, nothing lost.
    expect(byStatus(load.intake)).toEqual({ "503 database_unavailable": load.intake.length });
    expect(load.intake.every((a) => a.retryAfter !== null)).toBe(true);
    expect(longest(load.intake)).toBeLessThan(2000);
    // /readyz names the missing dependency (gateway and host alike), quickly.
    for (const probe of [load.readyz, load.hostReadyz]) {
      expect(byStatus(probe)).toEqual({ "503 database_unavailable": probe.length });
      expect((probe[0]!.body as { error: { details: unknown } }).error.details).toEqual({ database: "down" });
      expect(longest(probe)).toBeLessThan(1500);
    }
    // The host kept its transitions on disk meanwhile.
    expect(spoolSeen).toBeGreaterThan(0);
    // Back within a second or two of Postgres.
    expect(recovered).toBeLessThan(2500);
    expect(intakeBack).toBeLessThan(2500);
    expect(readyBack).toBeLessThan(2500);

    // The event log has every transition the host made during the outage, in order, with the run closed.
    const outageEvents = async () =>
      (await database.db.select().from(vmEvents).where(eq(vmEvents.agentId, sleeper)).orderBy(asc(vmEvents.id))).filter((e) => e.id > lastBefore);
    await waitFor(async () => (await outageEvents()).at(-1)?.toState === "hibernated", 10_000, "the outage's transitions replayed");
    const during = await outageEvents();
    expect(during.map((e) => `${e.fromState}→${e.toState}:${e.reason}`)).toEqual([
      "hibernated→restoring:request",
      "restoring→running:request",
      "running→snapshotting:idle",
      "snapshotting→hibernated:idle",
    ]);
    for (const e of during) {
      expect(e.at.getTime()).toBeGreaterThanOrEqual(downAt - 50);
      expect(e.at.getTime()).toBeLessThanOrEqual(upAt);
    }
    for (let i = 1; i < during.length; i++) expect(during[i]!.at.getTime()).toBeGreaterThanOrEqual(during[i - 1]!.at.getTime());
    const lastRun = async () => (await database.db.select().from(runs).where(eq(runs.agentId, sleeper)).orderBy(asc(runs.wokeAt))).at(-1)!;
    // The run's end is its own spooled write, replayed after the transitions: under load it lands a moment later.
    await waitFor(async () => (await lastRun()).sleepReason !== null, 10_000, "the outage's run closed");
    const outageRun = await lastRun();
    expect(outageRun).toMatchObject({ id: during[1]!.runId, wakeMode: "restore", sleepReason: "idle" });
    expect(outageRun.sleptAt!.getTime()).toBeLessThanOrEqual(upAt);
    expect((await database.db.select({ state: agents.state }).from(agents).where(eq(agents.id, sleeper)))[0]?.state).toBe("hibernated");

    // The meter kept counting into the host's spool and shipped later: the awake agent's segments cover the outage, without a gap.
    const covered = async () => {
      const segs = await database.db.select().from(meterSegments).where(eq(meterSegments.agentId, awake)).orderBy(asc(meterSegments.startedAt));
      for (let i = 1; i < segs.length; i++) if (segs[i]!.startedAt.getTime() !== segs[i - 1]!.endedAt.getTime()) return false;
      return segs.length > 0 && segs[0]!.startedAt.getTime() < downAt && segs.at(-1)!.endedAt.getTime() > upAt;
    };
    await waitFor(covered, 25_000, "meter segments covering the outage shipped");
  }, 90_000);

  it("transactions in flight when Postgres stops do not take the process down, and the client works after it returns", async () => {
    // postgres.js 3.4.x alone exits the process here, two ways: a rollback written on a closed connection (see
    // schema/db-gate.ts), and its per-connection type query failing with the connection (`read ECONNRESET`, an unhandled
    // rejection: see schema/postgres-guard.ts; with that fetch on, 15 of 19 runs of this stress crashed on a busy machine).
    const child = spawn(process.execPath, [join(repoRoot, "test/integration/db-outage-child.ts")], {
      env: { ...process.env, DATABASE_URL: pg.url },
      stdio: ["pipe", "pipe", "pipe"],
    });
    let out = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    child.stderr.on("data", (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
    await waitFor(() => out.includes("ready"), 10_000, "the child's load running");
    for (let round = 0; round < 5; round++) {
      await sleep(300);
      await pg.halt();
      await sleep(300);
      await pg.restart();
    }
    child.stdin.write("done\n");
    const code = await exited;
    expect(code, out).toBe(0);
    const result = JSON.parse(out.trim().split("\n").at(-1)!) as { committed: number; failed: number; afterMs: number };
    expect(result.committed).toBeGreaterThan(0);
    expect(result.failed).toBeGreaterThan(0);
    expect(result.afterMs).toBeLessThan(1000); // 20 queries right after: no connection of the pool left broken
  }, 60_000);
});

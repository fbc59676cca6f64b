// `npm run bench:failover`: how long a dead host's agents take to answer again from other hosts, and what a drain costs callers.
//
// One throwaway Postgres (scripts/postgres-server.ts), 3 fleet-agents (scripts/fleet-agent.ts, process driver) and 2
// standalone gateways (scripts/gateway.ts) in child processes, everything under one temporary directory. Each round:
// agents-per-host × 3 agents are created (spread by free capacity) and each is called once (a cold boot: its
// `server-timing` boot is the reference's boot), half of the agents of the host holding the most are hibernated, that
// host is killed with SIGKILL, and every one of its agents is called every 100 ms, alternately through both gateways,
// until it answers 200: per agent the ms from the kill to that answer, and every other answer counted by status (503
// while the dead host's lease runs is expected; a 502 or anything else is a failed call). The host is then started
// again (same HOST_ID and data directory) and the round's agents deleted; the next round starts once the gateways
// place on the restarted host again (their probe of a host found dead is kept 5 s), so it has 3 hosts' worth again.
// Once at the end, a drain: the agents of one host are called every 150 ms each while an operator drains it
// (`POST /v1/hosts/{id}/drain`), until every one of them has answered 200 from another host.
// The floor to compare with, measured in the same run: the lease (HOST_LIVE_WINDOW_MS) plus one cold boot (p50).
// Prints a line per round and, last, `RESULT {json}`.
//
// | variable | flag | default | meaning |
// | BENCH_ROUNDS | --rounds | 10 | rounds of kill -9 and failover |
// | BENCH_AGENTS_PER_HOST | --agents-per-host | 10 | agents created per host each round (3 hosts) |
// | BENCH_LEASE_MS | --lease-ms | 2000 | the gateways' HOST_LIVE_WINDOW_MS: a host without a heartbeat this long loses its agents, ms |
// | BENCH_HEARTBEAT_MS | --heartbeat-ms | 250 | the hosts' HEARTBEAT_INTERVAL_MS, ms |
// | BENCH_ANSWER_TIMEOUT_MS | --answer-timeout-ms | 30000 | an agent not answering 200 this long after the kill counts as unanswered, ms |
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { inArray } from "drizzle-orm";
import { ensureDevKeys, mintToken } from "../compose/dev-keys.ts";
import { int } from "../lib/env.ts";
import { agents, tenants } from "../schema/core.ts";
import { openDatabase, type Database } from "../schema/db.ts";
import { startPostgres, type PgServer } from "./postgres-server.ts";

/** `--rounds 5` / `--rounds=5` and the rest, as the BENCH_* variables they stand for (a flag wins). */
function flagsOverEnv(argv: readonly string[], env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const names: Record<string, string> = { rounds: "BENCH_ROUNDS", "agents-per-host": "BENCH_AGENTS_PER_HOST", "lease-ms": "BENCH_LEASE_MS", "heartbeat-ms": "BENCH_HEARTBEAT_MS", "answer-timeout-ms": "BENCH_ANSWER_TIMEOUT_MS" };
  const out = { ...env };
  for (let i = 0; i < argv.length; i++) {
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(argv[i]!);
    const name = m && names[m[1]!];
    if (!name) throw new Error(`unknown argument ${argv[i]} (flags: ${Object.keys(names).map((n) => `--${n}`).join(", ")})`);
    out[name] = m[2] ?? argv[++i];
  }
  return out;
}

const env = flagsOverEnv(process.argv.slice(2), process.env);
const rounds = int(env, "BENCH_ROUNDS", 10, { min: 1, max: 1000 });
const agentsPerHost = int(env, "BENCH_AGENTS_PER_HOST", 10, { min: 2, max: 200 });
const leaseMs = int(env, "BENCH_LEASE_MS", 2000, { min: 1000 });
const heartbeatMs = int(env, "BENCH_HEARTBEAT_MS", 250, { min: 100 });
const answerTimeoutMs = int(env, "BENCH_ANSWER_TIMEOUT_MS", 30_000, { min: 1000 });
const hostIds = ["host_b1", "host_b2", "host_b3"] as const;
const failoverPollMs = 100;
/**
 * How long a gateway keeps a host it failed to connect to out of placement before probing it again (the placement's
 * default `probeTtlMs`, gateway/placement.ts): a restarted host takes new agents only after that since the last call
 * that found it dead, so each round waits it out to start with 3 hosts again.
 */
const gatewayProbeTtlMs = 5000;
const drainPollMs = 150;
const tenantId = "ten_bench";
const secret = "bench-component-secret-0123456789abcdef";

const root = fileURLToPath(new URL("..", import.meta.url));
const work = mkdtempSync(join(tmpdir(), "agentvm-bench-failover-"));
const log = (msg: string) => console.error(`[bench-failover] ${msg}`);

interface Child {
  proc: ChildProcess;
  /** What the ready line matched. */
  match: RegExpMatchArray;
  output(): string;
}

const children = new Set<ChildProcess>();
const hostProcs = new Map<string, Child>();
const gateways: string[] = [];
let pg: PgServer | undefined;
let database: Database | undefined;

/** Runs `node <script>` from the repository root with `extra` over our environment, resolving once its output matches `ready`. */
function spawnUntil(script: string, extra: Record<string, string>, ready: RegExp, timeoutMs = 60_000): Promise<Child> {
  const proc = spawn(process.execPath, [join(root, script)], { cwd: root, env: { ...process.env, LOG_LEVEL: "warn", ...extra }, stdio: ["ignore", "pipe", "pipe"] });
  children.add(proc);
  proc.once("exit", () => children.delete(proc));
  let out = "";
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${script} not ready within ${timeoutMs} ms:\n${out}`)), timeoutMs);
    const onData = (d: Buffer) => {
      out += d.toString();
      if (out.length > 1 << 20) out = out.slice(-(1 << 19)); // a long run's warnings: keep the tail
      const m = ready.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve({ proc, match: m, output: () => out });
      }
    };
    proc.stdout!.on("data", onData);
    proc.stderr!.on("data", onData);
    proc.once("exit", (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`${script} exited (${code ?? signal}) before it was ready:\n${out}`));
    });
  });
}

/** SIGTERM (the daemons hibernate their agents and exit), SIGKILL after `graceMs`; resolves at the exit. */
async function stopChild(proc: ChildProcess, graceMs = 15_000): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return;
  const exited = new Promise((r) => proc.once("exit", r));
  proc.kill("SIGTERM");
  const timer = setTimeout(() => proc.kill("SIGKILL"), graceMs);
  await exited;
  clearTimeout(timer);
}

/**
 * Processes a killed host left running (the process driver's workloads, each in its own process group) that no host
 * restarted after the kill reaped: found by our temporary directory in their command line or environment.
 */
function leftoverPids(): number[] {
  const pids: number[] = [];
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d) || Number(d) === process.pid) continue;
    try {
      const text = readFileSync(`/proc/${d}/cmdline`, "latin1") + readFileSync(`/proc/${d}/environ`, "latin1");
      if (text.includes(work)) pids.push(Number(d));
    } catch {
      /* ended meanwhile, or not ours to read */
    }
  }
  return pids;
}

let cleaning: Promise<void> | undefined;
function cleanUp(): Promise<void> {
  cleaning ??= (async () => {
    await Promise.all([...children].map((c) => stopChild(c)));
    for (const pid of leftoverPids()) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        /* already gone */
      }
    }
    await database?.close().catch(() => undefined);
    await pg?.stop().catch(() => undefined);
    rmSync(work, { recursive: true, force: true });
  })();
  return cleaning;
}

let interrupted = false;
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    interrupted = true;
    log(`${signal}: stopping every child`);
    void cleanUp().finally(() => process.exit(130));
  });
}

function hostEnv(id: string, databaseUrl: string): Record<string, string> {
  return {
    DATABASE_URL: databaseUrl,
    COMPONENT_SECRET: secret,
    DATA_DIR: join(work, id),
    HOST_ID: id,
    INGRESS_PORT: "0",
    DRIVER: "process",
    HOST_CAPACITY_MIB: "16384",
    HEARTBEAT_INTERVAL_MS: String(heartbeatMs),
    METER_HEARTBEAT_MS: "500",
    REAPER_INTERVAL_MS: "100",
    DRAIN_TIMEOUT_MS: "1000",
  };
}

async function startHost(id: string, databaseUrl: string): Promise<void> {
  hostProcs.set(id, await spawnUntil("scripts/fleet-agent.ts", hostEnv(id, databaseUrl), /fleet-agent (host_[0-9a-z_]+) serving gateways at (http:\/\/\S+)/));
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, Math.max(0, ms)));

function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

const sortNum = (xs: readonly number[]) => [...xs].sort((a, b) => a - b);
const r0 = (x: number) => Math.round(x);

/** Adds one to `status` in `counts` (statuses as strings: "error" for a call that got no answer). */
function count(counts: Record<string, number>, status: string): void {
  counts[status] = (counts[status] ?? 0) + 1;
}

/** The boot's duration in a `server-timing` header (`boot;dur=N`). */
function bootMs(res: Response): number | undefined {
  const m = /(?:^|,\s*)boot;dur=([\d.]+)/.exec(res.headers.get("server-timing") ?? "");
  return m ? Number(m[1]) : undefined;
}

async function main(): Promise<void> {
  const loadStart = loadavg();
  pg = await startPostgres();
  log(`postgres at ${pg.url}; work dir ${work}`);
  database = await openDatabase({ url: pg.url, maxConnections: 4 });
  const db = database.db;
  await db.insert(tenants).values({ id: tenantId, name: "bench-failover" });
  const gatewayDir = join(work, "gateway");
  mkdirSync(gatewayDir, { recursive: true });
  const keys = await ensureDevKeys(gatewayDir);
  const token = await mintToken(keys.privateJwk, { tenant: tenantId, scopes: ["agents:invoke", "agents:admin"], ttlS: 24 * 3600 });
  const operator = await mintToken(keys.privateJwk, { tenant: tenantId, scopes: ["operator"], ttlS: 24 * 3600 });

  await Promise.all(hostIds.map((id) => startHost(id, pg!.url)));
  for (let i = 0; i < 2; i++) {
    const g = await spawnUntil(
      "scripts/gateway.ts",
      { DATABASE_URL: pg.url, COMPONENT_SECRET: secret, DATA_DIR: gatewayDir, PORT: "0", HOST_LIVE_WINDOW_MS: String(leaseMs), PLACEMENT_CACHE_MS: "500", LOG_LEVEL: "error" },
      /gateway listening at (http:\/\/\S+)/,
    );
    gateways.push(g.match[1]!);
  }
  log(`3 hosts, 2 gateways up; ${rounds} rounds of ${agentsPerHost * 3} agents, lease ${leaseMs} ms, heartbeat ${heartbeatMs} ms`);

  /** A call through gateway `via % 2`; a call with no answer within 10 s (or refused) is status "error". */
  async function call(via: number, path: string, init: RequestInit = {}, bearer = token): Promise<{ status: string; res?: Response }> {
    const headers = new Headers(init.headers);
    headers.set("authorization", `Bearer ${bearer}`);
    try {
      const res = await fetch(gateways[via % gateways.length]! + path, { ...init, headers, signal: AbortSignal.timeout(10_000) });
      return { status: String(res.status), res };
    } catch {
      return { status: "error" };
    }
  }

  async function hostsOf(ids: readonly string[]): Promise<Map<string, string | null>> {
    const rows = await db.select({ id: agents.id, hostId: agents.hostId }).from(agents).where(inArray(agents.id, [...ids]));
    return new Map(rows.map((r) => [r.id, r.hostId]));
  }

  /** Creates `n` agents through both gateways, calls each once (its cold boot), and returns them by host. */
  async function createAndWake(n: number, boots: number[]): Promise<{ ids: string[]; byHost: Map<string, string[]> }> {
    const ids: string[] = [];
    for (let i = 0; i < n; i++) {
      const { status, res } = await call(i, "/v1/agents", { method: "POST", body: JSON.stringify({ idleTimeoutMs: 120_000 }), headers: { "content-type": "application/json" } });
      if (status !== "201") throw new Error(`POST /v1/agents: ${status} ${await res?.text()}`);
      ids.push(((await res!.json()) as { id: string }).id);
    }
    // One at a time: each first call's boot is a cold boot of the process driver with nothing else booting.
    for (const [i, id] of ids.entries()) {
      const { status, res } = await call(i, `/a/${id}/counter`, { method: "POST" });
      if (status !== "200") throw new Error(`first call of ${id}: ${status} ${await res?.text()}`);
      const boot = res!.headers.get("x-wake") === "boot" ? bootMs(res!) : undefined;
      if (boot !== undefined) boots.push(boot);
      await res!.arrayBuffer();
    }
    const placed = await hostsOf(ids);
    const byHost = new Map<string, string[]>(hostIds.map((h) => [h, []]));
    for (const id of ids) byHost.get(placed.get(id)!)?.push(id);
    return { ids, byHost };
  }

  async function deleteAll(ids: readonly string[]): Promise<void> {
    for (let i = 0; i < ids.length; i += 6) {
      await Promise.all(
        ids.slice(i, i + 6).map(async (id, j) => {
          const { status, res } = await call(i + j, `/v1/agents/${id}`, { method: "DELETE" });
          if (status !== "200") throw new Error(`DELETE /v1/agents/${id}: ${status} ${await res?.text()}`);
          await res!.arrayBuffer();
        }),
      );
    }
  }

  const firstBoots: number[] = [];
  const failoverBoots: number[] = [];
  const answered: number[] = [];
  const perRoundP50s: number[] = [];
  const statuses: Record<string, number> = {};
  const spreads: number[][] = [];
  let unanswered = 0;
  let victimsTotal = 0;
  const t0 = performance.now();

  for (let round = 1; round <= rounds; round++) {
    const { ids, byHost } = await createAndWake(agentsPerHost * hostIds.length, firstBoots);
    spreads.push(hostIds.map((h) => byHost.get(h)!.length));
    // The host with the most agents; among equals each round another one, so every host dies and comes back.
    const n = hostIds.length;
    const turn = (h: string) => (hostIds.indexOf(h as (typeof hostIds)[number]) - (round % n) + n) % n;
    const [victimHost, victims] = [...byHost.entries()].sort((a, b) => b[1].length - a[1].length || turn(a[0]) - turn(b[0]))[0]!;
    for (const id of victims.slice(0, Math.ceil(victims.length / 2))) {
      const { status, res } = await call(0, `/v1/agents/${id}/hibernate`, { method: "POST" });
      if (status !== "200") throw new Error(`hibernate ${id}: ${status} ${await res?.text()}`);
      await res!.arrayBuffer();
    }

    const roundStatuses: Record<string, number> = {};
    const roundAnswered: number[] = [];
    const killedAt = performance.now();
    let lastRefusedAt = killedAt;
    hostProcs.get(victimHost)!.proc.kill("SIGKILL");
    await Promise.all(
      victims.map(async (id, i) => {
        for (let attempt = 0; ; attempt++) {
          const { status, res } = await call(i + attempt, `/a/${id}/counter`, { method: "POST" });
          count(roundStatuses, status);
          if (status === "200") {
            roundAnswered.push(performance.now() - killedAt);
            const boot = res!.headers.get("x-wake") === "boot" ? bootMs(res!) : undefined;
            if (boot !== undefined) failoverBoots.push(boot);
            await res!.arrayBuffer();
            return;
          }
          await res?.body?.cancel();
          lastRefusedAt = performance.now();
          if (performance.now() - killedAt > answerTimeoutMs) {
            unanswered++;
            return;
          }
          await sleep(failoverPollMs);
        }
      }),
    );
    victimsTotal += victims.length;
    answered.push(...roundAnswered);
    for (const [s, n] of Object.entries(roundStatuses)) statuses[s] = (statuses[s] ?? 0) + n;
    const sorted = sortNum(roundAnswered);
    perRoundP50s.push(r0(percentile(sorted, 50)));
    log(
      `round ${round}/${rounds}: spread ${spreads.at(-1)!.join("/")}, killed ${victimHost} (${victims.length} agents, ${Math.ceil(victims.length / 2)} hibernated): ` +
        `answered again after p50 ${r0(percentile(sorted, 50))} ms, max ${r0(sorted.at(-1) ?? NaN)} ms; statuses ${JSON.stringify(roundStatuses)}`,
    );

    await startHost(victimHost, pg.url);
    await deleteAll(ids);
    await sleep(lastRefusedAt + gatewayProbeTtlMs + 500 - performance.now());
  }
  const failoverSeconds = (performance.now() - t0) / 1000;

  // The drain: a steady load on one host's agents while an operator drains it.
  const { byHost } = await createAndWake(agentsPerHost * hostIds.length, firstBoots);
  const [drainHost, loaded] = [...byHost.entries()].sort((a, b) => b[1].length - a[1].length)[0]!;
  const drainStatuses: Record<string, number> = {};
  /** Per loaded agent: when the database first showed it on another host, and when it then answered 200. */
  const movedAt = new Map<string, number>();
  const answeredElsewhere = new Map<string, number>();
  let stop = false;
  const watch = (async () => {
    while (!stop) {
      const now = performance.now();
      for (const [id, host] of await hostsOf(loaded)) if (host !== drainHost && !movedAt.has(id)) movedAt.set(id, now);
      await sleep(50);
    }
  })();
  const load = Promise.all(
    loaded.map(async (id, i) => {
      for (let attempt = 0; !stop; attempt++) {
        const sent = performance.now();
        const { status, res } = await call(i + attempt, `/a/${id}/counter`, { method: "POST" });
        count(drainStatuses, status);
        await res?.body?.cancel();
        const moved = movedAt.get(id);
        if (status === "200" && moved !== undefined && sent >= moved && !answeredElsewhere.has(id)) answeredElsewhere.set(id, performance.now());
        await sleep(drainPollMs);
      }
    }),
  );
  await sleep(500);
  const drainAt = performance.now();
  const { status: drainStatus, res: drainRes } = await call(0, `/v1/hosts/${drainHost}/drain`, { method: "POST" }, operator);
  if (drainStatus !== "202") throw new Error(`POST /v1/hosts/${drainHost}/drain: ${drainStatus} ${await drainRes?.text()}`);
  await drainRes!.arrayBuffer();
  const drainDeadline = drainAt + 60_000;
  while (answeredElsewhere.size < loaded.length && performance.now() < drainDeadline) await sleep(50);
  const drainDoneAt = performance.now();
  const allMovedAt = movedAt.size === loaded.length ? Math.max(...movedAt.values()) : NaN;
  stop = true;
  await Promise.all([load, watch]);
  const drainCalls = Object.values(drainStatuses).reduce((a, b) => a + b, 0);
  const drainFailed = drainCalls - (drainStatuses["200"] ?? 0);
  log(`drain of ${drainHost}: ${loaded.length} agents answered from other hosts after ${r0(drainDoneAt - drainAt)} ms (all moved in the database after ${r0(allMovedAt - drainAt)} ms); statuses ${JSON.stringify(drainStatuses)}`);

  const all = sortNum(answered);
  const boots = sortNum(firstBoots);
  const failed = Object.entries(statuses)
    .filter(([s]) => s !== "200" && s !== "503")
    .reduce((a, [, n]) => a + n, 0);
  const bootP50 = percentile(boots, 50);
  const result = {
    rounds,
    agents_per_round: agentsPerHost * hostIds.length,
    agents_per_host: agentsPerHost,
    lease_ms: leaseMs,
    heartbeat_ms: heartbeatMs,
    poll_ms: failoverPollMs,
    victims: victimsTotal,
    spreads,
    death_to_answer_ms: { p50: r0(percentile(all, 50)), p99: r0(percentile(all, 99)), max: r0(all.at(-1) ?? NaN), min: r0(all[0] ?? NaN) },
    per_round_p50s: perRoundP50s,
    statuses_during_failover: statuses,
    failed_calls_during_failover: failed,
    unanswered,
    failover_boot_ms_p50: r0(percentile(sortNum(failoverBoots), 50)),
    drain: {
      host: drainHost,
      agents: loaded.length,
      calls: drainCalls,
      failed: drainFailed,
      statuses: drainStatuses,
      ms: r0(drainDoneAt - drainAt),
      moved_ms: r0(allMovedAt - drainAt),
      complete: answeredElsewhere.size === loaded.length,
    },
    reference: { lease_ms: leaseMs, boot_ms_p50: r0(bootP50), floor_ms: r0(leaseMs + bootP50), boots: boots.length },
    failover_seconds: Math.round(failoverSeconds),
    loadavg_start: loadStart.map((x) => Math.round(x * 100) / 100),
    loadavg_end: loadavg().map((x) => Math.round(x * 100) / 100),
  };
  await cleanUp();
  console.log(`RESULT ${JSON.stringify(result)}`);
  if (failed > 0 || unanswered > 0 || drainFailed > 0 || !result.drain.complete) process.exitCode = 1;
}

main().catch(async (err: unknown) => {
  if (interrupted) return; // what failed is the children being stopped: the signal's handler ends the process
  console.error(err instanceof Error ? (err.stack ?? err.message) : String(err));
  await cleanUp().catch(() => undefined);
  process.exit(1);
});

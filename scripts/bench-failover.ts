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
// Its parts are in bench/failover/: the system of child processes, the caller, the rounds of kill -9, the drain, the flags.
import { mkdtempSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { int } from "../lib/env.ts";
import { BenchClient } from "./bench/failover/client.ts";
import { Cluster, hostIds, log } from "./bench/failover/cluster.ts";
import { drainUnderLoad } from "./bench/failover/drain.ts";
import { flagsOverEnv } from "./bench/failover/flags.ts";
import { failoverPollMs, killRounds } from "./bench/failover/rounds.ts";
import { percentile, printResult } from "./bench/figures.ts";

const env = flagsOverEnv(process.argv.slice(2), process.env);
const rounds = int(env, "BENCH_ROUNDS", 10, { min: 1, max: 1000 });
const agentsPerHost = int(env, "BENCH_AGENTS_PER_HOST", 10, { min: 2, max: 200 });
const leaseMs = int(env, "BENCH_LEASE_MS", 2000, { min: 1000 });
const heartbeatMs = int(env, "BENCH_HEARTBEAT_MS", 250, { min: 100 });
const answerTimeoutMs = int(env, "BENCH_ANSWER_TIMEOUT_MS", 30_000, { min: 1000 });

const root = fileURLToPath(new URL("..", import.meta.url));
const work = mkdtempSync(join(tmpdir(), "agentvm-bench-failover-"));
const cluster = new Cluster({ root, work, leaseMs, heartbeatMs });

let interrupted = false;
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    interrupted = true;
    log(`${signal}: stopping every child`);
    void cluster.cleanUp().finally(() => process.exit(130));
  });
}

async function main(): Promise<void> {
  const loadStart = loadavg();
  const { token, operator } = await cluster.start();
  log(`3 hosts, 2 gateways up; ${rounds} rounds of ${agentsPerHost * 3} agents, lease ${leaseMs} ms, heartbeat ${heartbeatMs} ms`);
  const client = new BenchClient({ gateways: cluster.gateways, token, db: cluster.db });

  const firstBoots: number[] = [];
  const { failoverBoots, answered, perRoundP50s, statuses, spreads, unanswered, victimsTotal, failoverSeconds } = await killRounds(
    cluster,
    client,
    { rounds, agentsPerHost, answerTimeoutMs },
    firstBoots,
  );

  // The drain: a steady load on one host's agents while an operator drains it.
  const drain = await drainUnderLoad(client, operator, agentsPerHost, firstBoots);

  const all = [...answered].sort((a, b) => a - b);
  const boots = firstBoots;
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
    death_to_answer_ms: {
      p50: Math.round(percentile(all, 50)),
      p99: Math.round(percentile(all, 99)),
      max: Math.round(all.at(-1) ?? NaN),
      min: Math.round(all[0] ?? NaN),
    },
    per_round_p50s: perRoundP50s,
    statuses_during_failover: statuses,
    failed_calls_during_failover: failed,
    unanswered,
    failover_boot_ms_p50: Math.round(percentile(failoverBoots, 50)),
    drain: drain.result,
    reference: { lease_ms: leaseMs, boot_ms_p50: Math.round(bootP50), floor_ms: Math.round(leaseMs + bootP50), boots: boots.length },
    failover_seconds: Math.round(failoverSeconds),
    loadavg_start: loadStart.map((x) => Math.round(x * 100) / 100),
    loadavg_end: loadavg().map((x) => Math.round(x * 100) / 100),
  };
  await cluster.cleanUp();
  printResult(result);
  if (failed > 0 || unanswered > 0 || drain.failed > 0 || !result.drain.complete) process.exitCode = 1;
}

main().catch(async (err: unknown) => {
  if (interrupted) return; // what failed is the children being stopped: the signal's handler ends the process
  console.error(err instanceof Error ? (err.stack ?? err.message) : String(err));
  await cluster.cleanUp().catch(() => undefined);
  process.exit(1);
});

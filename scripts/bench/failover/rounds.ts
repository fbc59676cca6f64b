// bench:failover's rounds: the host holding the most agents killed with SIGKILL, its agents called until each answers again from another host.
import { percentile } from "../figures.ts";
import { setTimeout as sleep } from "node:timers/promises";
import type { BenchClient } from "./client.ts";
import { bootMs, count } from "./client.ts";
import { hostIds, log, type Cluster } from "./cluster.ts";

/** How often each of a dead host's agents is called until it answers 200, ms. */
export const failoverPollMs = 100;
/**
 * How long a gateway keeps a host it failed to connect to out of placement before probing it again (the placement's
 * default `probeTtlMs`, gateway/placement.ts): a restarted host takes new agents only after that since the last call
 * that found it dead, so each round waits it out to start with 3 hosts again.
 */
const gatewayProbeTtlMs = 5000;

export interface RoundsOptions {
  rounds: number;
  agentsPerHost: number;
  /** An agent not answering 200 this long after the kill counts as unanswered, ms. */
  answerTimeoutMs: number;
}

/**
 * Each round: agents-per-host × 3 agents created and called once, half of the victim host's hibernated, the host
 * killed, its agents called alternately through both gateways until each answers 200; then the host is started again
 * and the round's agents deleted. `firstBoots` gets every cold boot's duration (the reference's boots).
 */
export async function killRounds(cluster: Cluster, client: BenchClient, opts: RoundsOptions, firstBoots: number[]) {
  const { rounds, agentsPerHost, answerTimeoutMs } = opts;
  const failoverBoots: number[] = [];
  const answered: number[] = [];
  const perRoundP50s: number[] = [];
  const statuses: Record<string, number> = {};
  const spreads: number[][] = [];
  let unanswered = 0;
  let victimsTotal = 0;
  const t0 = performance.now();

  for (let round = 1; round <= rounds; round++) {
    const { ids, byHost } = await client.createAndWake(agentsPerHost * hostIds.length, firstBoots);
    spreads.push(hostIds.map((h) => byHost.get(h)!.length));
    // The host with the most agents; among equals each round another one, so every host dies and comes back.
    const n = hostIds.length;
    const turn = (h: string) => (hostIds.indexOf(h as (typeof hostIds)[number]) - (round % n) + n) % n;
    const [victimHost, victims] = [...byHost.entries()].sort((a, b) => b[1].length - a[1].length || turn(a[0]) - turn(b[0]))[0]!;
    for (const id of victims.slice(0, Math.ceil(victims.length / 2))) {
      const { status, res } = await client.call(0, `/v1/agents/${id}/hibernate`, { method: "POST" });
      if (status !== "200") throw new Error(`hibernate ${id}: ${status} ${await res?.text()}`);
      await res!.arrayBuffer();
    }

    const roundStatuses: Record<string, number> = {};
    const roundAnswered: number[] = [];
    const killedAt = performance.now();
    let lastRefusedAt = killedAt;
    cluster.killHost(victimHost);
    await Promise.all(
      victims.map(async (id, i) => {
        for (let attempt = 0; ; attempt++) {
          const { status, res } = await client.call(i + attempt, `/a/${id}/counter`, { method: "POST" });
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
    const sorted = [...roundAnswered].sort((a, b) => a - b);
    perRoundP50s.push(Math.round(percentile(sorted, 50)));
    log(
      `round ${round}/${rounds}: spread ${spreads.at(-1)!.join("/")}, killed ${victimHost} (${victims.length} agents, ${Math.ceil(victims.length / 2)} hibernated): ` +
        `answered again after p50 ${Math.round(percentile(sorted, 50))} ms, max ${Math.round(sorted.at(-1) ?? NaN)} ms; statuses ${JSON.stringify(roundStatuses)}`,
    );

    await cluster.startHost(victimHost);
    await client.deleteAll(ids);
    await sleep(Math.max(0, lastRefusedAt + gatewayProbeTtlMs + 500 - performance.now()));
  }
  const failoverSeconds = (performance.now() - t0) / 1000;
  return { failoverBoots, answered, perRoundP50s, statuses, spreads, unanswered, victimsTotal, failoverSeconds };
}

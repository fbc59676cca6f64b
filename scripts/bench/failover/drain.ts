// bench:failover's drain: a steady load on one host's agents while an operator drains it, until each answered from another host.
import { setTimeout as sleep } from "node:timers/promises";
import type { BenchClient } from "./client.ts";
import { count } from "./client.ts";
import { hostIds, log } from "./cluster.ts";

/** How often each loaded agent is called during the drain, ms. */
const drainPollMs = 150;

/** Creates a round's worth of agents, loads the host holding the most, drains it (`POST /v1/hosts/{id}/drain`, as `operator`) and waits (60 s at most) until every loaded agent answered from another host. */
export async function drainUnderLoad(client: BenchClient, operator: string, agentsPerHost: number, firstBoots: number[]) {
  const { byHost } = await client.createAndWake(agentsPerHost * hostIds.length, firstBoots);
  const [drainHost, loaded] = [...byHost.entries()].sort((a, b) => b[1].length - a[1].length)[0]!;
  const drainStatuses: Record<string, number> = {};
  /** Per loaded agent: when the database first showed it on another host, and when it then answered 200. */
  const movedAt = new Map<string, number>();
  const answeredElsewhere = new Map<string, number>();
  let stop = false;
  const watch = (async () => {
    while (!stop) {
      const now = performance.now();
      for (const [id, host] of await client.hostsOf(loaded)) if (host !== drainHost && !movedAt.has(id)) movedAt.set(id, now);
      await sleep(50);
    }
  })();
  const load = Promise.all(
    loaded.map(async (id, i) => {
      for (let attempt = 0; !stop; attempt++) {
        const sent = performance.now();
        const { status, res } = await client.call(i + attempt, `/a/${id}/counter`, { method: "POST" });
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
  const { status: drainStatus, res: drainRes } = await client.call(0, `/v1/hosts/${drainHost}/drain`, { method: "POST" }, operator);
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
  log(
    `drain of ${drainHost}: ${loaded.length} agents answered from other hosts after ${Math.round(drainDoneAt - drainAt)} ms (all moved in the database after ${Math.round(allMovedAt - drainAt)} ms); statuses ${JSON.stringify(drainStatuses)}`,
  );
  return {
    failed: drainFailed,
    result: {
      host: drainHost,
      agents: loaded.length,
      calls: drainCalls,
      failed: drainFailed,
      statuses: drainStatuses,
      ms: Math.round(drainDoneAt - drainAt),
      moved_ms: Math.round(allMovedAt - drainAt),
      complete: answeredElsewhere.size === loaded.length,
    },
  };
}

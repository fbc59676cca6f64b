// bench:scale's steps through the API: registering agents, clones woken once and hibernated (while the disk allows), the awake ones' trickle of calls, and wakes of random sleeping agents.
import { AppError } from "../../../lib/errors.ts";
import { percentile } from "../figures.ts";
import { callAgent, createAgent, hibernateAgent, pool, type Api } from "./api.ts";
import { freeBytes, MiB, r1 } from "./measure.ts";

/** Creates `count` agents `concurrency` at a time (a database row each): their ids and each create's time. */
export async function registerAgents(api: Api, count: number, memMiB: number, concurrency: number, say: (line: string) => void) {
  const ids: string[] = new Array(count);
  const ms: number[] = [];
  const t0 = performance.now();
  await pool(count, concurrency, async (i) => {
    const c0 = performance.now();
    ids[i] = await createAgent(api, { name: `scale-${String(i).padStart(5, "0")}`, memMiB, idleTimeoutMs: 3_600_000 });
    ms.push(performance.now() - c0);
    if ((i + 1) % 1000 === 0) say(`registered ${i + 1}/${count}`);
  });
  const totalS = (performance.now() - t0) / 1000;
  return { ids, createP50Ms: r1(percentile(ms, 50)), createP99Ms: r1(percentile(ms, 99)), perSecond: Math.round(count / totalS), totalS: r1(totalS) };
}

/** Each awake agent's GET every `everyMs` (staggered) through the proxy: latencies and failures while it runs. */
export class Trickle {
  readonly latencies: number[] = [];
  failures = 0;
  lastError: string | undefined;
  private readonly timers: NodeJS.Timeout[] = [];
  private readonly api: Api;
  private readonly everyMs: number;
  constructor(api: Api, everyMs: number) {
    this.api = api;
    this.everyMs = everyMs;
  }
  add(id: string): void {
    const tick = async () => {
      try {
        const r = await callAgent(this.api, id, 60_000);
        if (r.status !== 200) throw new AppError("bad_gateway", `${r.status} ${r.text.slice(0, 200)}`);
        this.latencies.push(r.firstByteMs);
      } catch (err) {
        this.failures++;
        this.lastError = (err as Error).message;
      }
    };
    this.timers.push(
      setTimeout(() => {
        void tick();
        this.timers.push(setInterval(() => void tick(), this.everyMs));
      }, Math.random() * this.everyMs),
    );
  }
  stop(): void {
    for (const t of this.timers) clearTimeout(t);
    this.timers.length = 0;
  }
}

/** Wakes one agent (a call) and hibernates it through the API: its first call's time and wake kind. */
export async function wakeAndHibernate(api: Api, id: string) {
  const r = await callAgent(api, id);
  if (r.status !== 200) throw new AppError("bad_gateway", `call to ${id}: ${r.status} ${r.text.slice(0, 300)}`);
  const h0 = performance.now();
  await hibernateAgent(api, id);
  return { ...r, hibernateMs: performance.now() - h0 };
}

/**
 * Wakes and hibernates `ids[from..to)`, `concurrency` at a time, while every dir of `diskDirs` keeps more than
 * `marginBytes + reserveBytes` free: how many did, and why it stopped early if it did.
 */
export async function hibernateMany(
  api: Api,
  ids: string[],
  from: number,
  to: number,
  opts: { concurrency: number; diskDirs: string[]; marginBytes: number; reserveBytes: number; say: (line: string) => void; interrupted: () => boolean },
) {
  let stoppedBecause: string | undefined;
  let done = 0;
  const firstMs: number[] = [];
  const hibernateMs: number[] = [];
  const wakes: Record<string, number> = {};
  let lastFree = Infinity;
  let checkedAt = 0;
  const full = () => {
    if (opts.interrupted()) stoppedBecause ??= "interrupted";
    return stoppedBecause !== undefined;
  };
  const t0 = performance.now();
  await pool(
    to - from,
    opts.concurrency,
    async (k) => {
      // Free space looked at every few agents (statfs is cheap, but the answer moves slowly).
      if (k - checkedAt >= 4 || k === 0) {
        checkedAt = k;
        lastFree = Math.min(...(await Promise.all(opts.diskDirs.map(freeBytes))));
        if (lastFree < opts.marginBytes + opts.reserveBytes) {
          stoppedBecause = `free space ${Math.round(lastFree / MiB)} MiB reached the margin (${Math.round(opts.marginBytes / MiB)} MiB + ${Math.round(opts.reserveBytes / MiB)} MiB for the wakes under way)`;
          return;
        }
      }
      const r = await wakeAndHibernate(api, ids[from + k]!);
      firstMs.push(r.firstByteMs);
      hibernateMs.push(r.hibernateMs);
      wakes[r.wake] = (wakes[r.wake] ?? 0) + 1;
      done++;
      if ((from + done) % 50 === 0)
        opts.say(
          `hibernated ${from + done}/${to} (last 50: first call p50 ${Math.round(percentile(firstMs.slice(-50), 50))} ms, hibernate p50 ${Math.round(percentile(hibernateMs.slice(-50), 50))} ms; free ${Math.round(lastFree / 2 ** 30)} GiB; ${r1((performance.now() - t0) / 1000)} s)`,
        );
    },
    full,
  );
  return {
    done,
    stoppedBecause,
    firstCallP50Ms: Math.round(percentile(firstMs, 50)),
    hibernateP50Ms: Math.round(percentile(hibernateMs, 50)),
    wakes,
  };
}

/**
 * `samples` wakes of a random sleeping agent among `ids`, one at a time, each hibernated again after: first byte
 * p50/p99, how they woke, and the same per sleep tier (a kept QEMU's wake and a new QEMU's differ by design).
 */
export async function wakeSamples(api: Api, ids: string[], samples: number) {
  const ms: number[] = [];
  const restoreMs: number[] = [];
  const wakes: Record<string, number> = {};
  const byTier: Record<string, number[]> = {};
  for (let s = 0; s < samples; s++) {
    const id = ids[Math.floor(Math.random() * ids.length)]!;
    const r = await wakeAndHibernate(api, id);
    ms.push(r.firstByteMs);
    if (r.restoreMs !== undefined) restoreMs.push(r.restoreMs);
    wakes[r.wake] = (wakes[r.wake] ?? 0) + 1;
    (byTier[r.tier ?? r.wake] ??= []).push(r.firstByteMs);
  }
  const tiers: Record<string, { n: number; p50: number; p99: number }> = {};
  for (const [tier, t] of Object.entries(byTier)) tiers[tier] = { n: t.length, p50: r1(percentile(t, 50)), p99: r1(percentile(t, 99)) };
  return {
    p50: r1(percentile(ms, 50)),
    p99: r1(percentile(ms, 99)),
    max: r1(Math.max(...ms)),
    restoreP50: restoreMs.length ? r1(percentile(restoreMs, 50)) : null,
    wakes,
    tiers,
    n: ms.length,
  };
}

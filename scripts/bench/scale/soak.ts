// bench:scale's soak: a few agents waking and sleeping for minutes under a steady trickle (a call, idle to hibernation, again); every call must answer 200; the host's RSS, fds and data dir sampled every 30 s, and whether they level off.
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { percentile } from "../figures.ts";
import { agentState, apiOf, callAgent, createAgent } from "./api.ts";
import { duBytes, machineState, MiB, r1, sampleHost, slope } from "./measure.ts";
import { startOnFs, type ScaleSetup } from "./setup.ts";

export interface SoakOptions {
  minutes: number;
  agents: number;
  memMiB: number;
  /** Each agent's idle timeout, ms: how soon the reaper puts it to sleep after its call. */
  idleMs: number;
  /** Sampling period, s. */
  sampleS: number;
}

interface Sample {
  atMin: number;
  rssMiB: number;
  fds: number;
  dataMiB: number;
  /** Of the data dir, the embedded database's rows (`<data dir>/db`; 0 on a Postgres server of its own). */
  dbMiB: number;
  qemus: number;
}

/** The slope of the second half's samples, per minute, and whether it levelled off (it grew less than `toleratedPerMin` a minute). */
function levelOff(samples: Sample[], key: "rssMiB" | "fds" | "dataMiB" | "dbMiB", toleratedPerMin: number) {
  const half = samples.slice(Math.floor(samples.length / 2));
  const s = slope(half.map((p) => ({ x: p.atMin, y: p[key] })));
  return { second_half_slope_per_min: Math.round(s * 100) / 100, levels_off: Number.isFinite(s) && s <= toleratedPerMin };
}

export async function runSoak(setup: ScaleSetup, o: SoakOptions) {
  const { say, cleanups } = setup;
  const { host, fsType, databaseIs } = await startOnFs(setup, "soak");
  const api = apiOf(host.url, host.token);
  const ids: string[] = [];
  for (let i = 0; i < o.agents; i++) ids.push(await createAgent(api, { name: `soak-${i}`, memMiB: o.memMiB, idleTimeoutMs: o.idleMs }));
  const callMs: number[] = [];
  let failed = 0;
  let lastFailure: string | undefined;
  const wakes: Record<string, number> = {};
  const samples: Sample[] = [];
  const t0 = performance.now();
  const endAt = t0 + o.minutes * 60_000;
  const sample = async () => {
    const h = await sampleHost(host, 3, 500);
    const s: Sample = {
      atMin: (performance.now() - t0) / 60_000,
      rssMiB: r1(h.rssKiB / 1024),
      fds: h.fds,
      dataMiB: Math.round(duBytes(host.dataDir) / MiB),
      dbMiB: Math.round(duBytes(join(host.dataDir, "db")) / MiB),
      qemus: h.qemus,
    };
    samples.push(s);
    say(
      `soak ${r1(s.atMin)} min: ${callMs.length} calls (${failed} failed), host RSS ${s.rssMiB} MiB, ${s.fds} fds, ${s.qemus} QEMUs, data dir ${s.dataMiB} MiB`,
    );
  };
  // Each agent: a call, then idle until the reaper hibernated it, again, until the end.
  const loop = async (id: string) => {
    while (performance.now() < endAt && !interrupted()) {
      try {
        const r = await callAgent(api, id);
        callMs.push(r.firstByteMs);
        wakes[r.wake] = (wakes[r.wake] ?? 0) + 1;
        if (r.status !== 200) {
          failed++;
          lastFailure = `${r.status} ${r.text.slice(0, 200)}`;
        }
      } catch (err) {
        failed++;
        lastFailure = (err as Error).message;
      }
      const waitUntil = performance.now() + o.idleMs + 30_000;
      while (performance.now() < waitUntil && performance.now() < endAt) {
        await sleep(500);
        if ((await agentState(api, id).catch(() => "")) === "hibernated") break;
      }
    }
  };
  const interrupted = () => cleanups.wasInterrupted;
  await sample();
  const sampler = setInterval(() => void sample(), o.sampleS * 1000);
  try {
    await Promise.all(ids.map(loop));
  } finally {
    clearInterval(sampler);
  }
  await sample();
  // The start: the first sample after the soak's first 30 s (the one at 0 s has the system's own start in it, PGlite's
  // allocation spike among others, which the next collection gives back).
  const first = samples[1] ?? samples[0]!;
  const last = samples.at(-1)!;
  return {
    soak_minutes: o.minutes,
    soak_agents: o.agents,
    soak_idle_ms: o.idleMs,
    soak_calls: callMs.length,
    soak_failed: failed,
    ...(lastFailure ? { soak_last_failure: lastFailure } : {}),
    soak_p50_ms: r1(percentile(callMs, 50)),
    soak_p99_ms: r1(percentile(callMs, 99)),
    soak_wakes: wakes,
    rss_mb_start: first.rssMiB,
    rss_mb_end: last.rssMiB,
    fds_start: first.fds,
    fds_end: last.fds,
    data_mib_start: first.dataMiB,
    data_mib_end: last.dataMiB,
    qemus_end: last.qemus,
    // Levels off: the second half grows less than 1 MiB of RSS, 0.5 fd and 1 MiB of data a minute.
    rss: levelOff(samples, "rssMiB", 1),
    fds: levelOff(samples, "fds", 0.5),
    data: levelOff(samples, "dataMiB", 1),
    // What of the data dir's growth is rows (runs, events, meter segments of every wake cycle): history, not a leak.
    db: levelOff(samples, "dbMiB", 1),
    samples,
    mem_mib: o.memMiB,
    fs: setup.fs,
    fs_is: fsType,
    database: setup.database,
    database_is: databaseIs,
    ...machineState(),
  };
}

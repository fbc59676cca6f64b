// bench:scale's main run: agents registered, some awake under a trickle, many woken once from the template and hibernated; the host's memory, fds and disk at 10 and at N sleeping, wakes among each, the list's pages and a quiet minute's CPU.
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { AppError } from "../../../lib/errors.ts";
import { percentile } from "../figures.ts";
import { apiOf, callAgent, pageAll, pool } from "./api.ts";
import { cpuSeconds } from "./host-process.ts";
import { describeHost, duBytes, hostFigures, machineState, MiB, r1, sampleHost, usedBytes, type HostSample } from "./measure.ts";
import { hibernateMany, registerAgents, Trickle, wakeAndHibernate, wakeSamples } from "./phases.ts";
import { startOnFs, type ScaleSetup } from "./setup.ts";

/** The host's CPU over `quietS` with no calls (the trickle stopped first, 5 s to settle): % of one core. */
async function quietCpu(pid: number, trickle: Trickle, quietS: number) {
  trickle.stop();
  await sleep(5000);
  const c0 = cpuSeconds(pid);
  const t0 = performance.now();
  await sleep(quietS * 1000);
  const cpuS = cpuSeconds(pid) - c0;
  const wallS = (performance.now() - t0) / 1000;
  return { cpuS: r1(cpuS), wallS: Math.round(wallS), pct: Math.round((cpuS / wallS) * 1000) / 10 };
}

export interface ScaleOptions {
  registered: number;
  hibernated: number;
  awake: number;
  memMiB: number;
  concurrency: number;
  trickleMs: number;
  wakeSamples: number;
  quietS: number;
}

/** The first measure point: this many agents asleep. */
const BASE = 10;

export async function runScale(setup: ScaleSetup, o: ScaleOptions) {
  const { say, cleanups } = setup;
  const { host, diskDirs, fsType, databaseIs } = await startOnFs(setup, setup.fs);
  const api = apiOf(host.url, host.token);
  const hostsDir = join(host.dataDir, "hosts");
  const interrupted = () => cleanups.wasInterrupted;

  // 1. Registered: a database row each, created concurrently through the API.
  const reg = await registerAgents(api, o.registered, o.memMiB, 16, say);
  say(`registered ${o.registered} agents in ${reg.totalS} s (${reg.perSecond}/s; create p50 ${reg.createP50Ms} ms, p99 ${reg.createP99Ms} ms)`);
  if (o.registered < o.awake + o.hibernated) throw new AppError("bad_request", "--registered must be at least --awake + --hibernated");
  const awakeIds = reg.ids.slice(0, o.awake);
  const sleepIds = reg.ids.slice(o.awake, o.awake + o.hibernated);

  // 2. The first wake builds the template (a cold boot); every later one is a clone of it.
  const t0 = performance.now();
  const first = await wakeAndHibernate(api, sleepIds[0]!);
  say(
    `first agent woke (${first.wake}, the template built beside it) in ${Math.round(first.firstByteMs)} ms; hibernated in ${Math.round(first.hibernateMs)} ms (${Math.round(performance.now() - t0)} ms)`,
  );

  // 3. The awake agents, each taking a GET every trickleMs.
  const trickle = new Trickle(api, o.trickleMs);
  cleanups.push(async () => trickle.stop());
  await pool(o.awake, 2, async (i) => {
    const id = awakeIds[i]!;
    const r = await callAgent(api, id);
    if (r.status !== 200) throw new AppError("bad_gateway", `awake agent ${id}: ${r.status} ${r.text.slice(0, 200)}`);
    trickle.add(id);
  });
  say(`${o.awake} agents awake, each a GET every ${o.trickleMs} ms`);

  // 4. BASE asleep: the first measure point.
  const reserveBytes = o.concurrency * o.memMiB * MiB * 2;
  const opts = { concurrency: o.concurrency, diskDirs, marginBytes: setup.marginBytes, reserveBytes, say, interrupted };
  const base = Math.min(BASE, o.hibernated);
  const h1 = await hibernateMany(api, sleepIds, 1, base, opts);
  if (h1.stoppedBecause) throw new AppError("internal", `could not hibernate ${base} agents: ${h1.stoppedBecause}`);
  const wakeBase = await wakeSamples(api, sleepIds.slice(0, base), o.wakeSamples);
  say(`wake among ${base}: p50 ${wakeBase.p50} ms, p99 ${wakeBase.p99} ms (${JSON.stringify(wakeBase.tiers)}, restore p50 ${wakeBase.restoreP50} ms)`);
  await sleep(5000);
  const atBase = await sampleHost(host);
  const duBase = duBytes(hostsDir);
  const usedBase = await usedBytes(diskDirs[0]!);
  say(`at ${base} asleep: ${describeHost(atBase, duBase)}`);

  const quietBase = await quietCpu(host.pid, trickle, o.quietS);
  for (const id of awakeIds) trickle.add(id);
  say(`quiet ${quietBase.wallS} s at ${base} asleep: the host used ${quietBase.cpuS} CPU s = ${quietBase.pct} % of a core`);

  // 5. Up to N asleep, while the disk allows, with a sample half-way: past it the kept tier is full (its QEMUs are
  // bounded by their budget, not by the agents asleep), so what grows from there on is what each sleeping agent costs.
  // (A run too small to have a half beyond the first point goes straight to N.)
  const half = Math.floor(o.hibernated / 2);
  const sampleHalf = half > base;
  const h2a = await hibernateMany(api, sleepIds, base, sampleHalf ? half : o.hibernated, opts);
  let atHalf: HostSample | undefined;
  let h2b: Awaited<ReturnType<typeof hibernateMany>> | undefined;
  if (sampleHalf && !h2a.stoppedBecause) {
    await sleep(5000);
    atHalf = await sampleHost(host);
    say(`at ${half} asleep: ${describeHost(atHalf)}`);
    h2b = await hibernateMany(api, sleepIds, half, o.hibernated, opts);
  }
  const wakes = { ...h2a.wakes };
  for (const [kind, count] of Object.entries(h2b?.wakes ?? {})) wakes[kind] = (wakes[kind] ?? 0) + count;
  const h2 = {
    done: h2a.done + (h2b?.done ?? 0),
    stoppedBecause: h2b ? h2b.stoppedBecause : h2a.stoppedBecause,
    firstCallP50Ms: h2b?.firstCallP50Ms || h2a.firstCallP50Ms,
    hibernateP50Ms: h2b?.hibernateP50Ms || h2a.hibernateP50Ms,
    wakes,
  };
  const n = base + h2.done;
  if (h2.stoppedBecause) say(`stopped at ${n}/${o.hibernated} asleep: ${h2.stoppedBecause}`);
  const sleeping = sleepIds.slice(0, n);
  await sleep(5000);
  const atN = await sampleHost(host);
  const duN = duBytes(hostsDir);
  const usedN = await usedBytes(diskDirs[0]!);
  say(`at ${n} asleep: ${describeHost(atN, duN)}`);
  const wakeN = await wakeSamples(api, sleeping, o.wakeSamples);
  say(`wake among ${n}: p50 ${wakeN.p50} ms, p99 ${wakeN.p99} ms (${JSON.stringify(wakeN.tiers)}, restore p50 ${wakeN.restoreP50} ms)`);

  // 6. The API's list, a page of 100 at a time through every agent.
  const pages = await pageAll(api, 100);
  if (pages.seen < o.registered) throw new AppError("internal", `the list showed ${pages.seen} of ${o.registered} agents`);
  const pageP50 = r1(percentile(pages.pageMs, 50));
  const pageP99 = r1(percentile(pages.pageMs, 99));
  say(`listed ${pages.seen} agents in ${pages.pageMs.length} pages: p50 ${pageP50} ms, p99 ${pageP99} ms per page`);

  // 7. A quiet minute: no calls; the host's reaper and heartbeat (and whatever else runs idle) over every agent.
  const quietN = await quietCpu(host.pid, trickle, o.quietS);
  const reaperCpuPct = quietN.pct;
  const quietWallS = quietN.wallS;
  say(`quiet ${quietN.wallS} s at ${n} asleep: the host used ${quietN.cpuS} CPU s = ${quietN.pct} % of a core`);

  const machine = machineState();
  const grown = n - base;
  const per = (a: HostSample, b: HostSample, k: keyof HostSample) => (grown > 0 ? (b[k] - a[k]) / grown : NaN);
  const rssPer = r1(per(atBase, atN, "rssKiB"));
  const heapPer = r1(per(atBase, atN, "heapKiB"));
  const grownSecond = n - half;
  const perSecond = (k: keyof HostSample) => (atHalf && grownSecond > 0 ? r1((atN[k] - atHalf[k]) / grownSecond) : null);
  const fdsPer = Math.round(per(atBase, atN, "fds") * 1000) / 1000;
  const duPer = grown > 0 ? r1((duN - duBase) / grown / MiB) : NaN;
  const statfsPer = grown > 0 ? r1((usedN - usedBase) / grown / MiB) : NaN;
  const ratio = Math.round((wakeN.p99 / wakeBase.p99) * 100) / 100;
  // Tier for tier: what the number of sleeping agents costs a wake, apart from which tier the wakes came from (among 10
  // every agent fits the kept tier, among 1,000 most cannot). A tier counts with at least 5 wakes at both sizes.
  const sameTier: Record<string, number> = {};
  for (const [tier, t] of Object.entries(wakeN.tiers)) {
    const b = wakeBase.tiers[tier];
    if (b && b.n >= 5 && t.n >= 5) sameTier[tier] = Math.round((t.p99 / b.p99) * 100) / 100;
  }
  return {
    registered_agents: o.registered,
    hibernated_agents: n,
    hibernated_asked: o.hibernated,
    ...(h2.stoppedBecause ? { hibernated_stopped_because: h2.stoppedBecause } : {}),
    awake_agents: o.awake,
    mem_mib: o.memMiB,
    rss_kb_per_hibernated_agent: rssPer,
    heap_kb_per_hibernated_agent: heapPer,
    external_kb_per_hibernated_agent: r1(per(atBase, atN, "externalKiB")),
    // From half-way to N: the kept tier full at both ends, so neither its QEMUs nor the first wakes' warm-up count.
    second_half: atHalf
      ? {
          from: half,
          to: n,
          rss_kb_per_agent: perSecond("rssKiB"),
          heap_kb_per_agent: perSecond("heapKiB"),
          fds_per_agent: perSecond("fds"),
          qemus: [atHalf.qemus, atN.qemus],
        }
      : null,
    fds_per_hibernated_agent: fdsPer,
    // On the loop image only this system writes, and statfs counts a block the clones share with the template once
    // (du counts it in every file); on the machine's shared disk statfs sees others' writes, and ext4 shares nothing.
    disk_mib_per_hibernated_agent: setup.fs === "xfs" ? statfsPer : duPer,
    disk_mib_per_hibernated_agent_is:
      setup.fs === "xfs"
        ? `statfs: the loop filesystem's used space at ${n} asleep minus at ${base}, per agent (shared blocks once)`
        : `du (allocated blocks) of the hosts' vms dirs at ${n} asleep minus at ${base}, per agent`,
    disk_du_mib_per_hibernated_agent: duPer,
    disk_statfs_mib_per_hibernated_agent: statfsPer,
    wake_p50_ms_among_n: wakeN.p50,
    wake_p99_ms_among_n: wakeN.p99,
    wake_p50_ms_among_10: wakeBase.p50,
    wake_p99_ms_among_10: wakeBase.p99,
    wake_p99_ratio: ratio,
    wake_p99_ratio_is:
      "among N against among 10, whatever tier each wake came from (wake_tiers); QEMU_PRESTART=false makes every wake a files-tier one at both sizes",
    wake_p99_ratio_by_tier: sameTier,
    wake_kinds: { among_n: wakeN.wakes, among_10: wakeBase.wakes },
    wake_tiers: { among_n: wakeN.tiers, among_10: wakeBase.tiers },
    wake_restore_p50_ms: { among_n: wakeN.restoreP50, among_10: wakeBase.restoreP50 },
    wake_samples: o.wakeSamples,
    api_page_p50_ms: pageP50,
    api_page_p99_ms: pageP99,
    api_pages: pages.pageMs.length,
    reaper_cpu_pct: reaperCpuPct,
    reaper_cpu_pct_at_10: quietBase.pct,
    reaper_cpu_is: `the host process's CPU (utime+stime) over ${Math.round(quietWallS)} quiet s with ${o.registered} agents (${o.awake} awake, no calls), % of one core`,
    register: { per_s: reg.perSecond, create_p50_ms: reg.createP50Ms, create_p99_ms: reg.createP99Ms, total_s: reg.totalS },
    clone_wake_hibernate: {
      first_call_p50_ms: h2.firstCallP50Ms || h1.firstCallP50Ms,
      hibernate_p50_ms: h2.hibernateP50Ms || h1.hibernateP50Ms,
      wakes: h2.wakes,
    },
    trickle: {
      calls: trickle.latencies.length,
      failed: trickle.failures,
      p50_ms: r1(percentile(trickle.latencies, 50)),
      p99_ms: r1(percentile(trickle.latencies, 99)),
      ...(trickle.lastError ? { last_error: trickle.lastError } : {}),
    },
    host_at_10: hostFigures(atBase, duBase),
    host_at_n: hostFigures(atN, duN),
    fs: setup.fs,
    fs_is: fsType,
    database: setup.database,
    database_is: databaseIs,
    ...machine,
  };
}

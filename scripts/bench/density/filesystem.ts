// bench:density on one filesystem: its data dir (a mkdtemp, or an XFS loop image), the cold reference, the template and its clones awake, then asleep.
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { reflinkSupported } from "../../../fleet-agent/drivers/common/cow-copy.ts";
import { smallCowExtents } from "../../../fleet-agent/drivers/common/cow-extent.ts";
import type { VmSpec } from "../../../fleet-agent/drivers/driver.ts";
import { AppError } from "../../../lib/errors.ts";
import { newId } from "../../../lib/ids.ts";
import { mountXfsLoop, type XfsLoop } from "../../xfs-loop.ts";
import { percentile } from "../figures.ts";
import { buildTemplate, createClones } from "./clones.ts";
import { coldReference } from "./cold-reference.ts";
import { cpuOver, memorySum, mib, r1 } from "./measure.ts";
import { MEM_MIB, type DensityRun } from "./run.ts";
import { hibernateClones } from "./sleeping-disk.ts";

export type FsResult = Awaited<ReturnType<typeof benchOne>>;

export async function benchOne(run: DensityRun, fs: "ext4" | "xfs") {
  const { say, cleanups, agents, coldCount, trickleMs, settleS } = run;
  const base = mkdtempSync(join(tmpdir(), `bench-density-${fs}-`));
  cleanups.push(async () => rmSync(base, { recursive: true, force: true }));
  let dataDir = join(base, "data");
  if (fs === "xfs") {
    const xfs: XfsLoop = await mountXfsLoop(base, { sizeMiB: 16384, log: say });
    cleanups.push(() => xfs.unmount());
    dataDir = xfs.mount;
  }
  mkdirSync(dataDir, { recursive: true });
  const reflinks = await reflinkSupported(dataDir);
  say(`${fs}: data dir ${dataDir} (reflinks ${reflinks ? "yes" : "no"})`);
  // As a host does at start (drivers/select.ts): on XFS, 4 KiB copy-on-write extents for what is made under the data dir.
  if (reflinks) say(`${fs}: copy-on-write extent hint ${JSON.stringify(await smallCowExtents(dataDir))}`);
  const vmDir = (name: string) => join(dataDir, "vms", name);
  const specOf = (name: string): VmSpec => ({
    vmId: newId("vm"),
    agentId: newId("agent"),
    image: "demo",
    vcpus: 1,
    memMiB: MEM_MIB,
    allowEgress: false,
    stateDir: vmDir(name),
  });

  // The reference: independent agents, each booted cold (a driver without templates), measured side by side.
  const { coldMs, coldMem, coldCpu } = await coldReference(run, fs, specOf);

  // The template: the first VM of its kind boots cold and the template is built beside it.
  const { driver, specs, templateBuildMs, tpl, templateAllocated } = await buildTemplate(run, fs, dataDir, specOf);

  // N clones, one after another, each kept awake by the trickle.
  const { trickle, bootMs, readyMs, clones, notCloned, stoppedBecause, cpuAt } = await createClones(run, fs, driver, specs, specOf);
  const n = clones.length;
  if (n === 0) throw new AppError("internal", `no clone could be created: ${stoppedBecause}`);
  say(`${fs}: all ${n} awake; trickle every ${trickleMs} ms; measuring memory after ${settleS} s`);
  await sleep(settleS * 1000);
  cleanups.checkInterrupted();
  const cloneMem = memorySum(clones.map((c) => c.vm));
  const cloneCpu = await cpuOver(clones.map((c) => c.vm.pid!).filter(Boolean), 5000);
  const trickleP50 = percentile(trickle.latencies, 50);
  const trickleP99 = percentile(trickle.latencies, 99);
  const referencePssKiB = (coldMem.pssKiB / coldMem.counted) * n;
  const memoryRatio = cloneMem.pssKiB / referencePssKiB;
  say(
    `${fs}: ${cloneMem.counted} clones: PSS ${mib(cloneMem.pssKiB * 1024)} MiB (RSS ${mib(cloneMem.rssKiB * 1024)} MiB) vs ${n} independent agents ≈ ${mib(referencePssKiB * 1024)} MiB (${coldCount} cold agents' PSS scaled ×${r1(n / coldCount)}): ratio ${memoryRatio.toFixed(3)}`,
  );
  say(
    `${fs}: the QEMUs keep ${cloneCpu.cpuCores} cores busy (load ${cloneCpu.load1}); trickle calls ${trickle.latencies.length}, p50 ${r1(trickleP50)} ms, p99 ${r1(trickleP99)} ms, ${trickle.failures} failed${trickle.lastError ? ` (${trickle.lastError})` : ""}`,
  );

  const asleep = await hibernateClones(run, fs, dataDir, driver, clones, trickle);

  await cleanups.runAll(); // this filesystem's VMs, template, mount and temp dir
  const p50 = percentile(readyMs, 50);
  return {
    fs,
    reflinks,
    agents,
    fitted: n,
    ...(stoppedBecause ? { stoppedBecause } : {}),
    cpuCoresBusyAt: cpuAt,
    cold: coldCount,
    notCloned,
    templateBuildMs: Math.round(templateBuildMs),
    templateColdBootMs: tpl.bootMs,
    templateAllocatedMiB: mib(templateAllocated),
    coldReadyMs: { p50: Math.round(percentile(coldMs, 50)), max: Math.round(Math.max(...coldMs)) },
    cloneBootMs: { p50: Math.round(percentile(bootMs, 50)), p99: Math.round(percentile(bootMs, 99)) },
    cloneReadyMs: { p50: Math.round(p50), p99: Math.round(percentile(readyMs, 99)), last10p50: Math.round(percentile(readyMs.slice(-10), 50)) },
    memory: {
      clonesPssMiB: mib(cloneMem.pssKiB * 1024),
      clonesRssMiB: mib(cloneMem.rssKiB * 1024),
      perClonePssMiB: mib((cloneMem.pssKiB * 1024) / cloneMem.counted),
      coldPerAgentPssMiB: mib((coldMem.pssKiB * 1024) / coldMem.counted),
      independentPssMiB: mib(referencePssKiB * 1024),
      independentIs: `the PSS of ${coldCount} cold-booted agents scaled to ${n}`,
      ratio: Math.round(memoryRatio * 1000) / 1000,
    },
    cpu: { clonesCores: cloneCpu.cpuCores, coldCores: coldCpu.cpuCores, load1: cloneCpu.load1 },
    trickle: { calls: trickle.latencies.length, failures: trickle.failures, p50Ms: r1(trickleP50), p99Ms: r1(trickleP99) },
    diskPerSleepingCloneMiB: asleep.diskPerSleepingCloneMiB,
    hibernate: asleep.hibernate,
  };
}

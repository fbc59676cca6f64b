// `npm run bench:density`: many agents of one image from a warm template (qemu driver, file-backed RAM), against
// independently cold-booted agents: time to create each, host memory (sum of PSS) while all are awake under a trickle
// of calls, and the disk each sleeping clone adds beyond the template, on this machine's filesystem and on XFS with
// reflinks (a loop image, scripts/xfs-loop.ts). Options: --agents N (50), --cold N (5: cold-booted agents for the
// reference, scaled to N), --fs ext4|xfs|both (both; `ext4` means the machine's own filesystem under a mkdtemp),
// --trickle-ms MS (2000: each clone's GET /counter period), --settle-s S (10: awake time before memory is measured),
// --give-up-ms MS (20000: stop creating clones once one takes longer to answer, or fails: the machine is full; the
// figures are then of the clones that fitted, and the RESULT says so),
// --accel auto|kvm|tcg, --data-dir DIR (where the guest image is built). Prints progress, then one `RESULT {json}`.
import { mkdirSync, mkdtempSync, readdirSync, rmSync, statSync } from "node:fs";
import { statfs } from "node:fs/promises";
import { availableParallelism, loadavg, tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";
import { AppError } from "../lib/errors.ts";
import { newId } from "../lib/ids.ts";
import { silentLogger } from "../lib/log.ts";
import { reflinkSupported } from "../fleet-agent/drivers/common/cow-copy.ts";
import { readCpuSeconds, readMemoryKiB } from "../fleet-agent/drivers/common/proc.ts";
import type { RunningVm, VmSpec } from "../fleet-agent/drivers/driver.ts";
import { QemuDriver } from "../fleet-agent/drivers/qemu/driver.ts";
import { ensureGuestImage, type GuestImage } from "../fleet-agent/guest/build-image.ts";
import { mountXfsLoop, type XfsLoop } from "./xfs-loop.ts";
import { smallCowExtents } from "../fleet-agent/drivers/common/cow-extent.ts";

const { values } = parseArgs({
  options: {
    agents: { type: "string", default: "50" },
    cold: { type: "string", default: "5" },
    fs: { type: "string", default: "both" },
    "trickle-ms": { type: "string", default: "2000" },
    "settle-s": { type: "string", default: "10" },
    "give-up-ms": { type: "string", default: "20000" },
    accel: { type: "string", default: "auto" },
    "data-dir": { type: "string", default: join(import.meta.dirname, "..", ".data") },
  },
});
const agents = Number(values.agents);
const coldCount = Number(values.cold);
const trickleMs = Number(values["trickle-ms"]);
const settleS = Number(values["settle-s"]);
const giveUpMs = Number(values["give-up-ms"]);
const accel = values.accel === "kvm" || values.accel === "tcg" ? values.accel : "auto";
if (!["ext4", "xfs", "both"].includes(values.fs!)) throw new AppError("bad_request", `--fs ext4|xfs|both, got ${values.fs}`);
if (!(agents >= 1 && coldCount >= 1)) throw new AppError("bad_request", "--agents and --cold take a number ≥ 1");
const filesystems = values.fs === "both" ? (["ext4", "xfs"] as const) : [values.fs as "ext4" | "xfs"];
const MEM_MIB = 256;
const MiB = 1024 * 1024;
const TARGETS = { readyMs: 300, memoryRatio: 0.35, xfsDiskPerSleepingCloneMiB: 10 };

const began = performance.now();
const say = (line: string) => console.log(`bench:density [${((performance.now() - began) / 1000).toFixed(0).padStart(4)} s] ${line}`);

// ---- cleanup, also on Ctrl-C and errors ----

const cleanups: (() => Promise<unknown>)[] = [];
let cleaning: Promise<void> | undefined;
/** Runs (newest first) every cleanup registered so far; one run at a time, a later call runs what came since. */
function cleanupAll(): Promise<void> {
  const run = async () => {
    for (const step of cleanups.splice(0).reverse()) {
      try {
        await step();
      } catch (err) {
        console.error(`bench:density cleanup: ${(err as Error).message}`);
      }
    }
  };
  cleaning = (cleaning ?? Promise.resolve()).then(run);
  return cleaning;
}
let interrupted = false;
process.once("SIGINT", () => {
  interrupted = true;
  say("interrupted: cleaning up (VMs, loop mount, temp dirs)");
  void cleanupAll().finally(() => process.exit(130));
});
function checkInterrupted(): void {
  if (interrupted) throw new AppError("internal", "interrupted");
}

// ---- figures ----

function percentile(xs: number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}
const r1 = (n: number) => Math.round(n * 10) / 10;
const mib = (bytes: number) => r1(bytes / MiB);

/** Allocated bytes (stat blocks × 512) of every file under `dir`: holes are not counted, reflinked blocks are (in full). */
function allocatedBytes(dir: string): number {
  let total = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, entry.name);
    if (entry.isDirectory()) total += allocatedBytes(p);
    else if (entry.isFile()) total += statSync(p).blocks * 512;
  }
  return total;
}
/** Bytes in use on the filesystem of `dir` (statfs): exact for the bench's own loop image, noisy on a shared disk. */
async function usedBytes(dir: string): Promise<number> {
  const s = await statfs(dir);
  return (s.blocks - s.bfree) * s.bsize;
}

async function call(vm: RunningVm, path: string, method = "GET"): Promise<number> {
  const res = await fetch(`http://127.0.0.1:${vm.endpoint.port}${path}`, { method, signal: AbortSignal.timeout(30_000) });
  const text = await res.text();
  if (res.status !== 200) throw new AppError("bad_gateway", `${path} answered ${res.status}: ${text}`);
  return (JSON.parse(text) as { count: number }).count;
}

/** Each awake clone's GET /counter every `trickleMs` (staggered): latencies and failures while it runs. */
class Trickle {
  readonly latencies: number[] = [];
  failures = 0;
  lastError: string | undefined;
  private readonly timers = new Map<string, NodeJS.Timeout>();
  add(vm: RunningVm): void {
    const tick = async () => {
      const t0 = performance.now();
      try {
        await call(vm, "/counter");
        this.latencies.push(performance.now() - t0);
      } catch (err) {
        this.failures++;
        this.lastError = (err as Error).message;
      }
    };
    const timer = setTimeout(() => {
      void tick();
      this.timers.set(vm.spec.vmId, setInterval(() => void tick(), trickleMs));
    }, Math.random() * trickleMs);
    this.timers.set(vm.spec.vmId, timer);
  }
  stop(): void {
    for (const t of this.timers.values()) clearTimeout(t);
    this.timers.clear();
  }
}

/** CPU the QEMUs used over `ms` (a share of the machine's cores), and the load average. */
async function cpuOver(pids: number[], ms: number): Promise<{ cpuCores: number; load1: number }> {
  const sum = () => pids.reduce((a, p) => a + (readCpuSeconds(p) ?? 0), 0);
  const before = sum();
  await sleep(ms);
  return { cpuCores: r1((sum() - before) / (ms / 1000)), load1: r1(loadavg()[0]!) };
}

function memorySum(vms: RunningVm[]): { pssKiB: number; rssKiB: number; counted: number } {
  let pssKiB = 0;
  let rssKiB = 0;
  let counted = 0;
  for (const vm of vms) {
    const m = vm.pid ? readMemoryKiB(vm.pid) : undefined;
    if (!m) continue;
    pssKiB += m.pss;
    rssKiB += m.rss;
    counted++;
  }
  return { pssKiB, rssKiB, counted };
}

// ---- one filesystem ----

async function benchOne(fs: "ext4" | "xfs", image: GuestImage) {
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
  const specOf = (name: string): VmSpec => ({ vmId: newId("vm"), agentId: newId("agent"), image: "demo", vcpus: 1, memMiB: MEM_MIB, allowEgress: false, stateDir: vmDir(name) });

  // The reference: independent agents, each booted cold (a driver without templates), measured side by side.
  const coldDriver = new QemuDriver({ image, accel, memory: "file", log: silentLogger });
  const coldSpecs: VmSpec[] = [];
  cleanups.push(async () => {
    await coldDriver.close();
    for (const s of coldSpecs) await coldDriver.destroy(s);
  });
  const coldMs: number[] = [];
  const coldVms: RunningVm[] = [];
  for (let i = 0; i < coldCount; i++) {
    checkInterrupted();
    const s = specOf(`cold-${i}`);
    coldSpecs.push(s);
    const t0 = performance.now();
    const { vm } = await coldDriver.boot(s);
    await call(vm, "/counter");
    coldMs.push(performance.now() - t0);
    coldVms.push(vm);
    say(`${fs}: cold boot ${i + 1}/${coldCount}: ${Math.round(coldMs.at(-1)!)} ms`);
  }
  const coldTrickle = new Trickle();
  for (const vm of coldVms) coldTrickle.add(vm);
  await sleep(settleS * 1000);
  const coldMem = memorySum(coldVms);
  const coldCpu = await cpuOver(coldVms.map((v) => v.pid!).filter(Boolean), 3000);
  coldTrickle.stop();
  say(`${fs}: ${coldCount} cold agents: PSS ${mib(coldMem.pssKiB * 1024)} MiB (RSS ${mib(coldMem.rssKiB * 1024)} MiB), ${coldCpu.cpuCores} cores busy`);
  for (const s of coldSpecs.splice(0)) await coldDriver.destroy(s);
  await coldDriver.close();

  // The template: the first VM of its kind boots cold and the template is built beside it.
  const driver = new QemuDriver({ image, accel, memory: "file", templates: { root: join(dataDir, "templates") }, log: silentLogger });
  const specs: VmSpec[] = [];
  cleanups.push(async () => {
    await driver.templates?.settle();
    await driver.close();
    for (const s of specs) await driver.destroy(s);
  });
  const first = specOf("first");
  specs.push(first);
  const t0 = performance.now();
  await driver.boot(first);
  await driver.templates!.settle();
  const templateBuildMs = performance.now() - t0;
  const tpl = (await driver.templates!.list()).find((t) => t.state === "ready");
  if (!tpl?.dir) throw new AppError("internal", `no template was built: ${JSON.stringify(await driver.templates!.list())}`);
  await driver.destroy(first);
  specs.splice(specs.indexOf(first), 1);
  const templateAllocated = allocatedBytes(tpl.dir);
  say(`${fs}: template ${tpl.key} ready after ${Math.round(templateBuildMs)} ms (cold boot ${tpl.bootMs} ms); ${mib(templateAllocated)} MiB allocated on disk`);

  // N clones, one after another, each kept awake by the trickle.
  const trickle = new Trickle();
  cleanups.push(async () => trickle.stop());
  const bootMs: number[] = [];
  const readyMs: number[] = [];
  const clones: { spec: VmSpec; vm: RunningVm }[] = [];
  let notCloned = 0;
  let stoppedBecause: string | undefined;
  const cpuAt: { clones: number; cores: number }[] = [];
  for (let i = 0; i < agents; i++) {
    checkInterrupted();
    const s = specOf(`clone-${i}`);
    specs.push(s);
    const c0 = performance.now();
    let booted;
    try {
      booted = await driver.boot(s);
      await call(booted.vm, "/counter");
    } catch (err) {
      stoppedBecause = `clone ${i + 1} failed after ${Math.round(performance.now() - c0)} ms: ${(err as Error).message}`;
      await driver.destroy(s);
      specs.splice(specs.indexOf(s), 1);
      break;
    }
    const r = performance.now() - c0;
    const b = booted.bootMs;
    if (!booted.template) {
      // The clone's restore failed and the driver booted it cold: not one of the clones measured, and a sign of a full machine.
      notCloned++;
      stoppedBecause = `clone ${i + 1} was not cloned (the driver booted it cold, ${Math.round(r)} ms): its restore failed, the machine is saturated`;
      say(`${fs}: ${stoppedBecause}`);
      await driver.destroy(s);
      specs.splice(specs.indexOf(s), 1);
      break;
    }
    bootMs.push(b);
    readyMs.push(r);
    clones.push({ spec: s, vm: booted.vm });
    trickle.add(booted.vm);
    say(`${fs}: clone ${i + 1}/${agents}: boot ${Math.round(b)} ms, first answer ${Math.round(r)} ms; load ${r1(loadavg()[0]!)}`);
    if ((i + 1) % 10 === 0) {
      const c = await cpuOver(clones.map((x) => x.vm.pid!).filter(Boolean), 3000);
      cpuAt.push({ clones: i + 1, cores: c.cpuCores });
      say(`${fs}: ${i + 1} clones awake keep ${c.cpuCores} of ${availableParallelism()} cores busy (load ${c.load1})`);
    }
    // The machine is full: a new agent that takes this long is no longer "created from a template" in any useful sense.
    if (r > giveUpMs) {
      stoppedBecause = `clone ${i + 1} took ${Math.round(r)} ms to answer (over --give-up-ms ${giveUpMs}): the machine's CPU is saturated`;
      break;
    }
  }
  if (stoppedBecause) say(`${fs}: stopped creating clones at ${clones.length}/${agents}: ${stoppedBecause}`);
  const n = clones.length;
  if (n === 0) throw new AppError("internal", `no clone could be created: ${stoppedBecause}`);
  say(`${fs}: all ${n} awake; trickle every ${trickleMs} ms; measuring memory after ${settleS} s`);
  await sleep(settleS * 1000);
  checkInterrupted();
  const cloneMem = memorySum(clones.map((c) => c.vm));
  const cloneCpu = await cpuOver(clones.map((c) => c.vm.pid!).filter(Boolean), 5000);
  const trickleP50 = percentile(trickle.latencies, 50);
  const trickleP99 = percentile(trickle.latencies, 99);
  const referencePssKiB = (coldMem.pssKiB / coldMem.counted) * n;
  const memoryRatio = cloneMem.pssKiB / referencePssKiB;
  say(`${fs}: ${cloneMem.counted} clones: PSS ${mib(cloneMem.pssKiB * 1024)} MiB (RSS ${mib(cloneMem.rssKiB * 1024)} MiB) vs ${n} independent agents ≈ ${mib(referencePssKiB * 1024)} MiB (${coldCount} cold agents' PSS scaled ×${r1(n / coldCount)}): ratio ${memoryRatio.toFixed(3)}`);
  say(`${fs}: the QEMUs keep ${cloneCpu.cpuCores} cores busy (load ${cloneCpu.load1}); trickle calls ${trickle.latencies.length}, p50 ${r1(trickleP50)} ms, p99 ${r1(trickleP99)} ms, ${trickle.failures} failed${trickle.lastError ? ` (${trickle.lastError})` : ""}`);

  // A few calls to each, then all hibernate: a clone's first hibernation gives it a RAM file of its own (the driver's
  // way: a copy of the template's, a reflink where it can, with the pages it changed written in).
  for (const c of clones) for (let k = 0; k < 3; k++) await call(c.vm, "/counter", "POST");
  trickle.stop();
  const usedBeforeSleep = await usedBytes(dataDir);
  const firstSnap: number[] = [];
  const firstBytes: number[] = [];
  for (const c of clones) {
    checkInterrupted();
    const r = await driver.hibernate(c.vm);
    if (!r.completed) throw new AppError("internal", `hibernation of ${c.spec.vmId} did not complete`);
    firstSnap.push(r.snapshotMs);
    firstBytes.push(r.bytes);
  }
  const perCloneFirst = clones.map((c) => allocatedBytes(c.spec.stateDir));
  const statfsFirst = ((await usedBytes(dataDir)) - usedBeforeSleep) / n;
  // Which figure is the clone's own cost: on the loop image only the bench writes, statfs is exact, and a reflinked
  // block counts once (stat's blocks count it in every file that shares it); on the machine's shared disk statfs
  // sees others' writes, and without reflinks every allocated block is the clone's own.
  const method = fs === "xfs" ? "statfs" : "allocated";
  const ownFirst = method === "statfs" ? statfsFirst : percentile(perCloneFirst, 50);
  say(`${fs}: hibernated ${n} clones (a clone's first: its RAM file made from the template's and the pages it changed): snapshot p50 ${Math.round(percentile(firstSnap, 50))} ms, ${mib(percentile(firstBytes, 50))} MiB each; each clone adds ${mib(ownFirst)} MiB on disk (${method}; allocated blocks p50 ${mib(percentile(perCloneFirst, 50))} MiB, statfs ${mib(statfsFirst)} MiB per clone)`);

  // Wake and hibernate each once more: now ordinary file-backed VMs (RAM in <stateDir>/ram, device state only).
  const wakeMs: number[] = [];
  const secondSnap: number[] = [];
  const secondBytes: number[] = [];
  let lostState = 0;
  let wokeCold = 0;
  for (const c of clones) {
    checkInterrupted();
    const w = await driver.wake(c.spec);
    wakeMs.push(w.timings.restoreMs ?? NaN);
    if (w.mode !== "restore") wokeCold++;
    if ((await call(w.vm, "/counter")) !== 3) lostState++;
    const r = await driver.hibernate(w.vm);
    if (!r.completed) throw new AppError("internal", `second hibernation of ${c.spec.vmId} did not complete`);
    secondSnap.push(r.snapshotMs);
    secondBytes.push(r.bytes);
  }
  const perCloneSecond = clones.map((c) => allocatedBytes(c.spec.stateDir));
  const statfsSecond = ((await usedBytes(dataDir)) - usedBeforeSleep) / n;
  const ownSecond = method === "statfs" ? statfsSecond : percentile(perCloneSecond, 50);
  say(`${fs}: woke and hibernated each again (restore p50 ${Math.round(percentile(wakeMs, 50))} ms${wokeCold ? `, ${wokeCold} booted cold` : ""}${lostState ? `, ${lostState} lost their counter` : ""}): snapshot p50 ${r1(percentile(secondSnap, 50))} ms, ${r1(percentile(secondBytes, 50) / 1024)} KiB each; each clone adds ${mib(ownSecond)} MiB on disk (${method}; allocated blocks p50 ${mib(percentile(perCloneSecond, 50))} MiB, statfs ${mib(statfsSecond)} MiB per clone)`);

  await cleanupAll(); // this filesystem's VMs, template, mount and temp dir
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
    diskPerSleepingCloneMiB: {
      method:
        method === "statfs"
          ? "statfs: the loop filesystem's used space after each round of hibernations minus before the first, per clone (shared blocks count once)"
          : "allocated blocks (stat blocks × 512) summed over each clone's stateDir, p50 (no reflinks here: every block is its own)",
      afterFirstHibernate: mib(ownFirst),
      afterSecondHibernate: mib(ownSecond),
      allocatedP50: { afterFirst: mib(percentile(perCloneFirst, 50)), afterSecond: mib(percentile(perCloneSecond, 50)) },
      statfs: { afterFirst: mib(statfsFirst), afterSecond: mib(statfsSecond) },
    },
    hibernate: {
      first: { p50Ms: Math.round(percentile(firstSnap, 50)), p50MiB: mib(percentile(firstBytes, 50)) },
      second: { p50Ms: r1(percentile(secondSnap, 50)), p50KiB: r1(percentile(secondBytes, 50) / 1024), restoreP50Ms: Math.round(percentile(wakeMs, 50)), wokeCold, lostState },
    },
  };
}

// ---- main ----

type FsResult = Awaited<ReturnType<typeof benchOne>>;
try {
  const image = await ensureGuestImage({ dataDir: resolve(values["data-dir"]!), log: say });
  say(`${agents} clones and ${coldCount} cold agents (${MEM_MIB} MiB, 1 vCPU, file-backed RAM) per filesystem: ${filesystems.join(", ")}`);
  const results: FsResult[] = [];
  for (const fs of filesystems) results.push(await benchOne(fs, image));
  const xfs = results.find((r) => r.fs === "xfs");
  const worstReady = Math.max(...results.map((r) => r.cloneReadyMs.p50));
  const worstRatio = Math.max(...results.map((r) => r.memory.ratio));
  const result = {
    agents,
    cold: coldCount,
    memMiB: MEM_MIB,
    elapsedS: Math.round((performance.now() - began) / 1000),
    sideBySide: results.map((r) => ({
      fs: r.fs,
      clones: r.fitted,
      coldReadyP50Ms: r.coldReadyMs.p50,
      cloneReadyP50Ms: r.cloneReadyMs.p50,
      cloneReadyP99Ms: r.cloneReadyMs.p99,
      memoryRatio: r.memory.ratio,
      diskPerSleepingCloneMiB: { afterFirst: r.diskPerSleepingCloneMiB.afterFirstHibernate, afterSecond: r.diskPerSleepingCloneMiB.afterSecondHibernate },
    })),
    targets: {
      newAgentReadyMs: { target: TARGETS.readyMs, measuredP50: worstReady, met: worstReady <= TARGETS.readyMs },
      memoryRatio: { target: TARGETS.memoryRatio, measured: worstRatio, met: worstRatio <= TARGETS.memoryRatio },
      ...(xfs
        ? {
            xfsDiskPerSleepingCloneMiB: {
              target: TARGETS.xfsDiskPerSleepingCloneMiB,
              afterFirst: xfs.diskPerSleepingCloneMiB.afterFirstHibernate,
              afterSecond: xfs.diskPerSleepingCloneMiB.afterSecondHibernate,
              met: Math.max(xfs.diskPerSleepingCloneMiB.afterFirstHibernate, xfs.diskPerSleepingCloneMiB.afterSecondHibernate) <= TARGETS.xfsDiskPerSleepingCloneMiB,
            },
          }
        : {}),
    },
    filesystems: results,
  };
  console.log(`RESULT ${JSON.stringify(result)}`);
} catch (err) {
  console.error(`bench:density failed: ${(err as Error).message}`);
  process.exitCode = 1;
} finally {
  await cleanupAll();
}

// bench:density's clones: the template built by the first VM of its kind, then N clones of it created one after another, each kept awake by the trickle.
import { availableParallelism, loadavg } from "node:os";
import { join } from "node:path";
import type { RunningVm, VmSpec } from "../../../fleet-agent/drivers/driver.ts";
import { QemuDriver } from "../../../fleet-agent/drivers/qemu/driver.ts";
import { AppError } from "../../../lib/errors.ts";
import { silentLogger } from "../../../lib/log.ts";
import { allocatedBytes, call, cpuOver, mib, r1, Trickle } from "./measure.ts";
import type { DensityRun } from "./run.ts";

/** A driver with templates under `dataDir`; the first VM boots cold and the template is built beside it. */
export async function buildTemplate(run: DensityRun, fs: string, dataDir: string, specOf: (name: string) => VmSpec) {
  const { say, cleanups } = run;
  const driver = new QemuDriver({ image: run.image, accel: run.accel, memory: "file", templates: { root: join(dataDir, "templates") }, log: silentLogger });
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
  return { driver, specs, templateBuildMs, tpl, templateAllocated };
}

/**
 * `agents` clones, one after another, each kept awake by the trickle; creating stops early when one fails, is booted
 * cold instead of cloned, or takes over `giveUpMs` to answer (the machine is full). `specs` gets each clone's spec.
 */
export async function createClones(run: DensityRun, fs: string, driver: QemuDriver, specs: VmSpec[], specOf: (name: string) => VmSpec) {
  const { say, cleanups, agents, giveUpMs } = run;
  const trickle = new Trickle(run.trickleMs);
  cleanups.push(async () => trickle.stop());
  const bootMs: number[] = [];
  const readyMs: number[] = [];
  const clones: { spec: VmSpec; vm: RunningVm }[] = [];
  let notCloned = 0;
  let stoppedBecause: string | undefined;
  const cpuAt: { clones: number; cores: number }[] = [];
  for (let i = 0; i < agents; i++) {
    cleanups.checkInterrupted();
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
  return { trickle, bootMs, readyMs, clones, notCloned, stoppedBecause, cpuAt };
}

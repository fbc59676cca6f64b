// bench:density's reference: independent agents, each booted cold (a driver without templates), their time to answer, memory and CPU.
import { setTimeout as sleep } from "node:timers/promises";
import type { RunningVm, VmSpec } from "../../../fleet-agent/drivers/driver.ts";
import { QemuDriver } from "../../../fleet-agent/drivers/qemu/driver.ts";
import { silentLogger } from "../../../lib/log.ts";
import { call, cpuOver, memorySum, mib, Trickle } from "./measure.ts";
import type { DensityRun } from "./run.ts";

export type ColdReference = Awaited<ReturnType<typeof coldReference>>;

/** Boots `coldCount` agents cold one after another, keeps them awake under the trickle for `settleS`, measures and destroys them. */
export async function coldReference(run: DensityRun, fs: string, specOf: (name: string) => VmSpec) {
  const { say, cleanups, coldCount } = run;
  const coldDriver = new QemuDriver({ image: run.image, accel: run.accel, memory: "file", log: silentLogger });
  const coldSpecs: VmSpec[] = [];
  cleanups.push(async () => {
    await coldDriver.close();
    for (const s of coldSpecs) await coldDriver.destroy(s);
  });
  const coldMs: number[] = [];
  const coldVms: RunningVm[] = [];
  for (let i = 0; i < coldCount; i++) {
    cleanups.checkInterrupted();
    const s = specOf(`cold-${i}`);
    coldSpecs.push(s);
    const t0 = performance.now();
    const { vm } = await coldDriver.boot(s);
    await call(vm, "/counter");
    coldMs.push(performance.now() - t0);
    coldVms.push(vm);
    say(`${fs}: cold boot ${i + 1}/${coldCount}: ${Math.round(coldMs.at(-1)!)} ms`);
  }
  const coldTrickle = new Trickle(run.trickleMs);
  for (const vm of coldVms) coldTrickle.add(vm);
  await sleep(run.settleS * 1000);
  const coldMem = memorySum(coldVms);
  const coldCpu = await cpuOver(coldVms.map((v) => v.pid!).filter(Boolean), 3000);
  coldTrickle.stop();
  say(`${fs}: ${coldCount} cold agents: PSS ${mib(coldMem.pssKiB * 1024)} MiB (RSS ${mib(coldMem.rssKiB * 1024)} MiB), ${coldCpu.cpuCores} cores busy`);
  for (const s of coldSpecs.splice(0)) await coldDriver.destroy(s);
  await coldDriver.close();
  return { coldMs, coldMem, coldCpu };
}

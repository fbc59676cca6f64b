// bench:density's sleeping clones: each hibernated twice (woken in between), what a hibernation takes and the disk each sleeping clone adds.
import type { RunningVm, VmSpec } from "../../../fleet-agent/drivers/driver.ts";
import type { QemuDriver } from "../../../fleet-agent/drivers/qemu/driver.ts";
import { AppError } from "../../../lib/errors.ts";
import { percentile } from "../figures.ts";
import { allocatedBytes, call, mib, r1, usedBytes, type Trickle } from "./measure.ts";
import type { DensityRun } from "./run.ts";

export async function hibernateClones(
  run: DensityRun,
  fs: "ext4" | "xfs",
  dataDir: string,
  driver: QemuDriver,
  clones: { spec: VmSpec; vm: RunningVm }[],
  trickle: Trickle,
) {
  const { say, cleanups } = run;
  const n = clones.length;
  // A few calls to each, then all hibernate: a clone's first hibernation gives it a RAM file of its own (the driver's
  // way: a copy of the template's, a reflink where it can, with the pages it changed written in).
  for (const c of clones) for (let k = 0; k < 3; k++) await call(c.vm, "/counter", "POST");
  trickle.stop();
  const usedBeforeSleep = await usedBytes(dataDir);
  const firstSnap: number[] = [];
  const firstBytes: number[] = [];
  for (const c of clones) {
    cleanups.checkInterrupted();
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
  say(
    `${fs}: hibernated ${n} clones (a clone's first: its RAM file made from the template's and the pages it changed): snapshot p50 ${Math.round(percentile(firstSnap, 50))} ms, ${mib(percentile(firstBytes, 50))} MiB each; each clone adds ${mib(ownFirst)} MiB on disk (${method}; allocated blocks p50 ${mib(percentile(perCloneFirst, 50))} MiB, statfs ${mib(statfsFirst)} MiB per clone)`,
  );

  // Wake and hibernate each once more: now ordinary file-backed VMs (RAM in <stateDir>/ram, device state only).
  const wakeMs: number[] = [];
  const secondSnap: number[] = [];
  const secondBytes: number[] = [];
  let lostState = 0;
  let wokeCold = 0;
  for (const c of clones) {
    cleanups.checkInterrupted();
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
  say(
    `${fs}: woke and hibernated each again (restore p50 ${Math.round(percentile(wakeMs, 50))} ms${wokeCold ? `, ${wokeCold} booted cold` : ""}${lostState ? `, ${lostState} lost their counter` : ""}): snapshot p50 ${r1(percentile(secondSnap, 50))} ms, ${r1(percentile(secondBytes, 50) / 1024)} KiB each; each clone adds ${mib(ownSecond)} MiB on disk (${method}; allocated blocks p50 ${mib(percentile(perCloneSecond, 50))} MiB, statfs ${mib(statfsSecond)} MiB per clone)`,
  );

  return {
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
      second: {
        p50Ms: r1(percentile(secondSnap, 50)),
        p50KiB: r1(percentile(secondBytes, 50) / 1024),
        restoreP50Ms: Math.round(percentile(wakeMs, 50)),
        wokeCold,
        lostState,
      },
    },
  };
}

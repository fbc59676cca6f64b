// `npm run bench:density`: many agents of one image from a warm template (qemu driver, file-backed RAM), against
// independently cold-booted agents: time to create each, host memory (sum of PSS) while all are awake under a trickle
// of calls, and the disk each sleeping clone adds beyond the template, on this machine's filesystem and on XFS with
// reflinks (a loop image, scripts/xfs-loop.ts). Options: --agents N (50), --cold N (5: cold-booted agents for the
// reference, scaled to N), --fs ext4|xfs|both (both; `ext4` means the machine's own filesystem under a mkdtemp),
// --trickle-ms MS (2000: each clone's GET /counter period), --settle-s S (10: awake time before memory is measured),
// --give-up-ms MS (20000: stop creating clones once one takes longer to answer, or fails: the machine is full; the
// figures are then of the clones that fitted, and the RESULT says so),
// --accel auto|kvm|tcg, --data-dir DIR (where the guest image is built). Prints progress, then one `RESULT {json}`.
// Its parts are in bench/density/: one filesystem's run, the cold reference, the template and clones, their sleep, the measures.
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { ensureGuestImage } from "../fleet-agent/guest/build-image.ts";
import { AppError } from "../lib/errors.ts";
import { Cleanups } from "./bench/density/cleanups.ts";
import { benchOne, type FsResult } from "./bench/density/filesystem.ts";
import { MEM_MIB, type DensityRun } from "./bench/density/run.ts";
import { printResult } from "./bench/figures.ts";

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
const TARGETS = { readyMs: 300, memoryRatio: 0.35, xfsDiskPerSleepingCloneMiB: 10 };

const began = performance.now();
const say = (line: string) => console.log(`bench:density [${((performance.now() - began) / 1000).toFixed(0).padStart(4)} s] ${line}`);

// cleanup, also on Ctrl-C and errors
const cleanups = new Cleanups();
cleanups.exitOnInterrupt(say);

// ---- main ----

try {
  const image = await ensureGuestImage({ dataDir: resolve(values["data-dir"]!), log: say });
  const run: DensityRun = { image, accel, agents, coldCount, trickleMs, settleS, giveUpMs, say, cleanups };
  say(`${agents} clones and ${coldCount} cold agents (${MEM_MIB} MiB, 1 vCPU, file-backed RAM) per filesystem: ${filesystems.join(", ")}`);
  const results: FsResult[] = [];
  for (const fs of filesystems) results.push(await benchOne(run, fs));
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
              met:
                Math.max(xfs.diskPerSleepingCloneMiB.afterFirstHibernate, xfs.diskPerSleepingCloneMiB.afterSecondHibernate) <=
                TARGETS.xfsDiskPerSleepingCloneMiB,
            },
          }
        : {}),
    },
    filesystems: results,
  };
  printResult(result);
} catch (err) {
  console.error(`bench:density failed: ${(err as Error).message}`);
  process.exitCode = 1;
} finally {
  await cleanups.runAll();
}

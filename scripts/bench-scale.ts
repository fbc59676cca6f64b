// `npm run bench:scale`: a host of many sleeping agents (issue 31), through the whole system (the all-in-one in a
// process of its own, real QEMU, default settings: file-backed RAM, templates, kept paused QEMUs). --registered N
// agents (10000) registered through the API; --awake N (50) of them awake, each taking a GET every --trickle-ms
// (2000); --hibernated N (1000) woken once (clones of the template) and hibernated through the API, while the disk
// keeps --margin-gib (20) free. Measures the host's RSS and fds per sleeping agent (at N asleep against at 10), the
// disk each takes, a random sleeping agent's wake among N against among 10 (--wake-samples, 30), the list's pages
// (GET /v1/agents?limit=100 through every agent) and the host's CPU over a quiet --quiet-s (60) at 10 and at N asleep, every agent
// registered. Agents have --mem-mib (128: less disk per sleeping clone) of RAM. --fs ext4|xfs (ext4: the machine's own
// filesystem; xfs: a loop image with reflinks), --concurrency N (3: wakes+hibernations at once), --accel auto|kvm|tcg,
// --data-dir DIR (where the guest image is built), --database postgres|embedded (default postgres where its server is
// installed: a server of its own, so the host process's RSS holds no database; embedded: PGlite inside it, as `npm start`).
// --soak-min M: instead, the soak: --soak-agents (8) agents waking and sleeping for M minutes under a steady trickle
// (a call, idle --soak-idle-ms (2000) to hibernation, again), host RSS, fds and data dir sampled every 30 s.
// Prints progress, then one `RESULT {json}`; its parts are in bench/scale/.
import { existsSync, readFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { ensureGuestImage } from "../fleet-agent/guest/build-image.ts";
import { AppError } from "../lib/errors.ts";
import { Cleanups } from "./bench/density/cleanups.ts";
import { printResult } from "./bench/figures.ts";
import { runScale } from "./bench/scale/run.ts";
import { defaultDatabase, lastLogFile } from "./bench/scale/setup.ts";
import { runSoak } from "./bench/scale/soak.ts";

const { values } = parseArgs({
  options: {
    registered: { type: "string", default: "10000" },
    hibernated: { type: "string", default: "1000" },
    awake: { type: "string", default: "50" },
    "mem-mib": { type: "string", default: "128" },
    concurrency: { type: "string", default: "3" },
    "trickle-ms": { type: "string", default: "2000" },
    "wake-samples": { type: "string", default: "30" },
    "quiet-s": { type: "string", default: "60" },
    "margin-gib": { type: "string", default: "20" },
    "soak-min": { type: "string", default: "0" },
    "soak-agents": { type: "string", default: "8" },
    "soak-idle-ms": { type: "string", default: "2000" },
    fs: { type: "string", default: "ext4" },
    database: { type: "string", default: defaultDatabase() },
    accel: { type: "string", default: "auto" },
    "data-dir": { type: "string", default: join(import.meta.dirname, "..", ".data") },
  },
});
const int = (name: keyof typeof values, min: number) => {
  const x = Number(values[name]);
  if (!Number.isInteger(x) || x < min) throw new AppError("bad_request", `--${name} takes a whole number ≥ ${min}, got ${values[name]}`);
  return x;
};
const registered = int("registered", 1);
const hibernated = int("hibernated", 1);
const awake = int("awake", 0);
const memMiB = int("mem-mib", 64);
const soakMin = Number(values["soak-min"]);
if (values.fs !== "ext4" && values.fs !== "xfs") throw new AppError("bad_request", `--fs ext4|xfs, got ${values.fs}`);
const fs = values.fs;
if (values.database !== "postgres" && values.database !== "embedded") throw new AppError("bad_request", `--database postgres|embedded, got ${values.database}`);
const database = values.database;
const accel = values.accel === "kvm" || values.accel === "tcg" ? values.accel : "auto";
/** The targets. */
const TARGETS = { rssKbPerHibernated: 20, wakeP99RatioWithin: 0.1, reaperCpuPct: 2 };

const began = performance.now();
const say = (line: string) => console.log(`bench:scale [${((performance.now() - began) / 1000).toFixed(0).padStart(5)} s] ${line}`);
const cleanups = new Cleanups();
cleanups.exitOnInterrupt(say);

try {
  const imageDir = resolve(values["data-dir"]!);
  await ensureGuestImage({ dataDir: imageDir, log: say });
  const setup = { fs, accel, database, imageDir, marginBytes: Number(values["margin-gib"]) * 2 ** 30, say, cleanups } as const;
  if (soakMin > 0) {
    say(`soak: ${values["soak-agents"]} agents (${memMiB} MiB) waking and sleeping for ${soakMin} min on ${fs}`);
    const soak = await runSoak(setup, { minutes: soakMin, agents: int("soak-agents", 1), memMiB, idleMs: int("soak-idle-ms", 100), sampleS: 30 });
    await cleanups.runAll();
    printResult({ ...soak, cores: availableParallelism(), accel, elapsed_s: Math.round((performance.now() - began) / 1000) });
  } else {
    say(`${registered} agents registered, ${awake} awake, up to ${hibernated} hibernated (${memMiB} MiB each, to save disk) on ${fs}`);
    const r = await runScale(setup, {
      registered,
      hibernated,
      awake,
      memMiB,
      concurrency: int("concurrency", 1),
      trickleMs: int("trickle-ms", 100),
      wakeSamples: int("wake-samples", 1),
      quietS: int("quiet-s", 1),
    });
    await cleanups.runAll();
    printResult({
      ...r,
      targets: {
        rss_kb_per_hibernated_agent: { target: `≤ ${TARGETS.rssKbPerHibernated}`, met: r.rss_kb_per_hibernated_agent <= TARGETS.rssKbPerHibernated },
        wake_p99_ratio: { target: `≤ ${1 + TARGETS.wakeP99RatioWithin}`, met: r.wake_p99_ratio <= 1 + TARGETS.wakeP99RatioWithin },
        reaper_cpu_pct: { target: `< ${TARGETS.reaperCpuPct}`, met: r.reaper_cpu_pct < TARGETS.reaperCpuPct },
      },
      cores: availableParallelism(),
      accel,
      elapsed_s: Math.round((performance.now() - began) / 1000),
    });
  }
} catch (err) {
  console.error(`bench:scale failed: ${(err as Error).stack ?? err}`);
  if (lastLogFile && existsSync(lastLogFile))
    console.error(`the system's last log lines:\n${readFileSync(lastLogFile, "utf8").split("\n").slice(-40).join("\n")}`);
  process.exitCode = 1;
} finally {
  await cleanups.runAll();
}

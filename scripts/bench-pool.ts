// `npm run bench:pool`: exec, reset and warm pools through the whole system (gateway → host → VM) on QEMU (issue 33),
// every call through the TypeScript SDK over the public API. Measures: exec round trip on a warm agent (p50/p99) against
// baselines in the same run (`echo` by execFile on the host; the same exec through the process driver, busybox's echo
// written into the demo's empty root there; a proxied call
// to the same agent's own server, the path without a process started); exec on a
// hibernated agent (its first output byte); episode reset (the reset call to the next exec's first output byte,
// p50/p99; after episodes of --episode-ms N (1000), a harness's turns, then back to back); acquire from a pool of --pool (p50/p99, and to the acquired agent's first output); forks per second from
// one checkpoint (direct creates, and the pool's own top-up). Options: --warm N (50), --hibernated N (5), --resets N (10),
// --pool N (20), --forks N (20), --concurrency N (4, the direct forks), --baseline host,process (both), --accel
// auto|kvm|tcg, --data-dir DIR (where the guest image is built), --log FILE (the system's log lines: a wake's phases). Targets (under TCG): warm exec ≤ 20 ms p50, reset ≤
// 150 ms p50, acquire ≤ 50 ms p50. Prints progress, then one `RESULT {json}` line; its parts are in bench/pool/.
import { existsSync, readFileSync } from "node:fs";
import { loadavg } from "node:os";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { ensureGuestImage } from "../fleet-agent/guest/build-image.ts";
import { AppError } from "../lib/errors.ts";
import { printResult, round } from "./bench/figures.ts";
import { acquires, filled, forks, hibernatedExec, hostExec, type ResetRound, resets, spread, warmCalls, warmExec } from "./bench/pool/measure.ts";
import { type BenchSystem, benchLogger, processSystem, qemuSystem } from "./bench/pool/system.ts";

const { values } = parseArgs({
  options: {
    warm: { type: "string", default: "50" },
    hibernated: { type: "string", default: "5" },
    resets: { type: "string", default: "10" },
    "episode-ms": { type: "string", default: "1000" },
    pool: { type: "string", default: "20" },
    forks: { type: "string", default: "20" },
    concurrency: { type: "string", default: "4" },
    baseline: { type: "string", default: "host,process" },
    accel: { type: "string", default: process.env.QEMU_ACCEL ?? "auto" },
    "data-dir": { type: "string", default: process.env.DATA_DIR ?? join(import.meta.dirname, "..", ".data") },
    log: { type: "string" },
  },
});
const sizes = {
  warm: Number(values.warm),
  hibernated: Number(values.hibernated),
  resets: Number(values.resets),
  pool: Number(values.pool),
  forks: Number(values.forks),
  concurrency: Number(values.concurrency),
};
const episodeMs = Number(values["episode-ms"]);
if (!Object.values(sizes).every((x) => Number.isInteger(x) && x >= 1) || !(Number.isInteger(episodeMs) && episodeMs >= 0))
  throw new AppError("bad_request", "--warm, --hibernated, --resets, --pool, --forks and --concurrency take a whole number ≥ 1, --episode-ms one ≥ 0");
const baselines = values
  .baseline!.split(",")
  .map((b) => b.trim())
  .filter(Boolean);
if (!baselines.every((b) => b === "host" || b === "process"))
  throw new AppError("bad_request", `--baseline host,process | host | process, got ${values.baseline}`);
const accel = values.accel === "kvm" || values.accel === "tcg" ? values.accel : "auto";
/** The targets under TCG, ms (p50). */
const TARGETS = { warmExecP50Ms: 20, resetP50Ms: 150, acquireP50Ms: 50 };
/** What the process driver's baseline runs `echo` with (the demo's root there is empty). */
const busybox = "/bin/busybox";

const began = performance.now();
const say = (line: string) => console.log(`bench:pool [${((performance.now() - began) / 1000).toFixed(0).padStart(4)} s] ${line}`);

const result: Record<string, unknown> = { sizes, targets: TARGETS };
const running: BenchSystem[] = [];
process.once("SIGINT", () => {
  say("interrupted: stopping the systems");
  void Promise.allSettled(running.map((s) => s.stop())).finally(() => process.exit(130));
});

try {
  // Baselines first, before any VM loads the machine.
  const baseline: Record<string, unknown> = {};
  if (baselines.includes("host")) {
    baseline.hostExecFile = spread(await hostExec(sizes.warm));
    say(`baseline: echo by execFile on the host p50 ${(baseline.hostExecFile as { p50: number }).p50} ms`);
  }
  if (baselines.includes("process")) {
    const proc = await processSystem();
    running.push(proc);
    try {
      const agent = await proc.client.agents.create({ name: "bench-process", idleTimeoutMs: 600_000 });
      // The demo's root on the process driver is an empty directory: a static busybox written into it runs the echo.
      if (!existsSync(busybox)) throw new Error(`${busybox} is missing (apt-get install busybox-static)`);
      await agent.files.write("/bin/busybox", readFileSync(busybox), { mode: 0o755, mkdirs: true });
      const run = await warmExec(agent, sizes.warm, ["/bin/busybox", "echo", "hi"]);
      baseline.processDriverExec = spread(run.times);
      baseline.processDriverExecInProcess = spread(run.inVm);
      say(`baseline: exec through the API on the process driver p50 ${(baseline.processDriverExec as { p50: number }).p50} ms`);
    } catch (err) {
      baseline.processDriverExec = { error: err instanceof Error ? err.message : String(err) };
      say(`baseline: the process driver's exec failed: ${(baseline.processDriverExec as { error: string }).error}`);
    } finally {
      await proc.stop();
      running.pop();
    }
  }
  result.baseline = baseline;

  const image = await ensureGuestImage({ dataDir: resolve(values["data-dir"]!), log: say });
  const sys = await qemuSystem(image, accel, benchLogger(values.log));
  running.push(sys);
  result.accel = sys.qemu.accel;
  say(`accel ${sys.qemu.accel} (${sys.qemu.accelReason}); ${sys.qemu.qemuVersion}; memory file, templates on`);
  const { client } = sys;

  const agent = await client.agents.create({ name: "bench-pool", idleTimeoutMs: 600_000 });
  let t0 = performance.now();
  await agent.exec(["true"]);
  result.firstExecMs = round(performance.now() - t0, 1);
  say(`first exec (boot or clone of the template, then the exec) ${result.firstExecMs} ms`);

  const warmRun = await warmExec(agent, sizes.warm);
  const warm = spread(warmRun.times);
  result.warmExec = warm;
  result.warmExecInVm = spread(warmRun.inVm);
  say(
    `warm exec round trip: p50 ${warm.p50} ms, p99 ${warm.p99} ms (target ≤ ${TARGETS.warmExecP50Ms} ms p50); the command in the VM p50 ${(result.warmExecInVm as { p50: number }).p50} ms`,
  );
  baseline.proxiedCall = spread(await warmCalls(agent, sizes.warm));
  say(`baseline: a proxied call to the same agent's server p50 ${(baseline.proxiedCall as { p50: number }).p50} ms`);

  const asleep = spread(await hibernatedExec(agent, sizes.hibernated));
  result.hibernatedExecFirstByte = asleep;
  say(`exec on a hibernated agent, first output byte: p50 ${asleep.p50} ms, p99 ${asleep.p99} ms`);

  await agent.exec("echo clean > /tmp/bench-state");
  const ckp = await agent.checkpoint("bench-clean");
  say(`checkpoint ${ckp.id}: ${Math.round(ckp.bytes / 1048576)} MiB, paused ${ckp.pausedMs} ms`);

  const fork = await client.agents.create({ fromCheckpoint: ckp.id, name: "bench-episode", idleTimeoutMs: 600_000 });
  const rounds = (episodes: ResetRound[]) => ({
    toNextOutput: spread(episodes.map((e) => e.toOutput)),
    call: spread(episodes.map((e) => e.call)),
    apiResetMs: spread(episodes.map((e) => e.apiResetMs)),
  });
  // Episodes of --episode-ms (the reset standby is made during one), then back to back (the standby is still being made).
  result.reset = { episodeMs: episodeMs, ...rounds(await resets(fork, sizes.resets, episodeMs)) };
  const resetP50 = (result.reset as ReturnType<typeof rounds>).toNextOutput.p50;
  say(
    `episode reset (reset call to the next exec's output) after ${episodeMs} ms episodes: p50 ${resetP50} ms, p99 ${(result.reset as ReturnType<typeof rounds>).toNextOutput.p99} ms (target ≤ ${TARGETS.resetP50Ms} ms p50)`,
  );
  result.resetBackToBack = rounds(await resets(fork, sizes.resets, 0));
  const b2b = (result.resetBackToBack as ReturnType<typeof rounds>).toNextOutput;
  say(`episode reset back to back (an episode of one exec): p50 ${b2b.p50} ms, p99 ${b2b.p99} ms`);
  await fork.delete();

  const made = await forks(client, ckp.id, sizes.forks, sizes.concurrency);
  result.forks = { n: sizes.forks, concurrency: sizes.concurrency, ms: made.ms, perSecond: made.perSecond };
  say(`forks from one checkpoint: ${sizes.forks} in ${made.ms} ms, ${made.perSecond}/s (${sizes.concurrency} at a time)`);
  for (const id of made.ids) await client.agents.connect(id).delete();

  t0 = performance.now();
  const pool = await client.pools.create({ name: "bench-pool", fromCheckpoint: ckp.id, size: sizes.pool, maxSize: sizes.pool });
  const fillMs = await filled(pool, sizes.pool, 600_000);
  result.poolFill = { size: sizes.pool, ms: round(fillMs, 0), forksPerSecond: round((sizes.pool / fillMs) * 1000, 1) };
  say(`pool of ${sizes.pool} ready in ${round(fillMs, 0)} ms (${(result.poolFill as { forksPerSecond: number }).forksPerSecond} forks/s by its top-up)`);

  const got = await acquires(pool, sizes.pool);
  const acquire = spread(got.rounds.map((r) => r.acquire));
  result.acquire = { call: acquire, toFirstOutput: spread(got.rounds.map((r) => r.toOutput)) };
  say(
    `acquire from a pool of ${sizes.pool}: p50 ${acquire.p50} ms, p99 ${acquire.p99} ms (target ≤ ${TARGETS.acquireP50Ms} ms p50); to the agent's first output p50 ${spread(got.rounds.map((r) => r.toOutput)).p50} ms`,
  );
  const released: number[] = [];
  const apiRelease: number[] = [];
  for (const a of got.agents) {
    const t = performance.now();
    apiRelease.push((await pool.release(a)).resetMs);
    released.push(performance.now() - t);
  }
  result.release = { call: spread(released), apiResetMs: spread(apiRelease) };
  say(`release (reset back into the pool): p50 ${spread(released).p50} ms`);
  await pool.delete();

  result.met = {
    warmExec: warm.p50 <= TARGETS.warmExecP50Ms,
    reset: resetP50 <= TARGETS.resetP50Ms,
    acquire: acquire.p50 <= TARGETS.acquireP50Ms,
  };
  result.loadavg = loadavg().map((l) => round(l, 2));
  result.wallS = round((performance.now() - began) / 1000, 0);
} finally {
  for (const s of running.reverse()) await s.stop().catch(() => {});
}
printResult(result);

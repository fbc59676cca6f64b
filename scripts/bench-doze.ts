// `npm run bench:doze`: agents that wait on a slow model through the egress proxy, with doze off and then on, side by
// side (issue 30). Each agent (the demo image on the qemu driver) serves one inbound call that makes `--calls` model
// calls one after another (the model's first byte after `--first-byte-ms`, then `--tokens` chunks over `--stream-ms`);
// all agents' calls run at once. Options: --agents N (20), --calls N (10), --first-byte-ms MS (5000), --stream-ms MS
// (1000), --tokens N (20), --via connect|plain (connect: a CONNECT tunnel, as HTTPS_PROXY is used), --modes off,on
// (both), --accel auto|kvm|tcg, --data-dir DIR (where the guest image is built). When the machine cannot boot every
// agent, the run goes on with those that booted (doze on runs as many as doze off did) and says so.
// Prints progress, then one `RESULT {json}` line; its parts are in bench/doze/.
import { availableParallelism, loadavg, totalmem } from "node:os";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { ensureGuestImage } from "../fleet-agent/guest/build-image.ts";
import { AppError } from "../lib/errors.ts";
import { availableMiB } from "./bench/doze/cpu.ts";
import { runMode, type ModeResult } from "./bench/doze/run.ts";
import { printResult, round } from "./bench/figures.ts";
import { SlowModel } from "./bench/slow-model.ts";

const { values } = parseArgs({
  options: {
    agents: { type: "string", default: "20" },
    calls: { type: "string", default: "10" },
    "first-byte-ms": { type: "string", default: "5000" },
    "stream-ms": { type: "string", default: "1000" },
    tokens: { type: "string", default: "20" },
    via: { type: "string", default: "connect" },
    modes: { type: "string", default: "off,on" },
    accel: { type: "string", default: process.env.QEMU_ACCEL ?? "auto" },
    "data-dir": { type: "string", default: process.env.DATA_DIR ?? join(import.meta.dirname, "..", ".data") },
  },
});
const agents = Number(values.agents);
const calls = Number(values.calls);
const firstByteMs = Number(values["first-byte-ms"]);
const streamMs = Number(values["stream-ms"]);
const tokens = Number(values.tokens);
const accel = values.accel === "kvm" || values.accel === "tcg" ? values.accel : "auto";
const modes = values.modes!.split(",").map((m) => m.trim());
if (![agents, calls, tokens].every((x) => Number.isInteger(x) && x >= 1))
  throw new AppError("bad_request", "--agents, --calls and --tokens take a whole number ≥ 1");
if (!(firstByteMs >= 0 && streamMs >= 0)) throw new AppError("bad_request", "--first-byte-ms and --stream-ms take a number of ms ≥ 0");
if (values.via !== "connect" && values.via !== "plain") throw new AppError("bad_request", `--via connect|plain, got ${values.via}`);
if (modes.length === 0 || !modes.every((m) => m === "off" || m === "on")) throw new AppError("bad_request", `--modes off,on | off | on, got ${values.modes}`);
const via = values.via;
/** The targets (doze on against off). */
const TARGETS = { billedRatio: 0.15, wallRatioWithin: 0.05, addedFirstByteP50Ms: 10, addedFirstByteP99Ms: 30, hostCpuDozingPct: 2 };

const began = performance.now();
const say = (line: string) => console.log(`bench:doze [${((performance.now() - began) / 1000).toFixed(0).padStart(4)} s] ${line}`);

const model = await SlowModel.start({ firstByteMs, tokens, gapMs: streamMs / tokens });
// On Ctrl-C: the running mode's agents deleted and its system stopped (its QEMUs with it), then exit 130.
let interruptCleanup: (() => Promise<void>) | undefined;
const onInterrupt = (cleanup: (() => Promise<void>) | undefined) => {
  interruptCleanup = cleanup;
};
process.once("SIGINT", () => {
  say("interrupted: deleting the agents and stopping the system");
  void (interruptCleanup?.() ?? Promise.resolve()).finally(() => process.exit(130));
});
try {
  const image = await ensureGuestImage({ dataDir: resolve(values["data-dir"]!), log: say });
  say(
    `${agents} agents × ${calls} model calls (first byte after ${firstByteMs} ms, then ${tokens} chunks over ${streamMs} ms, ${via}); modes ${modes.join(", ")}; ` +
      `${availableParallelism()} cores, load ${round(loadavg()[0]!, 1)}, ${availableMiB()} of ${Math.round(totalmem() / 2 ** 20)} MiB available`,
  );
  const results: Partial<Record<"off" | "on", ModeResult>> = {};
  let wanted = agents;
  for (const mode of modes as ("off" | "on")[]) {
    const r = await runMode({ image, accel, agents, calls, via, model, say, onInterrupt }, mode === "on", wanted);
    results[mode] = r;
    wanted = r.agents; // side by side: the next mode runs as many agents as this one could
  }
  const off = results.off;
  const on = results.on;
  const ratio = (a: number | undefined, b: number | undefined) => (a !== undefined && b !== undefined && b > 0 ? round(a / b, 3) : null);
  const billedRatio = ratio(on?.billedActiveS, off?.billedActiveS);
  const wallRatio = ratio(on?.wallS.mean, off?.wallS.mean);
  const addedP50 = on?.firstByteToGuestMs.p50 ?? null;
  const addedP99 = on?.firstByteToGuestMs.p99 ?? null;
  const cpuDozing = on?.cpuAllDozing.pct ?? null;
  printResult({
    agents_asked: agents,
    agents: Math.min(...Object.values(results).map((r) => r.agents)),
    calls,
    first_byte_ms: firstByteMs,
    stream_ms: streamMs,
    via,
    billed_ratio: billedRatio,
    // The stream must be received awake: the least a doze can bill is the stream's share of each model call.
    billed_ratio_floor: round(streamMs / (firstByteMs + streamMs), 3),
    wall_ratio: wallRatio,
    added_first_byte_ms_p50: addedP50,
    added_first_byte_ms_p99: addedP99,
    added_first_byte_is:
      "guest wall clock at the first response byte's receipt (fixed after each resume) minus the model's wall clock at its first write, per model call",
    added_first_byte_ms_max: on?.firstByteToGuestMs.max ?? null,
    proxy_hold_ms_p50: on?.upstreamResumeMs?.p50 ?? null,
    proxy_hold_ms_p99: on?.upstreamResumeMs?.p99 ?? null,
    proxy_hold_is: "the host's resume on an answer (cont + clock fix, the event log's resumeMs): how long the proxy held the first byte",
    // Without doze nothing sets the guest clocks after the bench's fix before the calls, and under TCG on a loaded
    // machine they drift (seconds in a minute): that mode's first-byte figure is in `modes.off` with its skew, not here.
    guest_skew_after_ms_max: { off: off?.skewAfterMs.max ?? null, on: on?.skewAfterMs.max ?? null },
    host_cpu_dozing_pct: cpuDozing,
    host_cpu_dozing_is:
      "this process (gateway, host, egress proxy, PGlite, the bench's client and model) + every agent's QEMU, /proc and process.cpuUsage, over the moments all agents dozed, % of one core",
    host_cpu_dozing_sampled_s: on?.cpuAllDozing.seconds ?? null,
    host_cpu_waiting_off_pct: off?.cpuAllWaiting.pct ?? null,
    load1_max: Math.max(...Object.values(results).map((r) => r.machine.load1Max)),
    available_mib_min: Math.min(...Object.values(results).map((r) => r.machine.availableMiBMin)),
    cores: availableParallelism(),
    accel,
    targets: {
      billed_ratio: { target: TARGETS.billedRatio, met: billedRatio !== null && billedRatio <= TARGETS.billedRatio },
      wall_ratio: { target: `1 ± ${TARGETS.wallRatioWithin}`, met: wallRatio !== null && Math.abs(wallRatio - 1) <= TARGETS.wallRatioWithin },
      added_first_byte_ms_p50: { target: TARGETS.addedFirstByteP50Ms, met: addedP50 !== null && addedP50 <= TARGETS.addedFirstByteP50Ms },
      added_first_byte_ms_p99: { target: TARGETS.addedFirstByteP99Ms, met: addedP99 !== null && addedP99 <= TARGETS.addedFirstByteP99Ms },
      host_cpu_dozing_pct: { target: TARGETS.hostCpuDozingPct, met: cpuDozing !== null && cpuDozing <= TARGETS.hostCpuDozingPct },
    },
    elapsed_s: Math.round((performance.now() - began) / 1000),
    modes: results,
  });
} catch (err) {
  console.error(`bench:doze failed: ${(err as Error).stack ?? err}`);
  process.exitCode = 1;
} finally {
  await model.close();
}

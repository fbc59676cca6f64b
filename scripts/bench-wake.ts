// `npm run bench:wake`: boot, snapshot and wake timings of the qemu driver through the whole system (gateway → host → VM).
// Options: --rounds N (10), --sleep-ms MS (hibernated time before each wake, 2000), --warm N (20), --accel auto|kvm|tcg,
// --prestart (keep a QEMU waiting in -incoming defer), --prestart-paused (file memory: keep the hibernated QEMU itself
// waiting, stopped; QemuDriverOptions.prestart "paused"), --image DIR (build the Containerfile in DIR through the API
// and run that instead of the demo, e.g. examples/node-agent), --path P (what each call asks for, /counter),
// --memory stream|file|both (guest RAM streamed into each snapshot, or file-backed; `both` runs the rounds with each,
// one agent per mode on one system, and puts both sets of figures side by side in the RESULT line), --tb-mib N (TCG's
// translated-code cache per QEMU; with --prestart-paused the RESULT says what the kept QEMU holds of it), --cold (file
// memory: the agent's RAM file is dropped from the page cache before each wake, as for an agent that slept among many).
// Prints progress, then one `RESULT {json}` line.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { Readable } from "node:stream";
import { loadavg, tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { silentLogger, type Logger } from "../lib/log.ts";
import type { BootResult, RunningVm, SnapshotResult, VmDriver, VmSpec, WakeResult } from "../fleet-agent/drivers/driver.ts";
import type { MemoryMode } from "../fleet-agent/drivers/qemu/args.ts";
import { QemuDriver } from "../fleet-agent/drivers/qemu/driver.ts";
import { TCG_TB_MIB } from "../fleet-agent/drivers/qemu/args.ts";
import { qemuPids } from "./bench/scale/host-process.ts";
import { ensureGuestImage } from "../fleet-agent/guest/build-image.ts";
import { parseAllInOneConfig, startAllInOne } from "../compose/all-in-one.ts";
import { printResult } from "./bench/figures.ts";

const { values } = parseArgs({
  options: {
    rounds: { type: "string", default: "10" },
    "sleep-ms": { type: "string", default: "2000" },
    warm: { type: "string", default: "20" },
    accel: { type: "string", default: process.env.QEMU_ACCEL ?? "auto" },
    prestart: { type: "boolean", default: false },
    "prestart-paused": { type: "boolean", default: false },
    image: { type: "string" },
    path: { type: "string", default: "/counter" },
    memory: { type: "string", default: "stream" },
    "tb-mib": { type: "string" },
    cold: { type: "boolean", default: false },
    "data-dir": { type: "string", default: process.env.DATA_DIR ?? join(import.meta.dirname, "..", ".data") },
  },
});
const rounds = Number(values.rounds);
const sleepMs = Number(values["sleep-ms"]);
const warmCalls = Number(values.warm);
const accel = values.accel === "kvm" || values.accel === "tcg" ? values.accel : "auto";
const prestart: boolean | "paused" = values["prestart-paused"] ? "paused" : values.prestart!;
const say = (line: string) => console.log(`bench:wake ${line}`);
if (!["stream", "file", "both"].includes(values.memory!)) throw new Error(`--memory stream|file|both, got ${values.memory}`);
const modes: MemoryMode[] = values.memory === "both" ? ["stream", "file"] : [values.memory as MemoryMode];

/** What the driver itself reported for one memory mode's agent. */
interface Recorded {
  boots: BootResult[];
  snapshots: SnapshotResult[];
  wakes: WakeResult[];
}

/**
 * Records what the drivers themselves report, while the host drives them: one QemuDriver per memory mode, a VM going
 * to the mode that was `current` when it first booted (the bench creates one agent per mode, one after the other).
 */
class RecordingDriver implements VmDriver {
  readonly name = "qemu" as const;
  readonly isolated = true;
  current: MemoryMode;
  readonly recorded = new Map<MemoryMode, Recorded>();
  private readonly inner: Map<MemoryMode, QemuDriver>;
  private readonly modeOf = new Map<string, MemoryMode>();
  constructor(inner: Map<MemoryMode, QemuDriver>) {
    this.inner = inner;
    this.current = [...inner.keys()][0]!;
    for (const m of inner.keys()) this.recorded.set(m, { boots: [], snapshots: [], wakes: [] });
  }
  private mode(spec: VmSpec): MemoryMode {
    if (!this.modeOf.has(spec.vmId)) this.modeOf.set(spec.vmId, this.current);
    return this.modeOf.get(spec.vmId)!;
  }
  private of(spec: VmSpec): QemuDriver {
    return this.inner.get(this.mode(spec))!;
  }
  logPath(spec: VmSpec): string {
    return this.of(spec).logPath(spec);
  }
  async boot(spec: VmSpec) {
    const r = await this.of(spec).boot(spec);
    this.recorded.get(this.mode(spec))!.boots.push(r);
    return r;
  }
  async hibernate(vm: RunningVm, signal?: AbortSignal) {
    const r = await this.of(vm.spec).hibernate(vm, signal);
    if (r.completed) this.recorded.get(this.mode(vm.spec))!.snapshots.push(r);
    return r;
  }
  async wake(spec: VmSpec) {
    const r = await this.of(spec).wake(spec);
    this.recorded.get(this.mode(spec))!.wakes.push(r);
    return r;
  }
  stop(vm: RunningVm) {
    return this.of(vm.spec).stop(vm);
  }
  destroy(spec: VmSpec) {
    return this.of(spec).destroy(spec);
  }
  cpuSeconds(vm: RunningVm) {
    return this.of(vm.spec).cpuSeconds(vm);
  }
  guestLeases(vm: RunningVm) {
    return this.of(vm.spec).guestLeases(vm);
  }
  onExit(vm: RunningVm, listener: Parameters<VmDriver["onExit"]>[1]) {
    this.of(vm.spec).onExit(vm, listener);
  }
  reap(spec: VmSpec) {
    return this.of(spec).reap(spec);
  }
  async close() {
    await Promise.all([...this.inner.values()].map((d) => d.close()));
  }
}

function p50(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const mid = Math.floor(s.length / 2);
  return s.length % 2 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
}
const round1 = (x: number) => Math.round(x * 10) / 10;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The per-phase timings the driver logs with "hibernated" and "restored" (qemu/phases.ts), by memory mode. */
const phaseLog = new Map<MemoryMode, { hibernate: Record<string, number>[]; wake: Record<string, number>[] }>(
  modes.map((m) => [m, { hibernate: [], wake: [] }]),
);
function phaseLogger(memory: MemoryMode): Logger {
  const logger: Logger = {
    ...silentLogger,
    info(msg, fields) {
      // File memory: when the RAM file's pages were durable too (at the commit, or later when the manifest said
      // `ramPending`), from the hibernation's start: `durable` among the hibernation's phases.
      if (msg === "RAM file durable") {
        const last = phaseLog.get(memory)!.hibernate.at(-1);
        if (last) last.durable = Number(fields?.durableMs);
        return;
      }
      const phases = fields?.phases as Record<string, number> | undefined;
      if (!phases) return;
      if (msg === "hibernated")
        phaseLog
          .get(memory)!
          .hibernate.push({ ...phases, ...(memory === "file" && fields?.ramPending === false ? { durable: Number(fields.snapshotMs) } : {}) });
      else if (msg === "restored")
        phaseLog.get(memory)!.wake.push({
          ...phases,
          ...(fields?.firstAnswerMs !== undefined
            ? { firstAnswer: Number(fields.firstAnswerMs), guestAnswered: Number(fields.restoreMs) + Number(fields.firstAnswerMs) }
            : {}),
          clockFix: Number(fields?.clockFixMs),
        });
    },
    child: () => logger,
  };
  return logger;
}
/** Drops the agent's RAM file from the page cache (its pages are clean once its hibernation made them durable). */
function dropFromPageCache(dir: string, agentId: string): void {
  const hosts = join(dir, "hosts");
  for (const host of readdirSync(hosts)) {
    const ram = join(hosts, host, "vms", agentId, "ram");
    if (!existsSync(ram)) continue;
    const dd = spawnSync("dd", [`if=${ram}`, "iflag=nocache", "count=0", "status=none"]);
    if (dd.status !== 0) throw new Error(`dropping ${ram} from the page cache: ${dd.stderr.toString()}`);
    return;
  }
  throw new Error(`--cold: no RAM file of ${agentId} under ${hosts} (use --memory file)`);
}

/**
 * The bench's one QEMU: its anonymous resident memory and, of it, TCG's translated code (its cache is the one mapping
 * that is readable, writable and executable), MiB.
 */
function qemuMemory(dir: string): { anon_mib: number; tcg_code_mib: number } | undefined {
  const pid = qemuPids(dir)[0];
  if (pid === undefined) return undefined;
  let anon = 0;
  let code = 0;
  let rwx = false;
  for (const line of readFileSync(`/proc/${pid}/smaps`, "utf8").split("\n")) {
    const head = /^[0-9a-f]+-[0-9a-f]+ (\S+)/.exec(line);
    if (head) rwx = head[1]!.startsWith("rwx");
    const kb = /^Anonymous:\s+(\d+) kB/.exec(line);
    if (!kb) continue;
    anon += Number(kb[1]);
    if (rwx) code += Number(kb[1]);
  }
  return { anon_mib: round1(anon / 1024), tcg_code_mib: round1(code / 1024) };
}

/** p50 of each phase over the rounds (a phase missing from a round counts as absent there). */
function phaseP50(rounds: Record<string, number>[]): Record<string, number> {
  const names = [...new Set(rounds.flatMap((r) => Object.keys(r)))];
  return Object.fromEntries(
    names.map((n) => [n, round1(p50(rounds.map((r) => r[n]).filter((v): v is number => typeof v === "number" && Number.isFinite(v))))]),
  );
}

const image = await ensureGuestImage({ dataDir: resolve(values["data-dir"]), log: say });
const tcgTbMiB = values["tb-mib"] === undefined ? undefined : Number(values["tb-mib"]);
const drivers = new Map(
  modes.map((memory) => [memory, new QemuDriver({ image, accel, prestart, memory, log: phaseLogger(memory), ...(tcgTbMiB ? { tcgTbMiB } : {}) })] as const),
);
const qemu = drivers.get(modes[0]!)!;
say(
  `accel ${qemu.accel} (${qemu.accelReason}); ${qemu.qemuVersion}; prestart ${prestart === "paused" ? "paused" : prestart ? "on" : "off"}; memory ${modes.join(" and ")}`,
);
const driver = new RecordingDriver(drivers);
const dataDir = mkdtempSync(join(tmpdir(), "bench-wake-"));
// `--image` is built on this machine (IMAGE_BUILDS=host): the bench times wakes, and its recording driver has no exec
// path for a builder VM.
const env: Record<string, string> = { REAPER_INTERVAL_MS: "1000", PORT: "0", DATA_DIR: dataDir, IMAGE_BUILDS: "host" };
const system = await startAllInOne(parseAllInOneConfig(env, ["demo"]), { driver, log: silentLogger });

try {
  const headers = { authorization: `Bearer ${system.demo.token}`, "content-type": "application/json" };
  let imageName = "demo";
  let imageBuild: { build_ms: number; image_bytes: number } | undefined;
  if (values.image) {
    const t0 = performance.now();
    const tar = spawn("tar", ["-c", "-C", resolve(values.image), "."], { stdio: ["ignore", "pipe", "inherit"] });
    const built = await fetch(`${system.url}/v1/images?name=bench`, {
      method: "POST",
      headers: { authorization: headers.authorization },
      body: Readable.toWeb(tar.stdout) as ReadableStream<Uint8Array>,
      duplex: "half",
    } as RequestInit);
    if (built.status !== 201) throw new Error(`build ${values.image}: ${built.status} ${await built.text()}`);
    const { image: img } = (await built.json()) as { image: { sizeBytes: number; digest: string } };
    imageBuild = { build_ms: round1(performance.now() - t0), image_bytes: img.sizeBytes };
    say(`image: built ${values.image} in ${imageBuild.build_ms} ms, ${img.sizeBytes} bytes, ${img.digest}`);
    imageName = "bench";
  }
  /** One agent on `memory`: boot, warm calls, then `rounds` of hibernate, sleep and a waking call. */
  const runMode = async (memory: MemoryMode) => {
    driver.current = memory;
    const rec = driver.recorded.get(memory)!;
    const created = await fetch(`${system.url}/v1/agents`, { method: "POST", headers, body: JSON.stringify({ idleTimeoutMs: 3_600_000, image: imageName }) });
    if (created.status !== 201) throw new Error(`create agent: ${created.status} ${await created.text()}`);
    const agentId = ((await created.json()) as { id: string }).id;
    const agentUrl = `${system.url}/a/${agentId}`;

    /** Time to the response headers (the first byte) of one call, and how it woke. */
    const firstByte = async (path: string) => {
      const t0 = performance.now();
      const res = await fetch(`${agentUrl}${path}`, { headers });
      const ms = performance.now() - t0;
      await res.arrayBuffer();
      if (res.status !== 200) throw new Error(`${path}: ${res.status}`);
      return { ms, wake: res.headers.get("x-wake") ?? "?" };
    };

    const callPath = values.path;
    const boot = await firstByte(callPath);
    say(`${memory} boot: first byte ${round1(boot.ms)} ms (x-wake ${boot.wake}), driver boot ${round1(rec.boots[0]?.bootMs ?? NaN)} ms`);
    for (let i = 0; i < 3; i++) await firstByte(callPath); // connection pools, JIT
    const warm: number[] = [];
    for (let i = 0; i < warmCalls; i++) warm.push((await firstByte(callPath)).ms);
    say(`${memory} warm: first byte p50 ${round1(p50(warm))} ms over ${warmCalls} calls`);

    const wakeFirstByte: number[] = [];
    /** Per wake: what the gateway and fleet-agent add = first byte − restore − clock fix − a warm call's first byte. */
    const overheads: number[] = [];
    const wakeModes: Record<string, number> = {};
    for (let r = 0; r < rounds; r++) {
      const hib = await fetch(`${system.url}/v1/agents/${agentId}/hibernate`, { method: "POST", headers });
      if (hib.status !== 200) throw new Error(`hibernate: ${hib.status} ${await hib.text()}`);
      await sleep(sleepMs);
      if (values.cold) dropFromPageCache(dataDir, agentId);
      const w = await firstByte(callPath);
      wakeFirstByte.push(w.ms);
      wakeModes[w.wake] = (wakeModes[w.wake] ?? 0) + 1;
      const d = rec.wakes.at(-1);
      if (d?.mode === "restore") overheads.push(w.ms - d.timings.restoreMs - d.timings.clockFixMs - p50(warm));
      say(
        `${memory} round ${r + 1}/${rounds}: wake first byte ${round1(w.ms)} ms (x-wake ${w.wake}); snapshot ${round1(rec.snapshots.at(-1)?.snapshotMs ?? NaN)} ms; ` +
          `restore ${round1(d?.timings.restoreMs ?? NaN)} ms; clock fix ${round1(d?.timings.clockFixMs ?? NaN)} ms; skew ${round1(d?.timings.skewBeforeMs ?? NaN)} → ${round1(d?.timings.skewAfterMs ?? NaN)} ms`,
      );
    }

    const restores = rec.wakes.filter((w) => w.mode === "restore");
    // The QEMU a hibernation keeps (prestart paused): its anonymous memory, what the kept tier's budget weighs.
    let kept: { anon_mib: number; tcg_code_mib: number } | undefined;
    if (prestart === "paused") {
      await fetch(`${system.url}/v1/agents/${agentId}/hibernate`, { method: "POST", headers });
      await sleep(500);
      kept = qemuMemory(dataDir);
    }
    // Removed before the next mode's agent, so each mode's rounds run alone on the machine.
    await fetch(`${system.url}/v1/agents/${agentId}`, { method: "DELETE", headers });
    return {
      wake_modes: wakeModes,
      boot_ms: round1(rec.boots[0]?.bootMs ?? NaN),
      snapshot_ms: round1(p50(rec.snapshots.map((s) => s.snapshotMs))),
      snapshot_bytes: rec.snapshots.at(-1)?.bytes ?? 0,
      // To the guest running again (`cont`); its first answer is the clock fix's first round trip (`wake_phases_ms_p50`:
      // `firstAnswer`, and `guestAnswered` = restore + first answer).
      restore_ms_p50: round1(p50(restores.map((w) => w.timings.restoreMs))),
      clock_fix_ms_p50: round1(p50(restores.map((w) => w.timings.clockFixMs))),
      warm_first_byte_ms_p50: round1(p50(warm)),
      wake_first_byte_ms_p50: round1(p50(wakeFirstByte)),
      wake_overhead_ms_p50: round1(p50(overheads)),
      clock_skew_before_ms_max: round1(Math.max(...restores.map((w) => Math.abs(w.timings.skewBeforeMs)))),
      clock_skew_after_ms_max: round1(Math.max(...restores.map((w) => Math.abs(w.timings.skewAfterMs)))),
      // Where the time of a hibernation and of a restore goes (the driver's phases, p50 of each over the rounds).
      hibernate_phases_ms_p50: phaseP50(phaseLog.get(memory)!.hibernate),
      wake_phases_ms_p50: phaseP50(phaseLog.get(memory)!.wake),
      ...(kept ? { kept_qemu: kept } : {}),
    };
  };

  const figures: Partial<Record<MemoryMode, Awaited<ReturnType<typeof runMode>>>> = {};
  for (const m of modes) figures[m] = await runMode(m);
  const result = {
    driver: qemu.name,
    accel: qemu.accel,
    qemu: qemu.qemuVersion,
    prestart,
    tcg_tb_mib: qemu.accel === "tcg" ? (tcgTbMiB ?? TCG_TB_MIB) : undefined,
    image: values.image ?? "demo",
    ...(imageBuild ?? {}),
    rounds,
    sleep_ms: sleepMs,
    ...(values.cold ? { cold_page_cache: true } : {}),
    // Others' work on the machine skews every figure: the 1-minute load average when the rounds ended.
    load_avg_1m: Math.round(loadavg()[0]! * 100) / 100,
    memory: values.memory,
    // One mode: its figures at the top level, as before; both: side by side under each mode's name.
    ...(modes.length === 1 ? figures[modes[0]!] : figures),
  };
  printResult(result);
} finally {
  await system.stop();
  rmSync(dataDir, { recursive: true, force: true });
}

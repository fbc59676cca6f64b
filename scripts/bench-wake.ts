// `npm run bench:wake`: boot, snapshot and wake timings of the qemu driver through the whole system (gateway → host → VM).
// Options: --rounds N (10), --sleep-ms MS (hibernated time before each wake, 2000), --warm N (20), --accel auto|kvm|tcg,
// --prestart (keep a QEMU waiting in -incoming defer), --image DIR (build the Containerfile in DIR through the API
// and run that instead of the demo, e.g. examples/node-agent), --path P (what each call asks for, /counter).
// Prints progress, then one `RESULT {json}` line.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { Readable } from "node:stream";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { silentLogger } from "../lib/log.ts";
import type { BootResult, RunningVm, SnapshotResult, VmDriver, VmSpec, WakeResult } from "../fleet-agent/drivers/driver.ts";
import { QemuDriver } from "../fleet-agent/drivers/qemu/driver.ts";
import { ensureGuestImage } from "../fleet-agent/guest/build-image.ts";
import { parseAllInOneConfig, startAllInOne } from "../compose/all-in-one.ts";

const { values } = parseArgs({
  options: {
    rounds: { type: "string", default: "10" },
    "sleep-ms": { type: "string", default: "2000" },
    warm: { type: "string", default: "20" },
    accel: { type: "string", default: process.env.QEMU_ACCEL ?? "auto" },
    prestart: { type: "boolean", default: false },
    image: { type: "string" },
    path: { type: "string", default: "/counter" },
    "data-dir": { type: "string", default: process.env.DATA_DIR ?? join(import.meta.dirname, "..", ".data") },
  },
});
const rounds = Number(values.rounds);
const sleepMs = Number(values["sleep-ms"]);
const warmCalls = Number(values.warm);
const accel = values.accel === "kvm" || values.accel === "tcg" ? values.accel : "auto";
const say = (line: string) => console.log(`bench:wake ${line}`);

/** Records what the driver itself reports, while the host drives it. */
class RecordingDriver implements VmDriver {
  readonly name;
  readonly isolated;
  boots: BootResult[] = [];
  snapshots: SnapshotResult[] = [];
  wakes: WakeResult[] = [];
  private readonly inner: QemuDriver;
  logPath(spec: VmSpec): string {
    return this.inner.logPath(spec);
  }
  constructor(inner: QemuDriver) {
    this.inner = inner;
    this.name = inner.name;
    this.isolated = inner.isolated;
  }
  async boot(spec: VmSpec) {
    const r = await this.inner.boot(spec);
    this.boots.push(r);
    return r;
  }
  async hibernate(vm: RunningVm, signal?: AbortSignal) {
    const r = await this.inner.hibernate(vm, signal);
    if (r.completed) this.snapshots.push(r);
    return r;
  }
  async wake(spec: VmSpec) {
    const r = await this.inner.wake(spec);
    this.wakes.push(r);
    return r;
  }
  stop(vm: RunningVm) {
    return this.inner.stop(vm);
  }
  destroy(spec: VmSpec) {
    return this.inner.destroy(spec);
  }
  cpuSeconds(vm: RunningVm) {
    return this.inner.cpuSeconds(vm);
  }
  guestLeases(vm: RunningVm) {
    return this.inner.guestLeases(vm);
  }
  onExit(vm: RunningVm, listener: Parameters<VmDriver["onExit"]>[1]) {
    this.inner.onExit(vm, listener);
  }
  reap(spec: VmSpec) {
    return this.inner.reap(spec);
  }
  close() {
    return this.inner.close();
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

const image = await ensureGuestImage({ dataDir: resolve(values["data-dir"]), log: say });
const qemu = new QemuDriver({ image, accel, prestart: values.prestart, log: silentLogger });
say(`accel ${qemu.accel} (${qemu.accelReason}); ${qemu.qemuVersion}; prestart ${values.prestart ? "on" : "off"}`);
const driver = new RecordingDriver(qemu);
const dataDir = mkdtempSync(join(tmpdir(), "bench-wake-"));
const env: Record<string, string> = { REAPER_INTERVAL_MS: "1000", PORT: "0", DATA_DIR: dataDir };
const system = await startAllInOne(parseAllInOneConfig(env, ["demo"]), { driver, log: silentLogger });

try {
  const headers = { authorization: `Bearer ${system.demo.token}`, "content-type": "application/json" };
  let imageName = "demo";
  let imageBuild: { build_ms: number; image_bytes: number } | undefined;
  if (values.image) {
    const t0 = performance.now();
    const tar = spawn("tar", ["-c", "-C", resolve(values.image), "."], { stdio: ["ignore", "pipe", "inherit"] });
    const built = await fetch(`${system.url}/v1/images?name=bench`, { method: "POST", headers: { authorization: headers.authorization }, body: Readable.toWeb(tar.stdout) as ReadableStream<Uint8Array>, duplex: "half" } as RequestInit);
    if (built.status !== 201) throw new Error(`build ${values.image}: ${built.status} ${await built.text()}`);
    const { image: img } = (await built.json()) as { image: { sizeBytes: number; digest: string } };
    imageBuild = { build_ms: round1(performance.now() - t0), image_bytes: img.sizeBytes };
    say(`image: built ${values.image} in ${imageBuild.build_ms} ms, ${img.sizeBytes} bytes, ${img.digest}`);
    imageName = "bench";
  }
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
  say(`boot: first byte ${round1(boot.ms)} ms (x-wake ${boot.wake}), driver boot ${round1(driver.boots[0]?.bootMs ?? NaN)} ms`);
  for (let i = 0; i < 3; i++) await firstByte(callPath); // connection pools, JIT
  const warm: number[] = [];
  for (let i = 0; i < warmCalls; i++) warm.push((await firstByte(callPath)).ms);
  say(`warm: first byte p50 ${round1(p50(warm))} ms over ${warmCalls} calls`);

  const wakeFirstByte: number[] = [];
  /** Per wake: what the gateway and fleet-agent add = first byte − restore − clock fix − a warm call's first byte. */
  const overheads: number[] = [];
  const modes: Record<string, number> = {};
  for (let r = 0; r < rounds; r++) {
    const hib = await fetch(`${system.url}/v1/agents/${agentId}/hibernate`, { method: "POST", headers });
    if (hib.status !== 200) throw new Error(`hibernate: ${hib.status} ${await hib.text()}`);
    await sleep(sleepMs);
    const w = await firstByte(callPath);
    wakeFirstByte.push(w.ms);
    modes[w.wake] = (modes[w.wake] ?? 0) + 1;
    const d = driver.wakes.at(-1);
    if (d?.mode === "restore") overheads.push(w.ms - d.timings.restoreMs - d.timings.clockFixMs - p50(warm));
    say(
      `round ${r + 1}/${rounds}: wake first byte ${round1(w.ms)} ms (x-wake ${w.wake}); snapshot ${round1(driver.snapshots.at(-1)?.snapshotMs ?? NaN)} ms; ` +
        `restore ${round1(d?.timings.restoreMs ?? NaN)} ms; clock fix ${round1(d?.timings.clockFixMs ?? NaN)} ms; skew ${round1(d?.timings.skewBeforeMs ?? NaN)} → ${round1(d?.timings.skewAfterMs ?? NaN)} ms`,
    );
  }

  const restores = driver.wakes.filter((w) => w.mode === "restore");
  const result = {
    driver: qemu.name,
    accel: qemu.accel,
    qemu: qemu.qemuVersion,
    prestart: values.prestart,
    image: values.image ?? "demo",
    ...(imageBuild ?? {}),
    rounds,
    sleep_ms: sleepMs,
    wake_modes: modes,
    boot_ms: round1(driver.boots[0]?.bootMs ?? NaN),
    snapshot_ms: round1(p50(driver.snapshots.map((s) => s.snapshotMs))),
    snapshot_bytes: driver.snapshots.at(-1)?.bytes ?? 0,
    restore_ms_p50: round1(p50(restores.map((w) => w.timings.restoreMs))),
    clock_fix_ms_p50: round1(p50(restores.map((w) => w.timings.clockFixMs))),
    warm_first_byte_ms_p50: round1(p50(warm)),
    wake_first_byte_ms_p50: round1(p50(wakeFirstByte)),
    wake_overhead_ms_p50: round1(p50(overheads)),
    clock_skew_before_ms_max: round1(Math.max(...restores.map((w) => Math.abs(w.timings.skewBeforeMs)))),
    clock_skew_after_ms_max: round1(Math.max(...restores.map((w) => Math.abs(w.timings.skewAfterMs)))),
  };
  console.log(`RESULT ${JSON.stringify(result)}`);
} finally {
  await system.stop();
  rmSync(dataDir, { recursive: true, force: true });
}

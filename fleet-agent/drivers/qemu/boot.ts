// A VM's cold boot on the qemu driver: QEMU started fresh, the guest agent's first answer, the zero pages of a
// file-backed RAM file made holes, the clock set, then the workload's (or a built image's) readiness.
import { mkdirSync } from "node:fs";
import { AppError } from "../../../lib/errors.ts";
import type { Logger } from "../../../lib/log.ts";
import { beginDiskGeneration, DEFAULT_DISK_MIB, ensureAgentDisk } from "../common/agent-disk.ts";
import { fixGuestClock } from "../common/guest-agent.ts";
import { ConsoleWatch, outOfMemoryHint, waitImageReady } from "../common/image-boot.ts";
import { waitForHttp } from "../common/readiness.ts";
import type { ClockFix } from "../common/restore-or-boot.ts";
import { capLog, withTail } from "../common/vm-process.ts";
import { allocatedBytes, punchZeroPages } from "../common/zero-holes.ts";
import type { RunningVm, VmSpec } from "../driver.ts";
import { RAM_ID, vmPaths } from "./args.ts";
import type { RamSpace } from "./ram-space.ts";
import type { GuestImagePaths } from "./options.ts";
import type { QemuSupervisor } from "./supervisor.ts";
import { runningVm, waitAgent, type QemuHost, type QemuVm } from "./vm.ts";

export interface BootDeps {
  host: Pick<QemuHost, "memory">;
  log: Logger;
  sup: Pick<QemuSupervisor, "settled" | "running" | "discardWaiting" | "imageFor" | "launch" | "smallPages">;
  /** Reserves the RAM file's blocks again after the boot's holes (ram-space.ts). */
  space: Pick<RamSpace, "reserve">;
  /** QemuDriverOptions.bootTimeoutMs. */
  bootTimeoutMs: number | undefined;
}

/** A cold boot to a guest whose workload answers (`boot_failed` for a built image that does not); the boot's clock fix with it. */
export async function coldBoot(d: BootDeps, spec: VmSpec, started: number): Promise<{ vm: RunningVm; clock: ClockFix }> {
  await d.sup.settled(spec.vmId);
  if (d.sup.running.has(spec.vmId)) throw new Error(`VM ${spec.vmId} is already running`);
  await d.sup.discardWaiting(spec.vmId);
  const image = await d.sup.imageFor(spec);
  const deadline = started + (d.bootTimeoutMs ?? 120_000);
  if (spec.rootImage) return bootImage(d, spec, image, started, deadline);
  const vp = await d.sup.launch(spec, image, false, { memory: d.host.memory, ramId: RAM_ID });
  try {
    await waitAgent(vp, deadline, "guest agent did not answer before the boot deadline");
    const holes = await holesAfterBoot(d, vp);
    // The RTC gives the guest whole seconds at boot; set it to the millisecond like after a restore.
    const clock = await fixGuestClock(vp.agent!, { sameNetwork: true }); // a fresh guest: no neighbour to forget
    await waitForHttp(runningVm(vp).endpoint, { deadline, gaveUp: () => vp.proc.exitedWhy("QEMU") });
    await holes.recached;
    d.sup.running.set(spec.vmId, vp);
    d.log.info("booted", { vmId: spec.vmId, pid: vp.proc.pid, port: vp.hostPort, bootMs: Math.round(performance.now() - started), ...holes.done });
    return { vm: runningVm(vp), clock };
  } catch (err) {
    await vp.proc.kill();
    throw withTail(err as Error, await vp.proc.finalOutput(), "qemu");
  }
}

/**
 * A built image's cold boot: its disk (created on the first boot) starts a new generation, then QEMU with the three
 * drives; ready when the agent answers on its port. Every failure is `boot_failed` with the reason and the console's
 * tail: an entrypoint that exits (the init says so on the console, and powers off) fails it at once, one that never
 * answers at the boot deadline.
 */
async function bootImage(d: BootDeps, spec: VmSpec, image: GuestImagePaths, started: number, deadline: number): Promise<{ vm: RunningVm; clock: ClockFix }> {
  const config = spec.rootImage!.config;
  const paths = vmPaths(spec.stateDir);
  mkdirSync(spec.stateDir, { recursive: true });
  capLog(paths.console);
  const consoleWatch = new ConsoleWatch(paths.console);
  let vp: QemuVm | undefined;
  try {
    const disk = await ensureAgentDisk(spec.stateDir, spec.diskMiB ?? DEFAULT_DISK_MIB, d.log.child({ vmId: spec.vmId }));
    await beginDiskGeneration(disk);
    vp = await d.sup.launch(spec, image, false, { memory: d.host.memory, ramId: RAM_ID });
    const launched = vp;
    const gaveUp = () => {
      const said = consoleWatch.failure();
      if (said) return `the image's ${said}`;
      return launched.proc.exitedWhy("QEMU");
    };
    await waitAgent(vp, deadline, "guest agent did not answer before the boot deadline", gaveUp);
    const holes = await holesAfterBoot(d, vp);
    const clock = await fixGuestClock(vp.agent!, { sameNetwork: true }); // a fresh guest: no neighbour to forget
    const agent = vp.agent!;
    await waitImageReady(runningVm(vp).endpoint, config, { deadline, gaveUp, listening: (port, ms) => agent.listening(port, ms) });
    await holes.recached;
    d.sup.running.set(spec.vmId, vp);
    d.log.info("booted", {
      vmId: spec.vmId,
      image: spec.rootImage!.digest,
      pid: vp.proc.pid,
      port: vp.hostPort,
      bootMs: Math.round(performance.now() - started),
      ...holes.done,
    });
    return { vm: runningVm(vp), clock };
  } catch (err) {
    if (vp) await vp.proc.kill();
    const qemuSaid = vp ? await vp.proc.finalOutput() : "";
    const reason = withTail(err as Error, qemuSaid, "qemu").message;
    const tail = consoleWatch.tail();
    throw new AppError(
      "boot_failed",
      `agent ${spec.agentId} did not boot: ${outOfMemoryHint(consoleWatch, spec.memMiB)}${reason}${tail ? ` (console: ${tail})` : ""}`,
      {
        cause: err,
      },
    );
  }
}

/**
 * File-backed RAM, once a cold-booted guest's kernel is up (its agent answered): the kernel zeroed all of its memory
 * at boot (init_on_free=1 frees every page through the zeroing path), which wrote the whole RAM file out and left it
 * all dirty for the first hibernation to write back (measured: 255 MiB, 140 ms). The guest is stopped while the zero
 * pages become holes (zero-holes.ts: safe only while nothing writes the file) and their blocks are reserved again
 * (ram-space.ts: unwritten extents, nothing to write back), then runs on; the clock fix that follows covers the pause.
 * The holes' pages left the page cache: `recached` caches them again in 4 KiB pages (see smallPages) while the guest
 * runs on, which only the page cache sees; the caller awaits it before the VM is ready. A filesystem that cannot punch
 * holes keeps the file as it was (logged). What it did goes in `booted` (`ramDataMiB`: what the guest holds after its boot).
 */
async function holesAfterBoot(d: BootDeps, vp: QemuVm): Promise<{ done?: { holesMs: number; ramDataMiB: [number, number] }; recached?: Promise<void> }> {
  if (vp.memory !== "file") return {};
  const t0 = performance.now();
  const mib = (bytes: number) => Math.round(bytes / 2 ** 20);
  await vp.qmp!.execute("stop");
  let data: [number, number];
  try {
    const before = await allocatedBytes(vp.paths.ram);
    await punchZeroPages(vp.paths.ram);
    data = [mib(before), mib(await allocatedBytes(vp.paths.ram))];
  } catch (err) {
    d.log.warn("RAM file kept without holes for its zero pages", { vmId: vp.spec.vmId, err: (err as Error).message });
    return {};
  } finally {
    // Before the guest runs on: every block of the file reserved again (a failure fails the boot, its guest stopped).
    await d.space.reserve(vp.paths.ram);
    await vp.qmp!.execute("cont");
  }
  return { done: { holesMs: Math.round(performance.now() - t0), ramDataMiB: data }, recached: d.sup.smallPages(vp.spec, vp.paths.ram) };
}

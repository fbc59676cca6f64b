// A wake's restore on the qemu driver (common/restore-or-boot.ts decides restore or boot): the snapshot checked
// against this host and the VM's files, loaded into a QEMU in `-incoming defer` (pre-started, kept paused, or new),
// new disk and RAM generations, `cont`; a clone's first answer and fresh identity before its clock is fixed.
import { createHash, randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { readFile, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import { diskChange, diskFingerprint, stageDiskGeneration, type DiskFingerprint } from "../common/agent-disk.ts";
import { processAlive } from "../common/proc.ts";
import { RestoreFailed, WakeRefused, type Restored } from "../common/restore-or-boot.ts";
import { freeBytes, saysNoSpace } from "../common/snapshot-space.ts";
import { sha256File } from "../common/snapshot-files.ts";
import { withTail } from "../common/vm-process.ts";
import type { VmSpec } from "../driver.ts";
import { machineArgs, shellQuote, vmPaths, type VmPaths } from "./args.ts";
import { sendIncoming, setIgnoreShared, waitMigration } from "./migration.ts";
import type { QemuDriverOptions } from "./options.ts";
import { Phases } from "./phases.ts";
import { ramChange, ramDurability, ramFingerprint, stageRamGeneration } from "./ram-file.ts";
import { ramPlan } from "./ram-plan.ts";
import type { RamSpace } from "./ram-space.ts";
import { forwardedAddresses, incompatibility, readManifest, snapshotMemory, type SnapshotManifest } from "./snapshot.ts";
import type { QemuSupervisor } from "./supervisor.ts";
import { guestHostname, openAgent, runningVm, waitAgent, type QemuHost, type QemuVm } from "./vm.ts";

/** Snapshots up to this size (device state: tens of KB) are read whole and handed to QEMU over a socket on restore. */
const SOCKET_STATE_MAX_BYTES = 16 << 20;
/** A state directory with less free than this is full for QEMU's own files (pid file, sockets, log). */
const FULL_BELOW_BYTES = 1 << 20;

export interface RestoreDeps {
  host: QemuHost;
  sup: Pick<QemuSupervisor, "readPort" | "takeWaiting" | "settled" | "imageFor" | "launch" | "running">;
  opts: Pick<QemuDriverOptions, "restoreTimeoutMs" | "beforeGenerations" | "beforeCont" | "afterCont">;
  /** RAM files' space: a sleeping VM's dig ended before its file is reserved (ram-space.ts). */
  space: Pick<RamSpace, "cancel" | "reserve">;
}

/**
 * The snapshot, if usable, loaded into a QEMU waiting in `-incoming defer` (pre-started or new), then `cont`;
 * RestoreFailed when a cold boot is the way out. Device state (file-backed RAM) is verified before QEMU gets it;
 * all of guest RAM (streamed) while QEMU loads the file. The guest runs only if the checksum matches. A QEMU kept
 * stopped after its hibernation (`prestart: "paused"`) that holds this very snapshot loads nothing: it runs on.
 * Phases (qemu/phases.ts) go into the "restored" log line.
 */
export async function restoreVm(d: RestoreDeps, spec: VmSpec, undo: (step: () => Promise<unknown>) => void, started = performance.now()): Promise<Restored> {
  const phases = new Phases(started);
  const paths = vmPaths(spec.stateDir);
  // A dig of the RAM file changes its mtime until it ends (ram-space.c puts it back): ended before the file is checked,
  // and a dig asked for later (a RAM write-back or a kept QEMU that ends meanwhile) no longer starts.
  await d.space.cancel(spec.vmId);
  const [{ manifest, problem }, hostPort] = await Promise.all([readManifest(paths.manifest), d.sup.readPort(paths)]);
  if (!manifest) throw new RestoreFailed(problem ?? "no snapshot");
  // How this QEMU holds RAM: as the snapshot does, whatever the host's mode is now (a streamed one converts to it).
  const plan = ramPlan(d.host.memory, manifest);
  const targetArgs = machineArgs({
    spec,
    paths,
    accel: d.host.accel,
    hostPort: hostPort ?? 0,
    memory: plan.memory,
    ramId: plan.ramId,
    egressRelay: d.host.egressRelay,
  });
  const bad = incompatibility(manifest, {
    qemuVersion: d.host.qemuVersion,
    accel: d.host.accel,
    hostCpu: d.host.hostCpu,
    memMiB: spec.memMiB,
    vcpus: spec.vcpus,
    machineArgs: targetArgs,
  });
  if (bad) throw new RestoreFailed(bad);
  const file = join(spec.stateDir, manifest.file);
  if (!existsSync(file)) throw new RestoreFailed(`snapshot file ${manifest.file} is missing`);
  const stale = await snapshotStale(d.host, spec, paths, manifest);
  if (stale) throw new RestoreFailed(stale);
  const mismatch = (r: { sha256: string; bytes: number }) =>
    r.sha256 === manifest.sha256 && r.bytes === manifest.bytes
      ? undefined
      : `snapshot checksum mismatch (${r.bytes} bytes, sha256 ${r.sha256.slice(0, 12)}…, manifest says ${manifest.sha256.slice(0, 12)}…)`;
  // Device state only (file-backed RAM): read and verified before QEMU sees it, then handed over a socket
  // (`sendIncoming`). All of guest RAM (streamed): QEMU reads the file itself while it is checksummed beside it.
  let state: Buffer | undefined;
  let verify: Promise<string | undefined> = Promise.resolve(undefined);
  if (snapshotMemory(manifest) === "file" && manifest.bytes <= SOCKET_STATE_MAX_BYTES) {
    state = await readFile(file).catch((err: Error) => {
      throw new RestoreFailed(`snapshot unreadable: ${err.message}`, { cause: err });
    });
    const badData = mismatch({ sha256: createHash("sha256").update(state).digest("hex"), bytes: state.length });
    if (badData) throw new RestoreFailed(badData);
  } else {
    verify = sha256File(file).then(mismatch, (err: Error) => `snapshot unreadable: ${err.message}`);
    undo(() => verify);
  }
  phases.mark("checks");
  // A pre-started QEMU maps the VM's own RAM file with shared pages skipped: only that plan can use it; so does an
  // adopted reset standby (standby.ts), kept paused over the checkpoint RAM file the plan names.
  let vp = d.sup.takeWaiting(spec);
  if (vp && !plan.prestartable && !(vp.pausedAt !== undefined && plan.templateRam !== undefined && vp.templateRam === plan.templateRam)) {
    await endWaiting(vp);
    vp = undefined;
  }
  if (!vp) await d.sup.settled(spec.vmId); // a kept one just ended (`endKept`) still holds the VM's port and sockets
  // One that died while it waited (killed, out of memory) is of no use: the files restore into a new QEMU. Its exit
  // event may not have arrived yet, so the process itself is asked.
  // One that holds RAM otherwise than this snapshot needs (started before the host's setting changed) is of no use either.
  // And one whose egress listener was opened for another `allowEgress` (changed while the agent slept).
  if (
    vp &&
    (vp.proc.exit ||
      vp.proc.pid === undefined ||
      !processAlive(vp.proc.pid) ||
      vp.memory !== plan.memory ||
      vp.ramId !== plan.ramId ||
      vp.templateRam !== plan.templateRam ||
      vp.spec.allowEgress !== spec.allowEgress)
  ) {
    await endWaiting(vp).catch(() => undefined);
    vp = undefined;
  }
  // A QEMU kept stopped after its hibernation holds exactly one snapshot: this one, or it is of no use.
  const paused = vp?.pausedAt !== undefined && vp.pausedAt === `${manifest.file}:${manifest.sha256}`;
  if (vp?.pausedAt !== undefined && !paused) {
    await endWaiting(vp);
    vp = undefined;
  }
  // An adopted standby's own disk becomes the VM's now: its guest runs on it from the `cont` below, and the disk the
  // restore wrote (the checkpoint's copy, which the snapshot pairs with) pairs with nothing once a guest runs.
  if (paused && vp?.pendingDisk) {
    await rename(vp.pendingDisk, paths.disk);
    vp.pendingDisk = undefined;
  }
  // Once the guest runs it writes its disk and RAM file: no snapshot taken before pairs with them again. The new
  // generations are staged (written and synced beside the files) while QEMU starts and loads, and committed (renamed
  // into place) just before `cont`: a host killed before that leaves the snapshot valid, since no guest ran on it.
  // The VM's own RAM file gets every block it lacks (the dig of its sleep ended above) before its guest runs on it:
  // a full disk then fails this wake (WakeRefused: a cold boot would throw the snapshot away) instead of
  // killing the VM later (ram-space.ts). A kept paused QEMU's file was never dug: it is still reserved.
  // A streamed snapshot's load into file-backed RAM (`convert`) gets a fresh RAM file, reserved, in a generation of
  // its own from its launch: the snapshot does not pair with the RAM file, so a kill before `cont` leaves it valid.
  const ownRam = plan.memory === "file" && !plan.templateRam && !plan.convert;
  const reserved = ownRam && !paused ? d.space.reserve(paths.ram) : Promise.resolve();
  const generations = reserved.then(() =>
    Promise.all([spec.rootImage ? stageDiskGeneration(paths.disk) : undefined, ownRam ? stageRamGeneration(paths) : undefined]),
  );
  generations.catch(() => undefined); // awaited before `cont`
  undo(() => generations); // a cold boot after a failure here starts a generation of its own: not at the same time
  const launchedHere = !vp;
  if (!vp) {
    const image = await d.sup.imageFor(spec);
    try {
      vp = await d.sup.launch(spec, image, true, plan, phases);
    } catch (err) {
      // A RAM file that could not be reserved says best why (a full disk fails QEMU's own start too).
      const refused = await reserved.then(
        () => undefined,
        (e: unknown) => e,
      );
      if (refused instanceof WakeRefused) throw refused;
      const why = `QEMU did not start for the restore: ${(err as Error).message}`;
      // QEMU does not always say why a file of its own could not be written (its pid file): the free space does.
      const free = await freeBytes(spec.stateDir);
      if (saysNoSpace(why) || (free !== undefined && free < FULL_BELOW_BYTES))
        throw new WakeRefused(`${why} (${free ?? "?"} bytes free in ${spec.stateDir})`, { cause: err });
      throw new RestoreFailed(why, { cause: err });
    }
  } else phases.mark("prestarted");
  const prestarted = !paused && !launchedHere;
  const launched = vp;
  undo(() => launched.proc.kill());
  const deadline = performance.now() + (d.opts.restoreTimeoutMs ?? 60_000);
  try {
    const agentReady = openAgent(vp);
    if (!paused) {
      if (state) await sendIncoming(vp, state);
      else await vp.qmp!.execute("migrate-incoming", { uri: `exec:cat ${shellQuote(file)}` });
      phases.mark("incomingCmd");
      const info = await waitMigration(vp, { timeoutMs: deadline - performance.now() });
      phases.mark("load");
      if (info.status !== "completed") throw new RestoreFailed(`restore ${info.status}: ${info["error-desc"] ?? "no detail"}`);
      const badData = await verify;
      if (badData) throw new RestoreFailed(badData);
      // Converted: the pages are in the RAM file now; from here on migrations skip it, as for any file-backed VM.
      if (plan.convert) await setIgnoreShared(vp, true);
    }
    await agentReady;
    phases.mark("verifyAgentSocket");
    await d.opts.beforeGenerations?.(vp.proc.pid);
    const [disk, ram] = await generations;
    await Promise.all([disk?.commit(), ram?.commit()]);
    phases.mark("generations");
    await d.opts.beforeCont?.(vp.proc.pid);
    // A paused one's `cont` after its completed migration also takes its drives back (as after a checkpoint).
    await vp.qmp!.execute("cont");
    vp.pausedAt = undefined;
    vp.digTicket = undefined;
    phases.mark(paused ? "contPaused" : "cont");
    await d.opts.afterCont?.(vp.proc.pid);
  } catch (err) {
    // Damaged data can make QEMU itself fail the load (or exit): the checksum then says what was wrong.
    const badData = await verify;
    if (badData) throw new RestoreFailed(badData, { cause: err });
    if (err instanceof RestoreFailed || err instanceof WakeRefused) throw err;
    throw new RestoreFailed(withTail(err as Error, await vp.proc.finalOutput(), "qemu").message, { cause: err });
  }
  d.sup.running.set(spec.vmId, vp);
  const clonedFrom = manifest.clonedFrom;
  // The guest's first answer may take what the restore has left of its deadline: once it runs (`cont`), its disk and
  // RAM have moved on from the snapshot, so giving up means a cold boot, which on a host busy enough to starve the
  // guest takes far longer still (a wait of 10 s here once sent clones of a full host into 90-124 s cold boots).
  const answerWithinMs = Math.max(100, deadline - performance.now());
  return {
    vm: runningVm(vp),
    // The guest's first answer is the clock fix's first request (one round trip fewer on the wake's path); a clone
    // is first pinged, then given its identity before anything else reaches it.
    ...(clonedFrom ? {} : { firstAnswerWithinMs: answerWithinMs }),
    // The guest's neighbour check at the clock fix matters only when an address it could not resolve may now answer.
    sameNetwork: paused || forwardedAddresses(manifest.machineArgs).join(" ") === forwardedAddresses(targetArgs).join(" "),
    guestAgent: async () => {
      if (!clonedFrom) return launched.agent!;
      const agent = await waitAgent(launched, performance.now() + answerWithinMs, "guest agent did not answer after the restore");
      phases.mark("agentPing");
      // A copy of another moment's memory: its RNG state, hostname and id are the checkpoint's until told otherwise.
      await agent.identity({ agentId: spec.agentId, hostname: guestHostname(spec.agentId), entropy: randomBytes(32), clonedFrom });
      phases.mark("identity");
      return agent;
    },
    // The phases object is still filled in by guestAgent above: the "restored" line is written after it.
    detail: { ...(clonedFrom ? { clonedFrom } : {}), phases: phases.ms },
    ...takenAt(manifest.createdAt),
    tier: paused ? "kept" : prestarted ? "prestarted" : "files",
  };
}

/** Ends a kept QEMU the wake does not use, and the disk of its own an adopted standby had (standby.ts). */
async function endWaiting(vp: QemuVm): Promise<void> {
  await vp.proc.kill();
  if (vp.pendingDisk) await rm(vp.pendingDisk, { force: true });
}

/** Why the snapshot no longer pairs with the VM's disk or RAM file (something ran on them since); undefined when it does. */
export async function snapshotStale(host: Pick<QemuHost, "bootId">, spec: VmSpec, paths: VmPaths, manifest: SnapshotManifest): Promise<string | undefined> {
  // The memory is valid only over the disk it was taken with (common/agent-disk.ts).
  if (spec.rootImage) {
    const now = await diskFingerprint(paths.disk).catch((): DiskFingerprint | undefined => undefined);
    const changed = diskChange(manifest.disk, now);
    if (changed) return changed;
  }
  // A template's clone: the template's RAM file must be the one it was made from (templates are never rewritten).
  if (manifest.templateRam) {
    const { path, ...recorded } = manifest.templateRam;
    return ramChange(recorded, await ramFingerprint({ ram: path, ramGeneration: `${path}.gen` }), spec.memMiB);
  }
  if (!manifest.ram) return undefined; // RAM streamed into the data file: nothing else to pair with
  // The device state is valid only over the RAM file it was taken with (ram-file.ts says what is checked and why),
  // and only if that file's pages survived: a reboot during their write-back may have torn them.
  return ramChange(manifest.ram, await ramFingerprint(paths), spec.memMiB) ?? (await ramDurability(paths, manifest, host.bootId));
}

/** A manifest's `createdAt` as `Restored.takenAt` (nothing when it cannot be read). */
function takenAt(createdAt: string): { takenAt?: number } {
  const at = Date.parse(createdAt);
  return Number.isFinite(at) ? { takenAt: at } : {};
}

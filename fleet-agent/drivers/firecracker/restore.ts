// Wake of a Firecracker VM: its snapshot checked and loaded into a new process (`vsock_override` and
// `network_overrides` where this VM's differ), a clone given a fresh identity; common/restore-or-boot.ts fixes the
// guest clock and boots cold when the restore cannot be done.
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "../../../lib/log.ts";
import { agentDiskPath, beginDiskGeneration, diskChange, diskFingerprint, type DiskFingerprint } from "../common/agent-disk.ts";
import { guestHostname } from "../common/launch-data.ts";
import { RestoreFailed, restoreOrBoot, type Restored } from "../common/restore-or-boot.ts";
import type { BootResult, VmSpec, WakeResult } from "../driver.ts";
import { FirecrackerApiError, type Drive, type SnapshotLoadParams } from "./api.ts";
import { prepareNet } from "./boot.ts";
import type { FirecrackerHostFacts } from "./host.ts";
import { drivesChange, imageDrives } from "./image-drives.ts";
import { prepareImageFiles, stageDrives } from "./image-files.ts";
import type { FirecrackerDriverOptions } from "./options.ts";
import type { VmPaths } from "./paths.ts";
import { incompatibility, readManifest, removeStaleSnapshotFiles, verifyFiles, type SnapshotImage, type SnapshotManifest } from "./snapshot.ts";
import type { FirecrackerProcesses, Live } from "./supervisor.ts";
import { waitForGuestAgent } from "./vsock.ts";

const LOAD_OPTIONAL_FIELDS = ["clock_realtime", "network_overrides", "track_dirty_pages"] as const;

export interface RestoreDeps {
  opts: Pick<FirecrackerDriverOptions, "network" | "jailer" | "verifyChecksums" | "diffSnapshots" | "clockRealtime" | "restoreTimeoutMs" | "clockTargetMs">;
  log: Logger;
  agentPort: number;
  vms: Pick<FirecrackerProcesses, "paths" | "spawn" | "kill">;
  ready(): Promise<FirecrackerHostFacts>;
  /** The way out when the snapshot cannot be restored. */
  coldBoot(spec: VmSpec, started: number): Promise<BootResult>;
  /** Optional load fields this firecracker rejected as unknown: not sent again. */
  unsupportedLoadFields: Set<string>;
}

/** The VM from its snapshot, its guest clock fixed; a cold boot with `fallbackReason` when that cannot be. */
export async function wake(deps: RestoreDeps, spec: VmSpec): Promise<WakeResult> {
  const started = performance.now();
  const host = await deps.ready();
  return restoreOrBoot({
    spec,
    log: deps.log,
    started,
    clockTargetMs: deps.opts.clockTargetMs ?? 50,
    restore: (undo) => restore(deps, spec, host, undo),
    boot: () => deps.coldBoot(spec, performance.now()),
  });
}

/** The snapshot, if usable, loaded into a new Firecracker; RestoreFailed when a cold boot is the way out. */
async function restore(deps: RestoreDeps, spec: VmSpec, host: FirecrackerHostFacts, undo: (step: () => Promise<void>) => void): Promise<Restored> {
  const { opts, vms } = deps;
  const paths = vms.paths(spec);
  await removeStaleSnapshotFiles(paths.snapDir);
  const { manifest, problem } = await readManifest(paths.snapDir);
  if (!manifest) throw new RestoreFailed(problem ?? "no snapshot");
  const bad = incompatibility(manifest, host, spec) ?? (await verifyFiles(paths.snapDir, manifest, { checksums: opts.verifyChecksums ?? true }));
  if (bad) throw new RestoreFailed(bad);
  const drives = manifest.image ? await restorableDrives(deps, spec, paths, manifest.image) : undefined;

  const net = await prepareNet(opts.network, spec);
  // The guest's address is in its memory (init.sh applied the boot's `ip=` once): only its own slot carries it.
  if (manifest.guestIp && manifest.guestIp !== net.guestIp) {
    throw new RestoreFailed(
      `the snapshot's guest has address ${manifest.guestIp}, this VM's network slot gives ${net.guestIp} (a restored guest cannot be re-addressed)`,
    );
  }
  const live = await vms.spawn(spec, net);
  live.drives = drives;
  undo(() => vms.kill(live));
  try {
    await load(deps, live, manifest);
  } catch (err) {
    const why = err instanceof FirecrackerApiError ? err.faultMessage : (err as Error).message;
    throw new RestoreFailed(`firecracker refused the snapshot: ${why}`, { cause: err });
  }
  if (opts.diffSnapshots) live.diffBase = manifest.generation;
  const deadlineMs = opts.restoreTimeoutMs ?? 10_000;
  const clonedFrom = manifest.clonedFrom;
  return {
    vm: live.vm,
    detail: { generation: manifest.generation, ...(clonedFrom ? { clonedFrom } : {}) },
    ...(Number.isFinite(Date.parse(manifest.createdAt)) ? { takenAt: Date.parse(manifest.createdAt) } : {}),
    guestAgent: async () => {
      const agent = await waitForGuestAgent(live.paths.vsock, deps.agentPort, { deadlineMs, gaveUp: () => live.proc.exitedWhy("firecracker") });
      live.agent = agent;
      // A copy of another moment's memory: its RNG state, hostname and id are the checkpoint's until told otherwise.
      if (clonedFrom) await agent.identity({ agentId: spec.agentId, hostname: guestHostname(spec.agentId), entropy: randomBytes(32), clonedFrom });
      return agent;
    },
  };
}

/**
 * A built image's snapshot is loadable only over the disk it was taken with, and with every drive file at the path
 * the snapshot names (Firecracker reopens them itself). RestoreFailed otherwise: a cold boot then uses the disk as
 * it is. Passing, the disk starts a new generation, since the restored guest writes to it from now on.
 */
async function restorableDrives(deps: RestoreDeps, spec: VmSpec, paths: VmPaths, recorded: SnapshotImage): Promise<Drive[]> {
  const disk = agentDiskPath(resolve(spec.stateDir));
  const changed = diskChange(recorded.disk, await diskFingerprint(disk).catch((): DiskFingerprint | undefined => undefined));
  if (changed) throw new RestoreFailed(changed);
  const rootfs = spec.rootImage!.rootfs;
  if (!existsSync(rootfs)) throw new RestoreFailed(`the image's root filesystem ${rootfs} is missing`);
  const drives = imageDrives(await stageDrives(spec, paths, await prepareImageFiles(spec, "restore", deps.log), deps.opts.jailer));
  const moved = drivesChange(recorded.drives, drives);
  if (moved) throw new RestoreFailed(moved);
  await beginDiskGeneration(disk);
  return drives;
}

/** PUT /snapshot/load; an optional field this firecracker does not know is dropped and the load retried once. */
async function load(deps: RestoreDeps, live: Live, manifest: SnapshotManifest): Promise<void> {
  const { opts, unsupportedLoadFields } = deps;
  const at = (file: string) => live.paths.vm(join(live.paths.snapDir, file));
  const files = { state: at(manifest.state.file), mem: at(manifest.mem.file) };
  for (;;) {
    const body: SnapshotLoadParams = {
      snapshot_path: files.state,
      mem_backend: { backend_type: "File", backend_path: files.mem },
      resume_vm: true,
    };
    if (opts.diffSnapshots) body.track_dirty_pages = true;
    if (opts.clockRealtime ?? true) body.clock_realtime = true;
    if (manifest.tap && manifest.tap !== live.net.tap) body.network_overrides = [{ iface_id: "eth0", host_dev_name: live.net.tap }];
    // A checkpoint's state names its source's vsock socket: this VM's is bound instead (no retry without it).
    const vsock = live.paths.vm(live.paths.vsock);
    if (manifest.vsock && manifest.vsock !== vsock) body.vsock_override = { uds_path: vsock };
    for (const field of unsupportedLoadFields) delete (body as unknown as Record<string, unknown>)[field];
    try {
      await live.api.loadSnapshot(body);
      return;
    } catch (err) {
      const fault = err instanceof FirecrackerApiError ? err.faultMessage : "";
      const unknown = /unknown field/i.test(fault) ? LOAD_OPTIONAL_FIELDS.find((f) => f in body && fault.includes(f)) : undefined;
      if (!unknown) throw err;
      unsupportedLoadFields.add(unknown);
      deps.log.warn("firecracker does not know a snapshot load field; retrying without it", { field: unknown });
      // A parse error leaves the process usable; if it ended anyway, the caller falls back to a cold boot.
      await sleep(50);
      if (live.proc.exit) throw err;
    }
  }
}

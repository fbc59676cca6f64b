// A built image's VM's drive files on the host (its disk, the launch drive), staged where its Firecracker opens them,
// and its disk as the paused guest left it: shared by boot, restore, hibernate and checkpoint.
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import type { Logger } from "../../../lib/log.ts";
import { agentDiskPath, DEFAULT_DISK_MIB, diskFingerprint, ensureAgentDisk, type DiskFingerprint } from "../common/agent-disk.ts";
import { LAUNCH_DRIVE_FILE, makeLaunchDrive } from "../common/launch-data.ts";
import { fsyncPath } from "../common/snapshot-files.ts";
import type { VmSpec } from "../driver.ts";
import { stageImageFiles, type ImageDriveFiles } from "./image-drives.ts";
import type { JailerOptions } from "./options.ts";
import type { VmPaths } from "./paths.ts";

/**
 * A built image's drive files on the host: its disk (created on the first boot) and the launch drive, made afresh
 * for a boot. A restore only needs the launch drive to be there (the guest read it at boot; Firecracker reopens it),
 * so the one from the boot is kept: making it costs 20–40 ms of every wake.
 */
export async function prepareImageFiles(spec: VmSpec, purpose: "boot" | "restore", log: Logger): Promise<ImageDriveFiles> {
  const image = spec.rootImage!;
  const stateDir = resolve(spec.stateDir); // Firecracker runs in the stateDir: every path it is given is absolute
  const disk = await ensureAgentDisk(stateDir, spec.diskMiB ?? DEFAULT_DISK_MIB, log.child({ vmId: spec.vmId }));
  const kept = join(stateDir, LAUNCH_DRIVE_FILE);
  const launch =
    purpose === "restore" && existsSync(kept)
      ? kept
      : await makeLaunchDrive(stateDir, image.config, { agentId: spec.agentId, port: image.config.port, ...(spec.desktop ? { desktop: spec.desktop } : {}) });
  return { image: resolve(image.rootfs), disk, launch };
}

/** The drive files where the Firecracker process opens them (in the jailer's chroot, when jailed). */
export function stageDrives(
  spec: VmSpec,
  paths: Pick<VmPaths, "root" | "vm">,
  files: ImageDriveFiles,
  jailer: JailerOptions | undefined,
): Promise<ImageDriveFiles> {
  return stageImageFiles(files, {
    root: paths.root,
    vm: paths.vm,
    imageDigest: spec.rootImage!.digest,
    ...(jailer ? { jailer: { uid: jailer.uid, gid: jailer.gid } } : {}),
  });
}

/** The disk as the paused guest left it: on stable storage before a manifest pairs memory with it, and its fingerprint. */
export async function pausedDisk(spec: VmSpec): Promise<DiskFingerprint> {
  const disk = agentDiskPath(resolve(spec.stateDir));
  await fsyncPath(disk);
  return diskFingerprint(disk);
}

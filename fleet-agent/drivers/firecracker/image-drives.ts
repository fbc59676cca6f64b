// A built image's drives under Firecracker: the image read-only, the agent's disk, the launch drive (in that order),
// their files made reachable by the Firecracker process (linked into the jailer's chroot), and the check that a
// snapshot's drives are still the ones the VM would get.
//
// Firecracker restores the drives from the snapshot's own state (a PUT /drives before /snapshot/load is refused:
// "not allowed after configuring boot-specific resources"), opening the same `path_on_host`s again. So a restore
// needs the files at the paths they had at boot: under the jailer those are chroot paths (`/image.ext4`, …), the
// files linked there anew before every start (a hard link is the same file; a copy would not be, for the disk).
import { chown, copyFile, link, readFile, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Drive } from "./api.ts";

/** Host paths of the three files. */
export interface ImageDriveFiles {
  /** The image's ext4 root filesystem (shared by every agent of the image). */
  image: string;
  /** The agent's persistent disk (`<stateDir>/disk.ext4`). */
  disk: string;
  /** The per-boot launch drive (`<stateDir>/launch.ext4`). */
  launch: string;
}

/** Names of the files inside a jailer's chroot. */
const IN_CHROOT: ImageDriveFiles = { image: "image.ext4", disk: "disk.ext4", launch: "launch.ext4" };

/**
 * The PUT /drives bodies, in the order they are sent (the guest finds them by filesystem label, so the order only
 * keeps the device names stable). None is the root device: our initramfs stays the root and mounts the image itself.
 */
export function imageDrives(visible: ImageDriveFiles): Drive[] {
  return [
    { drive_id: "image", is_root_device: false, is_read_only: true, path_on_host: visible.image },
    { drive_id: "disk", is_root_device: false, is_read_only: false, path_on_host: visible.disk },
    { drive_id: "launch", is_root_device: false, is_read_only: true, path_on_host: visible.launch },
  ];
}

/** Why the drives a snapshot recorded are not the ones the VM would get now (undefined when they are). */
export function drivesChange(recorded: readonly Drive[], now: readonly Drive[]): string | undefined {
  const describe = (ds: readonly Drive[]) => ds.map((d) => `${d.drive_id}=${d.path_on_host ?? "?"}${d.is_read_only ? " (ro)" : ""}`).join(", ");
  if (describe(recorded) === describe(now)) return undefined;
  return `the snapshot's drives (${describe(recorded)}) are not the VM's now (${describe(now)})`;
}

export interface StageOptions {
  /** The Firecracker process's root: the stateDir, or the jailer's chroot. */
  root: string;
  /** Host path → the path the Firecracker process opens. */
  vm: (hostPath: string) => string;
  /** Under the jailer: who Firecracker runs as (it must open the disk read-write). */
  jailer?: { uid: number; gid: number };
  /** The image's digest: a copy of it in the chroot that says so (beside it) is not made again. */
  imageDigest: string;
}

/**
 * Makes the files reachable by the Firecracker process and answers their paths as it sees them. Without the jailer
 * they are used where they are. Under it each is hard-linked into the chroot: the disk and the launch drive are in
 * the stateDir, on the chroot's filesystem, so their links cannot fail short of a broken stateDir (and a copy of the
 * disk would lose every write); the image may be elsewhere and is copied when a link is not possible (it is
 * read-only, so a copy is the same drive, only slower to make, and kept for the next start while its digest matches).
 * The image's link is not chowned: it is the shared image file itself, and Firecracker only reads it (it must be
 * world-readable, as the image store writes it).
 */
export async function stageImageFiles(files: ImageDriveFiles, opts: StageOptions): Promise<ImageDriveFiles> {
  if (!opts.jailer) return files;
  const owner = opts.jailer;
  const place = async (hostPath: string, name: string, how: { copyOk: boolean; chown: boolean }): Promise<string> => {
    const inside = join(opts.root, name);
    const copyMark = `${inside}.digest`;
    if (how.copyOk && (await readFile(copyMark, "utf8").catch(() => "")) === opts.imageDigest && (await sameSize(hostPath, inside))) return opts.vm(inside);
    await rm(copyMark, { force: true });
    await rm(inside, { force: true });
    try {
      await link(hostPath, inside);
    } catch (err) {
      if (!how.copyOk) throw new Error(`cannot link ${hostPath} into the jailer's chroot as ${inside}: ${(err as Error).message}`, { cause: err });
      await copyFile(hostPath, inside);
      await writeFile(copyMark, opts.imageDigest);
    }
    if (how.chown) await chown(inside, owner.uid, owner.gid);
    return opts.vm(inside);
  };
  return {
    image: await place(files.image, IN_CHROOT.image, { copyOk: true, chown: false }),
    disk: await place(files.disk, IN_CHROOT.disk, { copyOk: false, chown: true }),
    launch: await place(files.launch, IN_CHROOT.launch, { copyOk: false, chown: true }),
  };
}

async function sameSize(a: string, b: string): Promise<boolean> {
  const [sa, sb] = await Promise.all([stat(a).catch(() => undefined), stat(b).catch(() => undefined)]);
  return !!sa && !!sb && sa.size === sb.size;
}

// An XFS filesystem with reflinks on a loop image, for benchmarks and tests of the copy-on-write paths on a machine
// whose own filesystem (ext4) has none: a sparse image file in the caller's directory, `mkfs.xfs -m reflink=1`,
// mounted with `-o loop` on a directory beside it; `unmount()` unmounts it and detaches the loop device.
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, rmSync } from "node:fs";
import { open } from "node:fs/promises";
import { join } from "node:path";
import { AppError } from "../lib/errors.ts";
import { aptInstall } from "./setup-vm.ts";

export interface XfsLoop {
  /** The mounted filesystem's root (`<dir>/xfs`). */
  mount: string;
  /** The sparse image file behind it (`<dir>/xfs.img`). */
  image: string;
  /** The loop device it is attached to (`/dev/loopN`). */
  device: string;
  /** Unmounts, detaches the loop device, removes the image and the mount point; safe to call twice. */
  unmount(): Promise<void>;
}

export interface XfsLoopOptions {
  /** Size of the sparse image, MiB (default 8192; it takes only what is written). */
  sizeMiB?: number;
  log?: (line: string) => void;
}

/** Where system tools live besides PATH: CI's restricted PATH (/usr/local/bin:/usr/bin:/bin) has no sbin. */
const SBIN = ["/usr/local/sbin", "/usr/sbin", "/sbin"];

/** The full path of `cmd` (PATH first, then the sbin directories), or undefined when it is nowhere. */
function toolPath(cmd: string): string | undefined {
  const dirs = [...(process.env.PATH ?? "").split(":").filter(Boolean), ...SBIN];
  return dirs.map((d) => join(d, cmd)).find((p) => existsSync(p));
}

function run(cmd: string, args: string[]): { ok: boolean; out: string } {
  const r = spawnSync(toolPath(cmd) ?? cmd, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  const out = `${r.stdout ?? ""}${r.stderr ?? ""}`.trim();
  return { ok: r.status === 0, out: r.error ? r.error.message : out };
}

function have(cmd: string): boolean {
  return toolPath(cmd) !== undefined;
}

/** Why no XFS loop image can be made here (one line), or undefined when it can (mkfs.xfs may still need installing). */
export function xfsLoopUnavailable(): string | undefined {
  if (process.getuid?.() !== 0) return "not root: mounting a loop image needs root";
  if (!existsSync("/dev/loop-control") && !readdirSync("/dev").some((n) => /^loop\d+$/.test(n))) return "no loop device (/dev/loop-control, /dev/loop*)";
  if (!have("losetup") || !have("mount")) return "losetup or mount is missing (util-linux, mount)";
  return undefined;
}

/** Installs xfsprogs the project's way (setup-vm's aptInstall) when mkfs.xfs is missing; the reason when it stays missing. */
function ensureMkfsXfs(log: (line: string) => void): string | undefined {
  if (have("mkfs.xfs")) return undefined;
  aptInstall(["xfsprogs"], log);
  return have("mkfs.xfs") ? undefined : "mkfs.xfs is missing and `apt-get install xfsprogs` did not provide it";
}

/**
 * Makes and mounts an XFS filesystem with reflinks inside `dir` (the caller's own temporary directory). Throws an
 * AppError with a one-line reason when this machine cannot (not root, no loop device, no mkfs.xfs, mount refused).
 */
export async function mountXfsLoop(dir: string, opts: XfsLoopOptions = {}): Promise<XfsLoop> {
  const log = opts.log ?? (() => {});
  const why = xfsLoopUnavailable() ?? ensureMkfsXfs(log);
  if (why) throw new AppError("internal", `no XFS loop image: ${why}`);
  const image = join(dir, "xfs.img");
  const mount = join(dir, "xfs");
  const fh = await open(image, "wx");
  try {
    await fh.truncate((opts.sizeMiB ?? 8192) * 1024 * 1024);
  } finally {
    await fh.close();
  }
  const mkfs = run("mkfs.xfs", ["-q", "-f", "-m", "reflink=1", image]);
  if (!mkfs.ok) {
    rmSync(image, { force: true });
    throw new AppError("internal", `no XFS loop image: mkfs.xfs failed: ${mkfs.out.split("\n").pop()}`);
  }
  mkdirSync(mount, { recursive: true });
  const mounted = run("mount", ["-o", "loop", "-t", "xfs", image, mount]);
  if (!mounted.ok) {
    rmSync(image, { force: true });
    rmSync(mount, { recursive: true, force: true });
    throw new AppError("internal", `no XFS loop image: mount -o loop failed: ${mounted.out.split("\n").pop()}`);
  }
  // The device mount chose: detached by name at the end even if the autoclear flag did not do it.
  const device = run("losetup", ["-j", image]).out.split(":")[0] ?? "";
  log(`xfs-loop: ${image} on ${device} mounted at ${mount}`);
  let done = false;
  return {
    mount,
    image,
    device,
    async unmount() {
      if (done) return;
      const u = run("umount", [mount]);
      if (!u.ok && run("mountpoint", ["-q", mount]).ok) {
        // Busy (a process still has a file open): a lazy unmount lets the kernel finish it once they close.
        const lazy = run("umount", ["-l", mount]);
        if (!lazy.ok) throw new AppError("internal", `could not unmount ${mount}: ${u.out}`);
      }
      if (device && run("losetup", ["-j", image]).out.startsWith(`${device}:`)) run("losetup", ["-d", device]);
      done = true;
      rmSync(image, { force: true });
      rmSync(mount, { recursive: true, force: true });
    },
  };
}

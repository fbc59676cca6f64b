// A built image unpacked for the process driver: the image's ext4 copied into `<stateDir>/rootfs` with debugfs (no
// mount, no loop device), made once and then the agent's own persistent copy, and the few paths inside it that the
// driver needs (the lease directory, /dev's harmless nodes, /tmp).
//
// `debugfs -R "rdump / <dir>"` keeps owners, permission bits and file times, but drops (measured with e2fsprogs
// 1.47.0): setuid/setgid/sticky bits (it chmods, then chowns, and a chown clears them), symlinks' owners, FIFOs,
// device nodes and sockets (not written at all), hard links (each name becomes its own copy), extended attributes
// (file capabilities, SELinux labels) and directory times. `repairRdump` reads every directory's listing back from
// the image in one debugfs run (`ls -p`: inode, mode, owner per entry) and restores the special bits, symlink owners,
// FIFOs and hard links. Device nodes stay out on purpose (an image could carry one for a host disk); `/dev` gets
// null, zero, full, random, urandom and tty made here instead. Extended attributes are not restored.
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmod, chown, lchown, link, lstat, mkdir, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "../../../lib/log.ts";

export const ROOTFS_DIR = "rootfs";
/** Beside the copy: the digest of the image it was unpacked from. */
const ROOTFS_IMAGE_FILE = "rootfs.image";

export function rootfsPath(stateDir: string): string {
  return join(stateDir, ROOTFS_DIR);
}

/** e2fsprogs' tools live in /sbin, which a non-login root shell may lack in PATH. */
function e2tool(name: string): string {
  return `/usr/sbin/${name}`;
}

function run(cmd: string, args: readonly string[], opts: { input?: string } = {}): Promise<{ stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = execFile(cmd, [...args], { maxBuffer: 256 << 20, timeout: 600_000 }, (err, stdout, stderr) => {
      if (err) {
        const why =
          (err as NodeJS.ErrnoException).code === "ENOENT" ? `${cmd} is not installed (e2fsprogs, coreutils)` : stderr.trim().slice(-600) || err.message;
        reject(new Error(`${cmd} ${args.join(" ")}: ${why}`));
      } else resolve({ stdout, stderr });
    });
    if (opts.input !== undefined) child.stdin?.end(opts.input);
  });
}

/**
 * `<stateDir>/rootfs`, unpacked from `imageFile` when absent (into a temporary directory renamed into place: a crash
 * leaves no half copy). An existing copy is kept as it is: it holds what the agent wrote, even when the agent's
 * image changed since (that is logged; a plain directory has no layer to swap underneath).
 */
export async function ensureRootfs(stateDir: string, image: { digest: string; rootfs: string }, log: Logger): Promise<string> {
  const dir = rootfsPath(stateDir);
  if (await stat(dir).catch(() => undefined)) {
    const was = await readFile(join(stateDir, ROOTFS_IMAGE_FILE), "utf8").catch(() => "");
    if (was.trim() !== image.digest)
      log.warn("the agent's files were unpacked from another image; they are kept and the new image is not applied", {
        dir,
        was: was.trim(),
        now: image.digest,
      });
    return dir;
  }
  const started = performance.now();
  const tmp = join(stateDir, `.rootfs-${randomBytes(4).toString("hex")}`);
  try {
    await mkdir(tmp, { mode: 0o700 });
    const { stderr } = await run(e2tool("debugfs"), ["-R", `rdump / ${tmp}`, image.rootfs]);
    // debugfs reports a failed rdump on stderr and still exits 0.
    const complaint = stderr.split("\n").find((l) => l.trim() && !/^debugfs \d/.test(l));
    if (complaint) throw new Error(`debugfs could not unpack ${image.rootfs}: ${complaint.trim()}`);
    const repaired = await repairRdump(image.rootfs, tmp);
    await writeFile(join(stateDir, ROOTFS_IMAGE_FILE), `${image.digest}\n`);
    await rename(tmp, dir);
    log.info("image unpacked for the process driver", { dir, image: image.digest, ms: Math.round(performance.now() - started), ...repaired });
  } finally {
    await rm(tmp, { recursive: true, force: true });
  }
  return dir;
}

export interface RdumpRepairs {
  specialBits: number;
  symlinkOwners: number;
  fifos: number;
  hardLinks: number;
  /** Device nodes and sockets in the image that were not made. */
  skipped: number;
  /** Names debugfs cannot be asked about in a command file (quotes, backslashes, newlines). */
  unlisted: number;
}

interface Entry {
  ino: number;
  mode: number;
  uid: number;
  gid: number;
  name: string;
}

const S_IFMT = 0o170000;
const S_IFDIR = 0o040000;
const S_IFREG = 0o100000;
const S_IFLNK = 0o120000;
const S_IFIFO = 0o010000;

/** What rdump left out or changed (see the top of this file), put right from the image's own listings. */
export async function repairRdump(imageFile: string, dir: string): Promise<RdumpRepairs> {
  const repairs: RdumpRepairs = { specialBits: 0, symlinkOwners: 0, fifos: 0, hardLinks: 0, skipped: 0, unlisted: 0 };
  const dirs: string[] = [];
  const walk = async (rel: string): Promise<void> => {
    dirs.push(rel);
    for (const e of await readdir(join(dir, rel), { withFileTypes: true })) if (e.isDirectory()) await walk(`${rel}/${e.name}`);
  };
  await walk("");
  const quotable = (p: string) => !/["\\\n]/.test(p);
  const listed = dirs.filter(quotable);
  repairs.unlisted = dirs.length - listed.length;
  const { stdout } = await run(e2tool("debugfs"), ["-f", "-", imageFile], { input: listed.map((d) => `ls -p "${d || "/"}"\n`).join("") });
  const sections = parseListings(stdout);
  const firstPath = new Map<number, string>();
  for (const [i, rel] of listed.entries()) {
    for (const e of sections[i] ?? []) {
      const self = e.name === ".";
      if (e.name === ".." || (self && rel !== "")) continue; // each directory's own entry is in its parent's listing
      const path = self ? dir : join(dir, rel, e.name);
      const type = e.mode & S_IFMT;
      if (type === S_IFDIR || type === S_IFREG) {
        if (type === S_IFREG && !self) {
          const first = firstPath.get(e.ino);
          if (first) {
            await rm(path, { force: true });
            await link(first, path);
            repairs.hardLinks++;
            continue;
          }
          firstPath.set(e.ino, path);
        }
        if (self) await chown(path, e.uid, e.gid);
        if (self || e.mode & 0o7000) {
          await chmod(path, e.mode & 0o7777);
          if (e.mode & 0o7000) repairs.specialBits++;
        }
      } else if (type === S_IFLNK) {
        if (e.uid !== 0 || e.gid !== 0) {
          await lchown(path, e.uid, e.gid);
          repairs.symlinkOwners++;
        }
      } else if (type === S_IFIFO) {
        await run("mkfifo", ["-m", (e.mode & 0o7777).toString(8), path]);
        await lchown(path, e.uid, e.gid);
        repairs.fifos++;
      } else {
        repairs.skipped++;
      }
    }
  }
  return repairs;
}

/** `debugfs -f` output of `ls -p` commands: one list of entries per command, in order. */
export function parseListings(stdout: string): Entry[][] {
  const sections: Entry[][] = [];
  for (const line of stdout.split("\n")) {
    if (line.startsWith("debugfs: ")) {
      sections.push([]);
      continue;
    }
    // "/<inode>/<mode octal>/<uid>/<gid>/<name>/<size>/": a name cannot hold a "/".
    const f = line.split("/");
    if (f.length !== 8 || f[0] !== "" || sections.length === 0) continue;
    if (f[1] === "0" || f[5] === "") continue; // an unused directory slot (inode 0), listed too
    sections.at(-1)!.push({ ino: Number(f[1]), mode: Number.parseInt(f[2]!, 8), uid: Number(f[3]), gid: Number(f[4]), name: f[5]! });
  }
  return sections;
}

/**
 * A directory inside the copy, made with every missing part (root's; `mode` for the last, 0755 for the others). A
 * part that is a symlink is replaced by a directory: an image's `/run -> /var/run` or an absolute link must not lead
 * the host's own mkdir (as root) out of the copy.
 */
export async function mkdirInRoot(root: string, rel: string, mode = 0o755): Promise<string> {
  const parts = rel.split("/").filter(Boolean);
  let path = root;
  for (const [i, part] of parts.entries()) {
    path = join(path, part);
    const s = await lstat(path).catch(() => undefined);
    if (s?.isDirectory()) continue;
    if (s) await rm(path, { force: true });
    const m = i === parts.length - 1 ? mode : 0o755;
    await mkdir(path, { mode: m });
    await chmod(path, m); // mkdir's mode passes through the umask
  }
  return path;
}

/** The character devices a program may expect in /dev (the host's own: a chroot has no devtmpfs). */
const DEV_NODES: readonly [name: string, major: number, minor: number, mode: number][] = [
  ["null", 1, 3, 0o666],
  ["zero", 1, 5, 0o666],
  ["full", 1, 7, 0o666],
  ["random", 1, 8, 0o666],
  ["urandom", 1, 9, 0o666],
  ["tty", 5, 0, 0o666],
];

/** /dev with the harmless nodes, /tmp (1777), and an empty lease directory (`leaseDir`, in the copy). */
export async function prepareRootfs(root: string, leaseDir: string): Promise<string> {
  const dev = await mkdirInRoot(root, "dev");
  for (const [name, major, minor, mode] of DEV_NODES) {
    const path = join(dev, name);
    const s = await lstat(path).catch(() => undefined);
    if (s?.isCharacterDevice() && s.rdev === (major << 8) + minor) continue;
    if (s) await rm(path, { recursive: true, force: true });
    await run("mknod", ["-m", mode.toString(8), path, "c", String(major), String(minor)]);
  }
  await mkdirInRoot(root, "tmp", 0o1777);
  // A VM's lease directory is in memory: a new boot starts without leases. So does this one.
  const leases = await mkdirInRoot(root, leaseDir, 0o1777);
  await rm(leases, { recursive: true, force: true });
  await mkdir(leases);
  await chmod(leases, 0o1777);
  return leases;
}

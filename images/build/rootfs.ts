// Turns an unpacked root directory into the read-only ext4 image a VM boots from, sized from its content, reproducibly.
//
// Why ext4 and not erofs or squashfs: Debian's cloud kernel (the guest's) has ext4 built in, while erofs and squashfs
// are modules the initramfs would have to carry; `mke2fs -d` fills an image from a directory with no loop device, no
// mount and no root-only tool; and the agent's writable disk is a separate ext4 that overlayfs puts over this one, so
// the guest needs one filesystem driver for both. The cost is size, without compression: the Node example is a
// 246 MB ext4 (its gzip'd OCI archive, 88 MB).
import { createHash } from "node:crypto";
import { createReadStream, lstatSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { AppError } from "../../lib/errors.ts";
import { BUILD_TIMESTAMP } from "./buildah.ts";
import { run, tailText, type RunOptions } from "./run.ts";
import { requireTools } from "./tools.ts";

/** The label the guest finds the image's drive by (`/dev/disk/by-label/agentvm-image`, `findfs LABEL=…`). */
export const ROOTFS_LABEL = "agentvm-image";
const BLOCK = 4096;
const INODE_SIZE = 256;

export interface TreeSize {
  /** Inodes the tree needs (hard links counted once). */
  inodes: number;
  /** 4 KiB blocks its files, directories and long symlinks take in ext4. */
  blocks: number;
}

/** Walks the tree with lstat: what it will take in an ext4 of 4 KiB blocks (the host filesystem's own `du` may differ). */
export function measureTree(dir: string): TreeSize {
  const seen = new Set<string>();
  let inodes = 0;
  let blocks = 0;
  const walk = (path: string): void => {
    const entries = readdirSync(path, { withFileTypes: true });
    inodes++;
    // A directory entry is 8 bytes + the name rounded to 4; htree leaves are about 3/4 full.
    const dirBytes = entries.reduce((n, e) => n + 8 + Math.ceil(Buffer.byteLength(e.name) / 4) * 4, 24);
    blocks += Math.max(1, Math.ceil((dirBytes * 4) / 3 / BLOCK)) + (entries.length > 200 ? 1 : 0);
    for (const e of entries) {
      const p = join(path, e.name);
      if (e.isDirectory()) {
        walk(p);
        continue;
      }
      const st = lstatSync(p);
      if (st.nlink > 1) {
        const key = `${st.dev}:${st.ino}`;
        if (seen.has(key)) continue;
        seen.add(key);
      }
      inodes++;
      if (st.isFile()) {
        const b = Math.ceil(st.size / BLOCK);
        // Extents hold up to 32768 blocks; past four of them the extent tree needs blocks of its own.
        blocks += b + (b > 4 * 32768 ? Math.ceil(b / 32768 / 340) + 1 : 0);
      } else if (st.isSymbolicLink() && st.size >= 60) {
        blocks += 1; // shorter targets live in the inode
      }
    }
  };
  walk(dir);
  return { inodes, blocks };
}

/** Blocks of an image that holds `size`: content, inode tables, bitmaps and group descriptors, and a little slack. */
export function imageBlocks(size: TreeSize, inodes: number): number {
  const inodeTable = Math.ceil((inodes * INODE_SIZE) / BLOCK);
  const groups = Math.ceil((size.blocks + inodeTable) / 32768) + 1;
  // Read-only: no room to grow is needed, only what allocation loses (partly filled groups, directory growth).
  return Math.ceil(size.blocks * 1.03) + inodeTable + groups * 4 + 1024;
}

/** An RFC 4122-shaped UUID from a seed (the version and variant bits set, the rest the seed's hash). */
export function seedUuid(seed: string, purpose: string): string {
  const b = createHash("sha256").update(`${purpose}\0${seed}`).digest().subarray(0, 16);
  b[6] = (b[6]! & 0x0f) | 0x40;
  b[8] = (b[8]! & 0x3f) | 0x80;
  const h = b.toString("hex");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** Inode numbers in use, from dumpe2fs's per-group "Free inodes:" ranges. */
export function usedInodes(dumpe2fs: string): number[] {
  const perGroup = Number(/^Inodes per group:\s+(\d+)/m.exec(dumpe2fs)?.[1]);
  const total = Number(/^Inode count:\s+(\d+)/m.exec(dumpe2fs)?.[1]);
  if (!perGroup || !total) throw new Error("dumpe2fs printed no inode geometry");
  const free = new Set<number>();
  let group = -1;
  for (const line of dumpe2fs.split("\n")) {
    const g = /^Group (\d+):/.exec(line);
    if (g) {
      group = Number(g[1]);
      continue;
    }
    const f = /^\s+Free inodes:\s*(.*)$/.exec(line);
    if (!f || group < 0) continue;
    for (const range of f[1]!
      .split(",")
      .map((r) => r.trim())
      .filter(Boolean)) {
      const [a, b] = range.split("-").map(Number);
      for (let i = a!; i <= (b ?? a!); i++) free.add(i);
    }
  }
  const used: number[] = [];
  for (let i = 1; i <= total; i++) if (!free.has(i)) used.push(i);
  return used;
}

export interface RootfsImage {
  /** `sha256:<hex>` of the image file. */
  digest: string;
  sizeBytes: number;
}

export interface MakeRootfsOptions extends Pick<RunOptions, "onLine" | "signal"> {
  dir: string;
  out: string;
  /**
   * What the image is, for its UUID and directory hash seed: the same seed and the same tree give the same bytes. The
   * caller puts the config in it too, so two images with the same files but another CMD never share a digest.
   */
  seed: string;
  /** Scratch file for debugfs's commands. */
  scratch: string;
}

/** sha256 of a file, streamed. */
export async function fileDigest(path: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(path, { highWaterMark: 1 << 20 })) hash.update(chunk as Buffer);
  return `sha256:${hash.digest("hex")}`;
}

const noSpace = /Could not allocate (block|inode)|No space left/i;

/**
 * `mke2fs -t ext4 -d <dir>` into a file sized from the tree: no journal (mounted read-only), no reserved blocks, no
 * resize inode, 4 KiB blocks, labelled `agentvm-image`. As reproducible as e2fsprogs 1.47.0 allows: UUID and hash
 * seed from `seed`, `E2FSPROGS_FAKE_TIME` for the superblock and creation times, and the inode times mke2fs copies
 * from the host (ctime, atime: the moment of our unpack) set to that same instant with debugfs afterwards; mtimes
 * come from the image's layers. Sizes are retried larger when the estimate was short.
 */
export async function makeRootfsImage(opts: MakeRootfsOptions): Promise<RootfsImage> {
  const tools = requireTools(["mke2fs", "debugfs", "dumpe2fs"]);
  const size = measureTree(opts.dir);
  let inodes = size.inodes + Math.max(64, Math.ceil(size.inodes / 50));
  const env = { ...process.env, LC_ALL: "C", E2FSPROGS_FAKE_TIME: String(BUILD_TIMESTAMP) };
  const run1 = (cmd: string, args: string[]) =>
    run(cmd, args, { env, keepLines: 20, ...(opts.signal ? { signal: opts.signal } : {}), ...(opts.onLine ? { onLine: opts.onLine } : {}) });
  let blocks = imageBlocks(size, inodes);
  for (let attempt = 1; ; attempt++) {
    const args = [
      "-q",
      "-F",
      "-t",
      "ext4",
      "-b",
      String(BLOCK),
      "-I",
      String(INODE_SIZE),
      "-N",
      String(inodes),
      "-m",
      "0",
      "-O",
      "^has_journal,^resize_inode",
      "-L",
      ROOTFS_LABEL,
      "-U",
      seedUuid(opts.seed, "uuid"),
      "-E",
      `hash_seed=${seedUuid(opts.seed, "hash_seed")},nodiscard`,
      "-d",
      opts.dir,
      opts.out,
      String(blocks),
    ];
    const r = await run1(tools.mke2fs, args);
    if (r.code === 0) break;
    if (attempt < 4 && r.tail.some((l) => noSpace.test(l))) {
      opts.onLine?.(`agentvm: ${blocks} blocks and ${inodes} inodes were too few; retrying with half as many more`);
      blocks = Math.ceil(blocks * 1.5);
      inodes = Math.ceil(inodes * 1.5);
      continue;
    }
    throw new AppError("build_failed", `mke2fs could not make the root filesystem:\n${tailText(r.tail, 8)}`);
  }

  const dump = await run(tools.dumpe2fs, [opts.out], { env, keepLines: 3 });
  if (dump.code !== 0) throw new AppError("internal", `dumpe2fs ${opts.out} failed: ${tailText(dump.tail, 3)}`);
  // Inode 2 is the root; 1 and 3–10 are reserved (bad blocks, quota, journal…), 11 is lost+found.
  const fix = usedInodes(dump.stdout).filter((i) => i === 2 || i >= 11);
  const t = `@${BUILD_TIMESTAMP}`;
  writeFileSync(opts.scratch, fix.map((i) => `sif <${i}> ctime ${t}\nsif <${i}> atime ${t}\n`).join(""));
  // debugfs exits 0 whatever a command did: it echoes each command ("debugfs: sif …"); any other line is a complaint.
  const complaints: string[] = [];
  const fixed = await run(tools.debugfs, ["-w", "-f", opts.scratch, opts.out], {
    env,
    keepLines: 1,
    onLine: (l) => l.trim() !== "" && !/^debugfs[: ]/.test(l) && complaints.push(l),
    ...(opts.signal ? { signal: opts.signal } : {}),
  });
  if (fixed.code !== 0 || complaints.length > 0)
    throw new AppError("internal", `debugfs could not set the inode times: ${complaints.slice(0, 3).join("; ") || `exit ${fixed.code}`}`);
  return { digest: await fileDigest(opts.out), sizeBytes: statSync(opts.out).size };
}

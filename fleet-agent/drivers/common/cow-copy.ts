// Copies of a VM's big files (RAM file, disk, snapshot data) for checkpoints and clones: a reflink where the
// filesystem has them (XFS with reflink=1, btrfs: milliseconds, no space until a side writes), else a copy that keeps
// the holes of a sparse file (a 256 MiB RAM file or a 1 GiB disk holds far less than its size).
import { constants } from "node:fs";
import { copyFile, mkdtemp, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { runTool } from "./agent-disk.ts";
import { fsyncPath } from "./snapshot-files.ts";

export type CopyKind = "reflink" | "copy";

/** errno codes of a filesystem (or a pair of them) that cannot share blocks between files. */
const NO_REFLINK = new Set(["EOPNOTSUPP", "ENOTSUP", "EXDEV", "EINVAL", "ENOSYS", "ENOTTY"]);

function cannotReflink(err: unknown): boolean {
  return NO_REFLINK.has((err as NodeJS.ErrnoException).code ?? "");
}

/**
 * Copies `src` to `dst` (which must not exist) and makes the copy durable: a reflink when the filesystem can, else
 * `cp --sparse=always` (Node's own copy would write every hole out as zeros). Answers which of the two it was.
 */
export async function cowCopy(src: string, dst: string): Promise<CopyKind> {
  let kind: CopyKind = "reflink";
  try {
    await copyFile(src, dst, constants.COPYFILE_EXCL | constants.COPYFILE_FICLONE_FORCE);
  } catch (err) {
    if (!cannotReflink(err)) throw err;
    kind = "copy";
    await runTool("cp", ["--sparse=always", "--no-preserve=all", src, dst]);
  }
  await fsyncPath(dst);
  return kind;
}

/** Whether files in `dir` can be reflinked (tried on two small files there; a data directory's filesystem decides). */
export async function reflinkSupported(dir: string): Promise<boolean> {
  const probe = await mkdtemp(join(dir, ".reflink-probe-"));
  try {
    await writeFile(join(probe, "a"), "probe");
    await copyFile(join(probe, "a"), join(probe, "b"), constants.COPYFILE_FICLONE_FORCE);
    return true;
  } catch (err) {
    if (cannotReflink(err)) return false;
    throw err;
  } finally {
    await rm(probe, { recursive: true, force: true });
  }
}

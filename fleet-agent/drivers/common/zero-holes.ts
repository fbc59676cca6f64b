// Holes for the zero pages of a VM's RAM file: the guest zeroes the memory it frees (init_on_free=1), so a RAM file
// the guest has run on holds mostly zero pages written out; as holes they take no disk, and reflinked or sparse
// copies of the file no more than what the guest really holds.
import { stat } from "node:fs/promises";
import { runTool } from "./agent-disk.ts";

/**
 * Punches a hole over every run of zero pages of `file` (util-linux `fallocate --dig-holes`: holes read as zeros, so
 * its content is unchanged, and it skips the holes already there). Only while nothing writes the file: a page found
 * zero and written before its hole is punched would lose that write (for a RAM file: its guest stopped). Changes the
 * file's mtime. Rejects when the tool fails (a filesystem that cannot punch holes): the file is then as it was.
 */
export function punchZeroPages(file: string): Promise<void> {
  return runTool("fallocate", ["--dig-holes", file]);
}

/** Bytes of disk the file's blocks take (holes take none). */
export async function allocatedBytes(file: string): Promise<number> {
  return (await stat(file)).blocks * 512;
}

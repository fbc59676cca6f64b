// Fills the page cache of a fresh RAM file with 4 KiB pages before QEMU maps it (small-pages.c says why: a guest write
// would otherwise dirty a whole large folio, and each hibernation would write back tens of MiB for a few hundred KiB).
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { buildCTool, toolCacheDir, type CTool } from "../../../lib/node-c-tool.ts";

const SOURCE = join(import.meta.dirname, "small-pages.c");
const run = promisify(execFile);
let tool: CTool | undefined;

/** The compiled helper (built with gcc on first use), or why there is none: RAM files then keep the kernel's folios. */
export function smallPagesTool(): CTool {
  return (tool ??= buildCTool({ file: SOURCE }, "small-pages", toolCacheDir("qemu")));
}

/** Caches `file` (clean: just made, or synced) in 4 KiB pages; rejects with the helper's message. */
export async function cacheInSmallPages(helper: string, file: string): Promise<void> {
  try {
    await run(helper, [file], { timeout: 30_000 });
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new Error(e.stderr?.trim() || e.message);
  }
}

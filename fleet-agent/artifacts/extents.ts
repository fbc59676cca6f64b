// Where a sparse file's data is (extents.c, built with gcc on first use, like the egress relay): reading a hole costs as
// much as reading data (the kernel fills the page cache with zeros), so the store reads only the extents.
import { execFile } from "node:child_process";
import { join } from "node:path";
import { buildCTool, toolCacheDir, type CTool } from "../../lib/node-c-tool.ts";

const SOURCE = join(import.meta.dirname, "extents.c");

/** Holes shorter than this are read with the data around them: fewer reads, and reading a little zero is cheap. */
const MERGE_GAP = 256 * 1024;

export interface DataMap {
  size: number;
  /** Byte ranges `[start, end)` that may hold non-zero bytes, in order; all else is zeros. */
  ranges: [number, number][];
}

let tool: CTool | undefined;

/** The compiled helper (built once per source hash, in a per-user temp directory), or why there is none. */
function extentsTool(): CTool {
  return (tool ??= buildCTool({ file: SOURCE }, "extents", toolCacheDir("artifacts")));
}

/**
 * The data ranges of a regular file (neighbours closer than MERGE_GAP merged), or undefined when they cannot be
 * known (no gcc, the helper failed): then the caller reads the whole file, which is only slower.
 */
export async function dataMap(path: string): Promise<DataMap | undefined> {
  const t = extentsTool();
  if (!("path" in t)) return undefined;
  const out = await new Promise<string | undefined>((resolve) => {
    execFile(t.path, [path], { encoding: "utf8", maxBuffer: 64 << 20 }, (err, stdout) => resolve(err ? undefined : stdout));
  });
  if (out === undefined) return undefined;
  const [head, ...lines] = out.trim().split("\n");
  const size = Number(head);
  if (!Number.isSafeInteger(size)) return undefined;
  const ranges: [number, number][] = [];
  for (const line of lines) {
    const [s, e] = line.split(" ").map(Number) as [number, number];
    if (!Number.isSafeInteger(s) || !Number.isSafeInteger(e) || e <= s) return undefined;
    const end = Math.min(e, size);
    const last = ranges[ranges.length - 1];
    if (last && s - last[1] < MERGE_GAP) last[1] = end;
    else ranges.push([s, end]);
  }
  return { size, ranges };
}

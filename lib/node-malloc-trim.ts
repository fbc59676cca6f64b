// Gives the kernel back the memory malloc holds free, every so often (lib/node-malloc-trim.c says why): a host process's
// resident memory then follows what it uses, not the high-water mark of every wake it served.
import { join } from "node:path";
import { buildCTool, toolCacheDir } from "./node-c-tool.ts";
import type { Logger } from "./log.ts";

/**
 * How often a host looks, and how much its RSS must have grown since the last trim for it to trim again: a trim walks
 * the whole heap (measured: up to 16 ms for a badly fragmented 280 MiB one) and holds the event loop meanwhile.
 */
export const MALLOC_TRIM_INTERVAL_MS = 30_000;
export const MALLOC_TRIM_GROWTH_BYTES = 16 << 20;

type Addon = { trim(): boolean };
let loaded: Addon | { error: string } | undefined;

/** The addon, built and loaded on first use, or why there is none (no gcc, not glibc): the process then does without. */
export function mallocTrimmer(): Addon | { error: string } {
  if (loaded) return loaded;
  const built = buildCTool({ file: join(import.meta.dirname, "node-malloc-trim.c") }, "malloc-trim", toolCacheDir("host"), { shared: true });
  if ("error" in built) return (loaded = { error: built.error });
  try {
    const module = { exports: {} as Partial<Addon> };
    process.dlopen(module, built.path);
    const trim = module.exports.trim;
    loaded = typeof trim === "function" ? { trim } : { error: "the addon has no trim()" };
  } catch (err) {
    loaded = { error: (err as Error).message };
  }
  return loaded;
}

/** Trims now (true: pages were handed back); false without the addon. */
export function trimMalloc(): boolean {
  const t = mallocTrimmer();
  return "trim" in t ? t.trim() : false;
}

/**
 * Trims every `intervalMs` when the process's RSS grew by `growthBytes` since the last trim, until stopped; says once
 * at start when it cannot. The timer never holds the process open.
 */
export function startMallocTrim(log: Logger, intervalMs = MALLOC_TRIM_INTERVAL_MS, growthBytes = MALLOC_TRIM_GROWTH_BYTES): { stop(): void } {
  const t = mallocTrimmer();
  if ("error" in t) {
    log.info("malloc trim: not available; freed memory stays resident until reused", { why: t.error });
    return { stop() {} };
  }
  let after = process.memoryUsage.rss();
  const timer = setInterval(() => {
    if (process.memoryUsage.rss() - after < growthBytes) return;
    t.trim();
    after = process.memoryUsage.rss();
  }, intervalMs);
  timer.unref();
  return { stop: () => clearInterval(timer) };
}

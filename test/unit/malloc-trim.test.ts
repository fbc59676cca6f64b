// The malloc trim addon (lib/node-malloc-trim.c): built with gcc, loaded into node, and it hands freed pages back, in a
// node of its own (--expose-gc) whose heap is fragmented on purpose: freed buffers between ones still held.
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { mallocTrimmer } from "../../lib/node-malloc-trim.ts";

const script = `
import { mallocTrimmer } from ${JSON.stringify(join(import.meta.dirname, "../../lib/node-malloc-trim.ts"))};
const t = mallocTrimmer();
if ("error" in t) { console.log(JSON.stringify({ error: t.error })); process.exit(0); }
const keep = [];
for (let r = 0; r < 20; r++) {
  const drop = [];
  for (let i = 0; i < 20000; i++) (i % 16 === 0 ? keep : drop).push(Buffer.allocUnsafeSlow(2000 + (i % 7) * 100));
}
// The buffers' memory is freed after the collection, partly on V8's threads: a second collection a moment later finds
// them all freed (with one alone the trim had 30 to 200 MiB to give back from run to run, under 20 once on a loaded CI).
globalThis.gc();
await new Promise((r) => setTimeout(r, 100));
globalThis.gc();
const before = process.memoryUsage.rss();
const released = t.trim();
console.log(JSON.stringify({ released, before, after: process.memoryUsage.rss(), kept: keep.length }));
`;

describe("malloc trim", () => {
  it("is built and loaded here (gcc and glibc are what the host runs with)", () => {
    const t = mallocTrimmer();
    expect("error" in t ? t.error : "loaded").toBe("loaded");
  });

  it("hands the pages of freed buffers back to the kernel while the ones still held stay", () => {
    const r = spawnSync(process.execPath, ["--expose-gc", "--input-type=module", "-e", script], { encoding: "utf8" });
    expect(r.stderr).toBe("");
    const out = JSON.parse(r.stdout) as { released: boolean; before: number; after: number; kept: number; error?: string };
    expect(out.error).toBeUndefined();
    expect(out.released).toBe(true);
    expect(out.kept).toBe(25_000);
    // ~375,000 freed buffers of 2–2.6 KB between held ones: tens of MiB that only a trim gives back.
    expect(out.before - out.after).toBeGreaterThan(20 << 20);
  });
});

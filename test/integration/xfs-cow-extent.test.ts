// The 4 KiB copy-on-write extent hint on XFS (fleet-agent/drivers/common/cow-extent.ts), on a loop image the test makes:
// scattered page writes into a reflinked copy cost about what they wrote with it, many times more without. Skipped
// (one line) where no loop image can be made, except in CI, where it must run.
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, openSync, closeSync, fsyncSync, rmSync, writeFileSync, writeSync } from "node:fs";
import { statfs } from "node:fs/promises";
import { spawnSync } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { cowCopy } from "../../fleet-agent/drivers/common/cow-copy.ts";
import { smallCowExtents } from "../../fleet-agent/drivers/common/cow-extent.ts";
import { mountXfsLoop, xfsLoopUnavailable, type XfsLoop } from "../../scripts/xfs-loop.ts";

const MiB = 1024 * 1024;
const unavailable = xfsLoopUnavailable();
const mustRun = process.env.CI === "true";
if (unavailable && !mustRun) console.log(`xfs-cow-extent: skipped: ${unavailable}`);

const used = async (dir: string) => {
  const s = await statfs(dir);
  return (s.blocks - s.bfree) * s.bsize;
};

/** Bytes of new blocks that `pages` scattered 4 KiB writes into a reflinked copy of a 64 MiB file in `dir` cost. */
async function costOfScatteredWrites(dir: string, pages: number): Promise<number> {
  mkdirSync(dir, { recursive: true });
  const base = join(dir, "ram");
  writeFileSync(base, randomBytes(64 * MiB));
  const copy = join(dir, "ram.copy");
  await cowCopy(base, copy);
  spawnSync("sync");
  const before = await used(dir);
  const fd = openSync(copy, "r+");
  for (let i = 0; i < pages; i++) writeSync(fd, randomBytes(4096), 0, 4096, Math.floor(Math.random() * 16384) * 4096);
  fsyncSync(fd);
  closeSync(fd);
  spawnSync("sync");
  return (await used(dir)) - before;
}

describe.skipIf(unavailable !== undefined && !mustRun)("copy-on-write extents of VM files on XFS", () => {
  let xfs: XfsLoop;
  const root = mkdtempSync(join(tmpdir(), "xfs-cow-"));
  beforeAll(async () => {
    xfs = await mountXfsLoop(root, { sizeMiB: 1024 });
  }, 120_000);
  afterAll(async () => {
    await xfs?.unmount();
    rmSync(root, { recursive: true, force: true });
  });

  it("with the 4 KiB hint set on the data directory (inherited below it), 500 scattered pages cost about 2 MiB; without it many times more", async () => {
    const hinted = join(xfs.mount, "hinted");
    mkdirSync(hinted);
    expect(await smallCowExtents(hinted)).toEqual({ set: 1 });
    const withHint = await costOfScatteredWrites(join(hinted, "hosts", "h", "vms", "agt_x"), 500);
    const without = await costOfScatteredWrites(join(xfs.mount, "plain", "agt_y"), 500);
    console.log(
      `xfs-cow-extent: 500 × 4 KiB into a reflinked 64 MiB file: ${(withHint / MiB).toFixed(1)} MiB with the hint, ${(without / MiB).toFixed(1)} MiB without`,
    );
    expect(withHint).toBeLessThan(4 * MiB);
    expect(without).toBeGreaterThan(3 * withHint);
  }, 120_000);

  it("does nothing off XFS (this machine's own filesystem) and says why", async () => {
    const dir = mkdtempSync(join(tmpdir(), "not-xfs-"));
    try {
      const r = await smallCowExtents(dir);
      if ((await statfs(dir)).type === 0x58465342) expect(r).toMatchObject({ set: 1 });
      else expect(r).toEqual({ skipped: "not XFS" });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

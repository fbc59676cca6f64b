// Checkpoints and forks of real QEMU VMs (file-backed RAM) on an XFS loop image the test makes, against the
// machine's own ext4: on XFS the copies are reflinks (a checkpoint adds almost nothing on disk, a fork's RAM file
// shares the checkpoint's blocks until the guest writes them); on ext4 they are sparse copies. Skipped (one line)
// where no loop image can be made, except in CI, where it must run.
import { createHash } from "node:crypto";
import { createReadStream, mkdtempSync, rmSync, statSync } from "node:fs";
import { statfs } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { waitFor } from "../helpers/wait.ts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { reflinkSupported } from "../../fleet-agent/drivers/common/cow-copy.ts";
import type { RunningVm, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import type { QemuDriver } from "../../fleet-agent/drivers/qemu/driver.ts";
import { mountXfsLoop, xfsLoopUnavailable, type XfsLoop } from "../../scripts/xfs-loop.ts";
import { call, json, makeDriver, makeSpec } from "../helpers/qemu.ts";

const MiB = 1024 * 1024;
const unavailable = xfsLoopUnavailable();
const mustRun = process.env.CI === "true";
if (unavailable && !mustRun) console.log(`qemu-reflink: skipped: ${unavailable}`);

const count = async (vm: RunningVm) => (await json<{ count: number }>(vm.endpoint, "/counter")).count;
const bump = async (vm: RunningVm) => (await json<{ count: number }>(vm.endpoint, "/counter", { method: "POST" })).count;
/** Bytes the filesystem of `dir` has in use (statfs): only this test writes to the loop image. */
const usedBytes = async (dir: string) => {
  const s = await statfs(dir);
  return (s.blocks - s.bfree) * s.bsize;
};
/** Blocks allocated to a file (its sparse holes excluded; blocks shared by reflinks count for every file). */
const allocated = (path: string) => statSync(path).blocks * 512;
const sha = (path: string) =>
  new Promise<string>((resolve, reject) => {
    const h = createHash("sha256");
    createReadStream(path)
      .on("data", (d) => h.update(d))
      .on("end", () => resolve(h.digest("hex")))
      .on("error", reject);
  });

describe.skipIf(unavailable !== undefined && !mustRun)("qemu checkpoints on an XFS loop image (reflinks) and on ext4 (copies)", () => {
  let driver: QemuDriver;
  let xfs: XfsLoop;
  const root = mkdtempSync(join(tmpdir(), "qemu-reflink-"));
  const ext4 = join(root, "ext4");
  const specs: VmSpec[] = [];
  const spec = (stateDir: string) => {
    const s = makeSpec({ stateDir });
    specs.push(s);
    return s;
  };

  beforeAll(async () => {
    xfs = await mountXfsLoop(root, { sizeMiB: 4096 });
    driver = await makeDriver({ memory: "file" });
  }, 120_000);
  afterAll(async () => {
    await driver?.close();
    for (const s of specs) await driver?.destroy(s);
    await xfs?.unmount();
    rmSync(root, { recursive: true, force: true });
  }, 60_000);

  it("reflinks on XFS: a checkpoint of a running VM adds almost no space; a fork runs, sharing its blocks until the guest writes", async () => {
    expect(await reflinkSupported(xfs.mount)).toBe(true);
    expect(await reflinkSupported(tmpdir())).toBe(false);

    const a = spec(join(xfs.mount, "vm-a"));
    const va = (await driver.boot(a)).vm;
    for (let i = 0; i < 3; i++) await bump(va);
    const ram = allocated(join(a.stateDir, "ram"));
    expect(ram).toBeGreaterThan(16 * MiB); // what a plain copy of the RAM file would have cost

    const dir = join(xfs.mount, "ckp_xfs");
    const before = await usedBytes(xfs.mount);
    const taken = await driver.checkpoint(a, va, dir);
    await driver.stop(va);
    const cost = (await usedBytes(xfs.mount)) - before;
    expect(taken.copy).toBe("reflink");
    expect(taken.bytes).toBeGreaterThan(256 * MiB); // the RAM file's size counts, its blocks are shared
    // What the VM wrote once it ran on after the pause is copied on write (in XFS's 128 KiB CoW extents): tens of
    // MiB at most, against the RAM file's allocated blocks a copy would have taken.
    expect(cost).toBeLessThan(Math.min(64 * MiB, ram / 2));
    const ckpRam = join(dir, "ram");
    const ckpSha = await sha(ckpRam);

    // A fork: its RAM file a reflink of the checkpoint's (no space), then the guest's writes cost what they write.
    const f = spec(join(xfs.mount, "vm-f"));
    const beforeFork = await usedBytes(xfs.mount);
    await driver.restoreCheckpoint(f, dir);
    expect((await usedBytes(xfs.mount)) - beforeFork).toBeLessThan(2 * MiB);
    const woke = await driver.wake(f);
    expect(woke.mode).toBe("restore");
    const vf = woke.vm;
    expect(await count(vf)).toBe(3);
    // The guest writes ~8 MiB of fresh memory (the echo's buffer; init_on_free zeroes it again, its socket buffers too),
    // then hibernates: every page it wrote got a block of its own, the rest still the checkpoint's.
    const body = Buffer.alloc(8 * MiB);
    for (let i = 0; i < body.length; i += 4096) body.writeUInt32LE(i ^ 0x5a5a5a5a, i);
    const echoed = await call(vf.endpoint, "/echo", { method: "POST", body, headers: { "content-type": "application/octet-stream" } });
    expect(echoed.text.length).toBe(8 * MiB);
    expect(await bump(vf)).toBe(4);
    expect((await driver.hibernate(vf)).completed).toBe(true);
    // Awake its RAM file's holes were reserved (ram-space.ts); asleep they are holes again once the dig has run.
    await waitFor(async () => (await usedBytes(xfs.mount)) - beforeFork < 128 * MiB, 30_000, "the fork's RAM file dug");
    const grew = (await usedBytes(xfs.mount)) - beforeFork;
    // About what the guest wrote (in 128 KiB CoW extents, and into holes where its zero pages were), far less than the
    // 256 MiB it maps (64 MiB measured).
    expect(grew).toBeGreaterThan(4 * MiB);
    expect(await sha(ckpRam)).toBe(ckpSha); // the checkpoint's RAM file unchanged by the fork's writes
    // Of the hibernated fork (no guest running): its snapshot and RAM file reflinked, next to nothing on disk.
    const beforeSecond = await usedBytes(xfs.mount);
    const second = await driver.checkpoint(f, undefined, join(xfs.mount, "ckp_fork"));
    expect(second.copy).toBe("reflink");
    expect((await usedBytes(xfs.mount)) - beforeSecond).toBeLessThan(1 * MiB);
    const again = await driver.wake(f);
    expect(again.mode).toBe("restore");
    expect(await count(again.vm)).toBe(4);
    await driver.stop(again.vm);
  }, 180_000);

  it("copies on ext4: the same checkpoint reports copy and holds blocks of its own", async () => {
    const b = spec(join(ext4, "vm-b"));
    const vb = (await driver.boot(b)).vm;
    await bump(vb);
    const dir = join(ext4, "ckp_ext4");
    const taken = await driver.checkpoint(b, vb, dir);
    expect(taken.copy).toBe("copy");
    // A sparse copy: blocks of its own for every non-zero page (the guest's zeroed free pages become holes).
    const own = allocated(join(b.stateDir, "ram"));
    const copied = allocated(join(dir, "ram"));
    expect(copied).toBeGreaterThan(16 * MiB);
    expect(copied).toBeLessThanOrEqual(own);
    const f = spec(join(ext4, "vm-g"));
    await driver.restoreCheckpoint(f, dir);
    const woke = await driver.wake(f);
    expect(woke.mode).toBe("restore");
    expect(await count(woke.vm)).toBe(1);
    await driver.stop(vb);
    await driver.stop(woke.vm);
  }, 120_000);
});

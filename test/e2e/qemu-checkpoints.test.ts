// Checkpoints of real QEMU VMs (both memory modes): taken while running and while hibernated, restored into the VM
// they came from, forked into new VMs that are independent of each other and get their own identity, the checkpoint
// itself never changed; one that does not fit is refused; a kill -9 in the middle of a restore boots cold; a built
// image's checkpoint keeps its disk with its memory.
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { spawn } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningVm, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import type { QemuDriver } from "../../fleet-agent/drivers/qemu/driver.ts";
import { CHECKPOINT_RAM_FILE, type MemoryMode } from "../../fleet-agent/drivers/qemu/args.ts";
import { call, json, makeDriver, makeSpec } from "../helpers/qemu.ts";
import { makeRootfsFixture, type RootfsFixture } from "../helpers/rootfs-fixture.ts";

const count = async (vm: RunningVm) => (await json<{ count: number }>(vm.endpoint, "/counter")).count;
const bump = async (vm: RunningVm) => (await json<{ count: number }>(vm.endpoint, "/counter", { method: "POST" })).count;
const identity = async (vm: RunningVm) => {
  const r = await call(vm.endpoint, "/identity");
  return r.status === 200
    ? Object.fromEntries(
        r.text
          .trim()
          .split("\n")
          .map((l) => l.split("=", 2) as [string, string]),
      )
    : undefined;
};
const randomHex = async (vm: RunningVm) => (await call(vm.endpoint, "/random")).text.trim();

function digest(dir: string): string {
  const h = createHash("sha256");
  for (const name of readdirSync(dir).sort()) h.update(name).update(readFileSync(join(dir, name)));
  return h.digest("hex");
}

describe.each(["file", "stream"] as MemoryMode[])("qemu checkpoints with %s memory", (memory) => {
  let driver: QemuDriver;
  const specs: VmSpec[] = [];
  const spec = (o: Partial<VmSpec> = {}): VmSpec => {
    const s = makeSpec(o);
    specs.push(s);
    return s;
  };
  const root = mkdtempSync(join(tmpdir(), "qemu-ckpt-"));

  beforeAll(async () => {
    driver = await makeDriver({ memory });
  });
  afterAll(async () => {
    await driver?.close();
    for (const s of specs) await driver?.destroy(s);
    rmSync(root, { recursive: true, force: true });
  });

  it("taken running and hibernated; restored into its VM; forked twice (independent, own identity, own entropy); the checkpoint unchanged", async () => {
    const a = spec();
    let va = (await driver.boot(a)).vm;
    for (let i = 0; i < 3; i++) await bump(va);
    const dir = join(root, "ckp_first");
    const taken = await driver.checkpoint(a, va, dir);
    expect(taken.pausedMs).toBeGreaterThan(0);
    expect(taken.bytes).toBeGreaterThan(memory === "file" ? 256 * 1024 * 1024 : 1_000_000);
    expect(existsSync(`${dir}.tmp`)).toBe(false);
    const before = digest(dir);
    expect(await bump(va)).toBe(4); // it ran on after the pause

    // Rolled back: the VM stopped, the checkpoint restored into it, woken with its state of then.
    await driver.stop(va);
    await driver.restoreCheckpoint(a, dir);
    const back = await driver.wake(a);
    expect(back.mode).toBe("restore");
    va = back.vm;
    expect(await count(va)).toBe(3);
    expect(await identity(va)).toMatchObject({ agentId: a.agentId, clonedFrom: "ckp_first" });

    // Two forks: each its own VM from the same memory.
    const f1 = spec();
    const f2 = spec();
    const woken: RunningVm[] = [];
    for (const f of [f1, f2]) {
      await driver.restoreCheckpoint(f, dir);
      const w = await driver.wake(f);
      expect(w.mode).toBe("restore");
      woken.push(w.vm);
    }
    const [v1, v2] = woken as [RunningVm, RunningVm];
    // File-backed: a fork maps the checkpoint's RAM file through a hard link (nothing copied); no RAM file of its own yet.
    if (memory === "file") {
      expect(statSync(join(f1.stateDir, CHECKPOINT_RAM_FILE)).ino).toBe(statSync(join(dir, "ram")).ino);
      expect(existsSync(join(f1.stateDir, "ram"))).toBe(false);
    }
    // Right after the wake, before anything else ran in them: different random bytes (the identity mixed new entropy in).
    const [r1, r2] = [await randomHex(v1), await randomHex(v2)];
    expect(r1).toMatch(/^[0-9a-f]{32}$/);
    expect(r1).not.toBe(r2);
    expect(await identity(v1)).toMatchObject({ agentId: f1.agentId, hostname: f1.agentId.replace(/_/g, "-").toLowerCase(), clonedFrom: "ckp_first" });
    expect(await identity(v2)).toMatchObject({ agentId: f2.agentId });
    expect(await bump(v1)).toBe(4);
    expect(await bump(v1)).toBe(5);
    expect(await bump(v2)).toBe(4);
    expect(await count(va)).toBe(3);
    expect(digest(dir)).toBe(before);

    // Of a hibernated VM: its snapshot copied; a fork of that has its state.
    expect((await driver.hibernate(v1)).completed).toBe(true);
    // Its first hibernation wrote a RAM file of its own: the link to the checkpoint's is gone.
    if (memory === "file") {
      expect(existsSync(join(f1.stateDir, "ram"))).toBe(true);
      expect(existsSync(join(f1.stateDir, CHECKPOINT_RAM_FILE))).toBe(false);
    }
    const dir2 = join(root, "ckp_second");
    const cold = await driver.checkpoint(f1, undefined, dir2);
    expect(cold.pausedMs).toBe(0);
    const f3 = spec();
    await driver.restoreCheckpoint(f3, dir2);
    const v3 = (await driver.wake(f3)).vm;
    expect(await count(v3)).toBe(5);
    // f1 itself still wakes from its own snapshot (the checkpoint took nothing away).
    expect(await count((await driver.wake(f1)).vm)).toBe(5);

    // Deleting a checkpoint harms none of the VMs made from it: their files are their own (or a link to its RAM file),
    // a fork that never ran included.
    const f4 = spec();
    await driver.restoreCheckpoint(f4, dir);
    rmSync(dir, { recursive: true, force: true });
    expect((await driver.hibernate(v2)).completed).toBe(true);
    const v2again = await driver.wake(f2);
    expect(v2again.mode).toBe("restore");
    expect(await count(v2again.vm)).toBe(4);
    const v4 = await driver.wake(f4);
    expect(v4.mode).toBe("restore");
    expect(await count(v4.vm)).toBe(3);
  }, 300_000);

  it("refuses a checkpoint into a VM it does not fit (other memory size), leaving that VM as it was", async () => {
    const a = spec();
    const va = (await driver.boot(a)).vm;
    const dir = join(root, "ckp_fit");
    await driver.checkpoint(a, va, dir);
    const big = spec({ memMiB: 384 });
    await expect(driver.restoreCheckpoint(big, dir)).rejects.toMatchObject({
      code: "conflict",
      message: expect.stringMatching(/256 MiB of memory, the VM now has 384 MiB/),
    });
    expect(existsSync(join(big.stateDir, "snapshot.json"))).toBe(false);
    await expect(driver.checkpoint(a, va, dir)).rejects.toThrow(/exists/);
    await driver.stop(va);
  }, 120_000);
});

describe("a driver process killed with SIGKILL in the middle of a restore from a checkpoint", () => {
  it("leaves no snapshot over half-copied files: the next wake boots cold, and the partial files are gone", async () => {
    const driver = await makeDriver({ memory: "file" });
    const root = mkdtempSync(join(tmpdir(), "qemu-ckpt-kill-"));
    const a = makeSpec();
    const target = makeSpec();
    try {
      const va = (await driver.boot(a)).vm;
      await bump(va);
      const dir = join(root, "ckp_k");
      await driver.checkpoint(a, va, dir);
      await driver.stop(va);
      // The target had a snapshot of its own before.
      const vt = (await driver.boot(target)).vm;
      for (let i = 0; i < 7; i++) await bump(vt);
      expect((await driver.hibernate(vt)).completed).toBe(true);

      // A child restores the checkpoint into the target and is killed once the copy has begun (its first temporary file).
      const helpers = pathToFileURL(join(import.meta.dirname, "..", "helpers", "qemu.ts")).href;
      const script = `
        import { makeDriver, makeSpec } from ${JSON.stringify(helpers)};
        const [stateDir, vmId, dir] = process.argv.slice(1);
        const driver = await makeDriver({ memory: "file" });
        process.stdout.write("ready\\n");
        await driver.restoreCheckpoint(makeSpec({ stateDir, vmId }), dir);
        process.stdout.write("done\\n");
      `;
      const child = spawn(process.execPath, ["--input-type=module", "-e", script, target.stateDir, target.vmId, dir], { stdio: ["ignore", "pipe", "inherit"] });
      const exited = new Promise<void>((r) => child.on("exit", () => r()));
      let out = "";
      child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
      for (let i = 0; i < 3000 && !out.includes("ready"); i++) await new Promise((r) => setTimeout(r, 5));
      for (let i = 0; i < 3000; i++) {
        if (readdirSync(target.stateDir).some((n) => /\.tmp/.test(n)) || out.includes("done")) break;
        await new Promise((r) => setTimeout(r, 1));
      }
      child.kill("SIGKILL");
      await exited;
      if (out.includes("done")) throw new Error("the restore finished before the kill: the test did not hit its point");
      await driver.reap(target);
      expect(readdirSync(target.stateDir).filter((n) => /\.tmp/.test(n))).toEqual([]);
      const woke = await driver.wake(target);
      expect(woke.mode).toBe("boot");
      expect(woke.fallbackReason).toMatch(/no snapshot/);
      expect(await count(woke.vm)).toBe(0);
    } finally {
      await driver.close();
      await driver.destroy(a);
      await driver.destroy(target);
      rmSync(root, { recursive: true, force: true });
    }
  }, 180_000);
});

describe("a checkpoint of a built image's VM (file memory) keeps its disk with its memory", () => {
  let fixture: RootfsFixture;
  let driver: QemuDriver;
  const specs: VmSpec[] = [];
  const root = mkdtempSync(join(tmpdir(), "qemu-ckpt-img-"));
  const cgi = async (vm: RunningVm, name: string, query = "") => (await call(vm.endpoint, `/cgi-bin/${name}${query ? `?${query}` : ""}`)).text.trim();

  beforeAll(async () => {
    fixture = makeRootfsFixture();
    driver = await makeDriver({ memory: "file" });
  }, 120_000);
  afterAll(async () => {
    await driver?.close();
    for (const s of specs) await driver?.destroy(s);
    fixture?.remove();
    rmSync(root, { recursive: true, force: true });
  });

  it("a fork has the file and the memory of the checkpoint; what it writes, and what the source writes after, stay apart", async () => {
    const image = { image: fixture.artifact.digest, rootImage: fixture.artifact, diskMiB: 64 };
    const a = makeSpec({ ...image });
    specs.push(a);
    const va = (await driver.boot(a)).vm;
    expect(await cgi(va, "disk-write", "before-the-checkpoint")).toBe("written");
    expect(await cgi(va, "tmp-write", "in-memory")).toBe("written");
    const dir = join(root, "ckp_img");
    await driver.checkpoint(a, va, dir);
    expect(existsSync(join(dir, "disk.ext4"))).toBe(true);
    expect(await cgi(va, "disk-write", "source-after")).toBe("written");

    const f = makeSpec({ ...image });
    specs.push(f);
    await driver.restoreCheckpoint(f, dir);
    const woke = await driver.wake(f);
    expect(woke.mode).toBe("restore");
    expect(await cgi(woke.vm, "disk-read")).toBe("before-the-checkpoint");
    expect(await cgi(woke.vm, "tmp-read")).toBe("in-memory");
    expect(await cgi(woke.vm, "disk-write", "fork-wrote")).toBe("written");
    expect(await cgi(va, "disk-read")).toBe("source-after");
    // The fork's own hibernate and wake pair its memory with its own disk.
    expect((await driver.hibernate(woke.vm)).completed).toBe(true);
    const again = await driver.wake(f);
    expect(again.mode).toBe("restore");
    expect(await cgi(again.vm, "disk-read")).toBe("fork-wrote");
  }, 240_000);
});

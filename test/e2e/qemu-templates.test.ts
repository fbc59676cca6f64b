// Templates on real QEMU VMs (file-backed RAM): the first VM of a kind boots cold and a template is built beside it;
// the next ones are clones that share the template's pages, each with its own state and identity; a clone's first
// hibernation writes the pages it changed into a RAM file of its own and makes it an ordinary file-backed VM;
// deleting the template harms no clone; a clone killed while awake comes back as a fresh clone; another kind gets a
// template of its own.
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { processAlive, readMemoryKiB } from "../../fleet-agent/drivers/common/proc.ts";
import type { RunningVm, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import type { QemuDriver } from "../../fleet-agent/drivers/qemu/driver.ts";
import type { SnapshotManifest } from "../../fleet-agent/drivers/qemu/snapshot.ts";
import { call, json, makeDriver, makeSpec } from "../helpers/qemu.ts";

const count = async (vm: RunningVm) => (await json<{ count: number }>(vm.endpoint, "/counter")).count;
const bump = async (vm: RunningVm) => (await json<{ count: number }>(vm.endpoint, "/counter", { method: "POST" })).count;
const identity = async (vm: RunningVm) => (await call(vm.endpoint, "/identity")).text;
const manifestOf = (s: VmSpec) => JSON.parse(readFileSync(join(s.stateDir, "snapshot.json"), "utf8")) as SnapshotManifest;
const sha = (path: string) => createHash("sha256").update(readFileSync(path)).digest("hex");

describe("qemu templates (file-backed RAM)", () => {
  let driver: QemuDriver;
  const root = mkdtempSync(join(tmpdir(), "qemu-tpl-"));
  const specs: VmSpec[] = [];
  const spec = (o: Partial<VmSpec> = {}) => {
    const s = makeSpec(o);
    specs.push(s);
    return s;
  };

  beforeAll(async () => {
    driver = await makeDriver({ memory: "file", templates: { root } });
  });
  afterAll(async () => {
    await driver?.templates?.settle();
    await driver?.close();
    for (const s of specs) await driver?.destroy(s);
    rmSync(root, { recursive: true, force: true });
  });

  it("clones share the template's pages, keep their own state and identity, and outlive the template", async () => {
    const first = spec();
    const cold = await driver.boot(first);
    expect(cold.template).toBeUndefined(); // nothing to clone yet: a cold boot, and a template is built beside it
    // Built beside that cold boot: under way, or (on a fast machine) done already, and listed either way.
    expect(["building", "ready"]).toContain((await driver.templates!.list()).map((t) => t.state).join());
    await driver.templates!.settle();
    const [tpl] = await driver.templates!.list();
    expect(tpl).toMatchObject({ state: "ready", image: "demo", memMiB: 256 });
    const ramFile = join(tpl!.dir!, "ram");
    const before = sha(ramFile);

    const b = spec();
    const c = spec();
    const vb = await driver.boot(b);
    const vc = await driver.boot(c);
    expect(vb.template).toBe(tpl!.key);
    expect(vc.template).toBe(tpl!.key);
    expect(manifestOf(b).templateRam?.path).toBe(ramFile);
    // Each clone: the template's workload state (a fresh counter), then its own.
    expect(await count(vb.vm)).toBe(0);
    expect(await bump(vb.vm)).toBe(1);
    expect(await bump(vb.vm)).toBe(2);
    expect(await count(vc.vm)).toBe(0);
    expect(await identity(vb.vm)).toContain(`agentId=${b.agentId}\n`);
    expect(await identity(vc.vm)).toContain(`agentId=${c.agentId}\n`);
    expect((await call(vb.vm.endpoint, "/random")).text).not.toBe((await call(vc.vm.endpoint, "/random")).text);
    // The template's pages are shared: each clone's PSS is well under its RSS.
    for (const vm of [vb.vm, vc.vm]) {
      const mem = readMemoryKiB(vm.pid!)!;
      expect(mem.pss).toBeLessThan(mem.rss - 10 * 1024);
    }
    expect(sha(ramFile)).toBe(before); // written by no clone

    // A clone killed while awake comes back as a fresh clone of the template (its memory was private), a new identity.
    const exited = new Promise((r) => driver.onExit(vc.vm, r));
    process.kill(vc.vm.pid!, "SIGKILL");
    await exited;
    const again = await driver.wake(c);
    expect(again.mode).toBe("restore");
    expect(await count(again.vm)).toBe(0);
    expect(await identity(again.vm)).toMatch(/generation=1\n/);

    // Its first hibernation gives it a RAM file of its own (a copy of the template's with the pages it changed
    // written in) and device state only: from then on an ordinary file-backed VM.
    const first1 = await driver.hibernate(vb.vm);
    expect(first1.bytes).toBeLessThan(1_000_000);
    expect(manifestOf(b).templateRam).toBeUndefined();
    expect(manifestOf(b).ram?.bytes).toBe(256 * 1024 * 1024);
    expect(sha(ramFile)).toBe(before);
    const w1 = await driver.wake(b);
    expect(w1.mode).toBe("restore");
    expect(await count(w1.vm)).toBe(2);
    expect(await bump(w1.vm)).toBe(3);
    const second = await driver.hibernate(w1.vm);
    expect(second.bytes).toBeLessThan(1_000_000);
    const w2 = await driver.wake(b);
    expect(await bump(w2.vm)).toBe(4);

    // Deleting the template while a clone runs harms it not.
    rmSync(tpl!.dir!, { recursive: true, force: true });
    expect(await bump(again.vm)).toBe(1);
    expect((await driver.hibernate(again.vm)).completed).toBe(true);
    const after = await driver.wake(c);
    expect(after.mode).toBe("restore");
    expect(await count(after.vm)).toBe(1);
    expect(processAlive(after.vm.pid!)).toBe(true);
  }, 300_000);

  it("another kind of VM (more memory) gets a template of its own", async () => {
    const big = spec({ memMiB: 320 });
    expect((await driver.boot(big)).template).toBeUndefined();
    await driver.templates!.settle();
    const kinds = (await driver.templates!.list()).filter((t) => t.state === "ready").map((t) => t.memMiB);
    expect(kinds).toContain(320);
    const big2 = spec({ memMiB: 320 });
    const clone = await driver.boot(big2);
    expect(clone.template).toBeDefined();
    expect(await count(clone.vm)).toBe(0);
  }, 300_000);
});

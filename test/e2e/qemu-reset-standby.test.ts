// Reset standbys on real QEMU (qemu/standby.ts): a VM restored to a checkpoint with `again` gets, after its wake, a
// second QEMU that loaded the checkpoint and waits stopped; the next restore of that checkpoint adopts it (the wake is
// the `kept` tier: a `cont`), with the checkpoint's state, the VM's identity, and no standby file left behind; a stop
// ends it; a restore of another checkpoint does not adopt it.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningVm, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import type { QemuDriver } from "../../fleet-agent/drivers/qemu/driver.ts";
import { opt, standbyPaths } from "../../fleet-agent/drivers/qemu/args.ts";
import { call, json, makeDriver, makeSpec } from "../helpers/qemu.ts";
import { makeRootfsFixture, type RootfsFixture } from "../helpers/rootfs-fixture.ts";
import { waitFor } from "../helpers/worker-stack.ts";

const count = async (vm: RunningVm) => (await json<{ count: number }>(vm.endpoint, "/counter")).count;
const bump = async (vm: RunningVm) => (await json<{ count: number }>(vm.endpoint, "/counter", { method: "POST" })).count;
const identityOf = async (vm: RunningVm) => (await call(vm.endpoint, "/identity")).text;

describe("reset standbys (file memory)", () => {
  let driver: QemuDriver;
  const specs: VmSpec[] = [];
  const root = mkdtempSync(join(tmpdir(), "qemu-standby-"));

  beforeAll(async () => {
    driver = await makeDriver({ memory: "file", prestart: "paused" });
  });
  afterAll(async () => {
    await driver?.close();
    for (const s of specs) await driver?.destroy(s);
    rmSync(root, { recursive: true, force: true });
  });

  it("the second reset to a checkpoint adopts the standby made after the first: a kept wake with the checkpoint's state", async () => {
    const a = makeSpec();
    specs.push(a);
    let vm = (await driver.boot(a)).vm;
    for (let i = 0; i < 3; i++) await bump(vm);
    const dir = join(root, "ckp_episode");
    await driver.checkpoint(a, vm, dir);
    expect(await bump(vm)).toBe(4);

    // The first reset loads the checkpoint's files; its wake starts the standby.
    await driver.stop(vm, { discard: true });
    await driver.restoreCheckpoint(a, dir, { again: true });
    let woken = await driver.wake(a);
    expect(woken.tier).toBe("files");
    vm = woken.vm;
    expect(await count(vm)).toBe(3);
    expect(await bump(vm)).toBe(4);
    await waitFor(() => driver.standbys.has(a.vmId), 60_000, "the reset standby ready");

    // The second adopts it: no new QEMU, the checkpoint's count, the agent's identity; no standby file stays.
    for (let round = 0; round < 2; round++) {
      await driver.stop(vm, { discard: true });
      await driver.restoreCheckpoint(a, dir, { again: true });
      expect(driver.standbys.has(a.vmId)).toBe(false);
      // Its files are the VM's now (the next standby is made after the wake).
      expect(readdirSync(a.stateDir).filter((n) => /standby/.test(n))).toEqual(["disk.ext4.standby"].filter(() => a.rootImage !== undefined));
      woken = await driver.wake(a);
      expect(woken.tier).toBe("kept");
      vm = woken.vm;
      expect(await count(vm)).toBe(3);
      expect(await identityOf(vm)).toContain(`agentId=${a.agentId}`);
      expect(await bump(vm)).toBe(4);
      await waitFor(() => driver.standbys.has(a.vmId), 60_000, "the next reset standby ready");
    }

    // Hibernated and woken as any VM: the adopted QEMU's files are the VM's own.
    expect((await driver.hibernate(vm)).completed).toBe(true);
    vm = (await driver.wake(a)).vm;
    expect(await count(vm)).toBe(4);

    // A restore of another checkpoint does not adopt it (and ends it); a plain stop ends any standby.
    const other = join(root, "ckp_other");
    await driver.checkpoint(a, vm, other);
    await driver.stop(vm, { discard: true });
    await driver.restoreCheckpoint(a, other);
    expect(driver.standbys.has(a.vmId)).toBe(false);
    woken = await driver.wake(a);
    expect(woken.tier).toBe("files");
    expect(await count(woken.vm)).toBe(4);
    await driver.stop(woken.vm);
    expect(existsSync(join(a.stateDir, "ram.standby"))).toBe(false);
  }, 300_000);

  it("a standby an earlier process left (a host killed without its QEMUs' parent-death signal) is killed and its files removed by the reap", async () => {
    const a = makeSpec();
    specs.push(a);
    const leftover = standbyPaths(a.stateDir);
    // A process that stands for its QEMU: the pid file names it, its command line holds the standby's QMP socket.
    const child = spawn(process.execPath, ["-e", "setTimeout(() => {}, 600000)", opt(leftover.qmp)], { stdio: "ignore" });
    const exited = new Promise((r) => child.once("exit", r));
    writeFileSync(leftover.pid, `${child.pid}\n`);
    for (const f of [leftover.port, leftover.console, leftover.ramLink]) writeFileSync(f, "");
    await driver.reap(a);
    await exited;
    expect(child.signalCode).toBe("SIGKILL");
    expect(readdirSync(a.stateDir).filter((n) => /standby/.test(n))).toEqual([]);
  }, 60_000);
});

describe("reset standbys of a built image's VM (its disk)", () => {
  let fixture: RootfsFixture;
  let driver: QemuDriver;
  const specs: VmSpec[] = [];
  const root = mkdtempSync(join(tmpdir(), "qemu-standby-img-"));
  const cgi = async (vm: RunningVm, name: string, query = "") => (await call(vm.endpoint, `/cgi-bin/${name}${query ? `?${query}` : ""}`)).text.trim();

  beforeAll(async () => {
    fixture = makeRootfsFixture();
    driver = await makeDriver({ memory: "file", prestart: "paused" });
  }, 120_000);
  afterAll(async () => {
    await driver?.close();
    for (const s of specs) await driver?.destroy(s);
    fixture?.remove();
    rmSync(root, { recursive: true, force: true });
  });

  it("an adopted standby runs on a disk of the checkpoint's: the episode's write is gone, and what it writes next stays through a hibernation", async () => {
    const a = makeSpec({ image: fixture.artifact.digest, rootImage: fixture.artifact, diskMiB: 64 });
    specs.push(a);
    let vm = (await driver.boot(a)).vm;
    expect(await cgi(vm, "disk-write", "clean")).toBe("written");
    const dir = join(root, "ckp_img_episode");
    await driver.checkpoint(a, vm, dir);
    await driver.stop(vm, { discard: true });
    await driver.restoreCheckpoint(a, dir, { again: true });
    vm = (await driver.wake(a)).vm;
    expect(await cgi(vm, "disk-write", "episode-1")).toBe("written");
    await waitFor(() => driver.standbys.has(a.vmId), 60_000, "the reset standby ready");

    await driver.stop(vm, { discard: true });
    await driver.restoreCheckpoint(a, dir, { again: true });
    // Until the wake runs it, the VM's disk is the checkpoint's copy (the snapshot's pair); the standby's is its own.
    expect(existsSync(join(a.stateDir, "disk.ext4.standby"))).toBe(true);
    const woken = await driver.wake(a);
    expect(woken.tier).toBe("kept");
    vm = woken.vm;
    expect(existsSync(join(a.stateDir, "disk.ext4.standby"))).toBe(false);
    expect(await cgi(vm, "disk-read")).toBe("clean");
    expect(await cgi(vm, "disk-write", "episode-2")).toBe("written");
    expect((await driver.hibernate(vm)).completed).toBe(true);
    vm = (await driver.wake(a)).vm;
    expect(await cgi(vm, "disk-read")).toBe("episode-2");
  }, 300_000);
});

// A hibernated QEMU agent shipped between two "hosts" through the shared artifact store (both memory modes): host A
// commits its snapshot, host B (another data dir, another driver) materializes it, restores and wakes it, and the
// demo counter goes on where it stopped; a corrupted blob in the store is refused and nothing is restored. A built
// image's agent ships its 1 GiB disk with its memory, and a commit after a wake that wrote only memory puts no disk.
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { AgentSpec } from "../../contracts/agent.ts";
import { createDbCommitStore } from "../../fleet-agent/artifacts/commits.ts";
import { createDirArtifactStore } from "../../fleet-agent/artifacts/dir-store.ts";
import { createSnapshotShipper, type SnapshotShipper } from "../../fleet-agent/artifacts/shipper.ts";
import type { RunningVm, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import type { MemoryMode } from "../../fleet-agent/drivers/qemu/args.ts";
import type { QemuDriver } from "../../fleet-agent/drivers/qemu/driver.ts";
import { systemClock } from "../../lib/clock.ts";
import { silentLogger } from "../../lib/log.ts";
import { agents, tenants } from "../../schema/core.ts";
import type { Database } from "../../schema/db.ts";
import { freshDatabase } from "../helpers/db.ts";
import { call, json, makeDriver, makeSpec } from "../helpers/qemu.ts";
import { makeRootfsFixture, type RootfsFixture } from "../helpers/rootfs-fixture.ts";

const count = async (vm: RunningVm) => (await json<{ count: number }>(vm.endpoint, "/counter")).count;
const bump = async (vm: RunningVm) => (await json<{ count: number }>(vm.endpoint, "/counter", { method: "POST" })).count;
const MiB = 1 << 20;

let database: Database;
beforeAll(async () => {
  database = await freshDatabase();
  await database.db.insert(tenants).values({ id: "ten_ship", name: "ship" });
});
afterAll(async () => {
  await database?.close();
});

describe.each(["file", "stream"] as MemoryMode[])("a hibernated agent with %s memory shipped to another host", (memory) => {
  let root: string;
  beforeAll(() => {
    root = mkdtempSync(join(tmpdir(), "qship-"));
  });
  const drivers: QemuDriver[] = [];
  const specs: [QemuDriver, VmSpec][] = [];
  afterAll(async () => {
    for (const [d, s] of specs) await d.destroy(s).catch(() => {});
    for (const d of drivers) await d.close();
    if (root) rmSync(root, { recursive: true, force: true });
  });

  /** One host: its own driver, data dir, staging and cache over the shared store and database. */
  async function host(name: string): Promise<{ driver: QemuDriver; shipper: SnapshotShipper; vmSpec: (agentId: string) => VmSpec }> {
    const driver = await makeDriver({ memory });
    drivers.push(driver);
    const dataDir = join(root, name);
    const store = createDirArtifactStore({ root: join(root, "store"), cacheDir: join(dataDir, "artifact-cache") });
    const shipper = createSnapshotShipper({
      store,
      commits: createDbCommitStore(database.db),
      driver,
      stagingDir: join(dataDir, "staging"),
      hostId: `host_${name}`,
      log: silentLogger,
      clock: systemClock,
    });
    mkdirSync(dataDir, { recursive: true });
    const vmSpec = (agentId: string) => {
      const s = makeSpec({ agentId, stateDir: mkdtempSync(join(dataDir, "vm-")) });
      specs.push([driver, s]);
      return s;
    };
    return { driver, shipper, vmSpec };
  }

  it("commits on host A, materializes, restores and wakes on host B: the counter goes on at 4; a corrupted RAM blob restores nothing", async () => {
    const a = await host("a");
    const b = await host("b");
    const c = await host("c");
    const store = createDirArtifactStore({ root: join(root, "store") });
    const agentId = `agt_ship${memory}${process.pid}`;
    await database.db.insert(agents).values({ id: agentId, tenantId: "ten_ship", name: "s", image: "demo" });
    const spec: AgentSpec = {
      id: agentId,
      tenantId: "ten_ship",
      image: "demo",
      vcpus: 1,
      memMiB: 256,
      idleTimeoutMs: 60_000,
      streamIdleMs: 60_000,
      allowEgress: false,
    };

    // Host A: boot, count to 3, hibernate, commit.
    const vmA = a.vmSpec(agentId);
    const va = (await a.driver.boot(vmA)).vm;
    for (let i = 0; i < 3; i++) await bump(va);
    expect((await a.driver.hibernate(va)).completed).toBe(true);
    const first = await a.shipper.commit({ spec, vmSpec: vmA, generation: 1, snapshotAt: new Date() });
    expect(first?.won).toBe(true);
    const ramFile = memory === "file" ? "ram" : "state.bin";
    expect(Object.keys(first!.row.files).sort()).toEqual(memory === "file" ? ["checkpoint.json", "ram", "state.bin"] : ["checkpoint.json", "state.bin"]);
    expect(first!.bytesAdded).toBe(first!.row.bytes);
    expect(first!.bytesWritten).toBeLessThanOrEqual(first!.row.bytes);
    // The RAM file is 256 MiB; the store holds its blocks, not its holes.
    if (memory === "file") expect(first!.row.files.ram!.bytes).toBe(256 * MiB);
    const stored = Object.values(first!.row.files).reduce((n, f) => n + statSync(store.blobPath(f.digest)).blocks * 512, 0);

    // A second commit of the unchanged hibernated VM: every blob is there already but the manifest's.
    const again = await a.shipper.commit({ spec, vmSpec: vmA, generation: 1, snapshotAt: new Date(Date.now() + 1) });
    expect(again?.won).toBe(true);
    expect(again!.row.files[ramFile]).toEqual(first!.row.files[ramFile]);
    expect(again!.bytesAdded).toBeLessThan(4096);
    expect(again!.bytesWritten).toBe(again!.bytesAdded);

    // Host B: same agent, another data dir.
    const vmB = b.vmSpec(agentId);
    const dir = join(root, "b", "incoming");
    let t = performance.now();
    const row = await b.shipper.materialize(agentId, dir);
    const materializeMs = performance.now() - t;
    expect(row).toEqual(again!.row);
    await b.driver.restoreCheckpoint(vmB, dir);
    rmSync(dir, { recursive: true, force: true });
    t = performance.now();
    const woken = await b.driver.wake(vmB);
    const wakeMs = performance.now() - t;
    expect(woken.mode).toBe("restore");
    expect(await count(woken.vm)).toBe(3);
    expect(await bump(woken.vm)).toBe(4);

    // The RAM's blob corrupted in the store: host C (an empty cache) refuses it and restores nothing.
    const blob = store.blobPath(row!.files[ramFile]!.digest);
    const good = readFileSync(blob);
    const bad = Buffer.from(good);
    bad[Math.floor(bad.length / 2)]! ^= 0x10;
    writeFileSync(blob, bad);
    try {
      const vmC = c.vmSpec(agentId);
      const cdir = join(root, "c", "incoming");
      await expect(c.shipper.materialize(agentId, cdir)).rejects.toMatchObject({ code: "internal", message: expect.stringMatching(/corrupt in the store/) });
      expect(existsSync(cdir)).toBe(false);
      expect(existsSync(join(vmC.stateDir, "snapshot.json"))).toBe(false);
      expect((await c.driver.wake(vmC)).mode).toBe("boot"); // nothing to restore: a cold boot, counter from 0
    } finally {
      writeFileSync(blob, good);
    }

    console.log(
      `artifact shipping, ${memory} memory:`,
      JSON.stringify({
        commitMs: Math.round(first!.ms),
        checkpointMs: Math.round(first!.checkpointMs),
        putMs: Math.round(first!.putMs),
        bytes: first!.row.bytes,
        bytesPut: first!.bytesAdded,
        bytesWritten: first!.bytesWritten,
        storeAllocatedMiB: +(stored / MiB).toFixed(1),
        secondCommitMs: Math.round(again!.ms),
        secondCommitBytesPut: again!.bytesAdded,
        secondCommitBytesWritten: again!.bytesWritten,
        materializeMs: Math.round(materializeMs),
        wakeOnBMs: Math.round(wakeMs),
      }),
    );
  }, 900_000);
});

describe("a built image's agent (file memory, 1 GiB disk) shipped with its disk", () => {
  let fixture: RootfsFixture;
  let root: string;
  const drivers: QemuDriver[] = [];
  const specs: [QemuDriver, VmSpec][] = [];
  const cgi = async (vm: RunningVm, name: string, query = "") => (await call(vm.endpoint, `/cgi-bin/${name}${query ? `?${query}` : ""}`)).text.trim();
  beforeAll(() => {
    root = mkdtempSync(join(tmpdir(), "qship-img-"));
    fixture = makeRootfsFixture();
  });
  afterAll(async () => {
    for (const [d, s] of specs) await d.destroy(s).catch(() => {});
    for (const d of drivers) await d.close();
    fixture?.remove();
    if (root) rmSync(root, { recursive: true, force: true });
  });

  it("host B wakes with the file on the disk and the memory of host A; an unchanged disk is not put again", async () => {
    const store = createDirArtifactStore({ root: join(root, "store") });
    const commits = createDbCommitStore(database.db);
    const image = { image: fixture.artifact.digest, rootImage: fixture.artifact, diskMiB: 1024 };
    const agentId = `agt_shipimg${process.pid}`;
    await database.db.insert(agents).values({ id: agentId, tenantId: "ten_ship", name: "i", image: fixture.artifact.digest });
    const spec: AgentSpec = {
      id: agentId,
      tenantId: "ten_ship",
      image: fixture.artifact.digest,
      vcpus: 1,
      memMiB: 256,
      diskMiB: 1024,
      idleTimeoutMs: 60_000,
      streamIdleMs: 60_000,
      allowEgress: false,
    };
    const onHost = async (name: string) => {
      const driver = await makeDriver({ memory: "file" });
      drivers.push(driver);
      mkdirSync(join(root, name), { recursive: true });
      const vm = makeSpec({ ...image, agentId, stateDir: mkdtempSync(join(root, name, "vm-")) });
      specs.push([driver, vm]);
      const shipper = createSnapshotShipper({
        store: createDirArtifactStore({ root: store.root, cacheDir: join(root, name, "cache") }),
        commits,
        driver,
        stagingDir: join(root, name, "staging"),
        hostId: `host_${name}`,
        log: silentLogger,
        clock: systemClock,
      });
      return { driver, vm, shipper };
    };
    const a = await onHost("a");
    let va = (await a.driver.boot(a.vm)).vm;
    expect(await cgi(va, "disk-write", "shipped-on-disk")).toBe("written");
    expect((await a.driver.hibernate(va)).completed).toBe(true);
    const first = await a.shipper.commit({ spec, vmSpec: a.vm, generation: 1, snapshotAt: new Date() });
    expect(first?.won).toBe(true);
    expect(first!.row.files["disk.ext4"]!.bytes).toBe(1024 * MiB);
    // A wake that writes only memory, then a hibernation and a commit: the disk's blob is the same one.
    va = (await a.driver.wake(a.vm)).vm;
    expect(await cgi(va, "tmp-write", "in-memory")).toBe("written");
    expect((await a.driver.hibernate(va)).completed).toBe(true);
    const second = await a.shipper.commit({ spec, vmSpec: a.vm, generation: 1, snapshotAt: new Date() });
    expect(second?.won).toBe(true);
    const diskSame = second!.row.files["disk.ext4"]!.digest === first!.row.files["disk.ext4"]!.digest;

    const b = await onHost("b");
    const dir = join(root, "b", "incoming");
    const t = performance.now();
    expect(await b.shipper.materialize(agentId, dir)).toEqual(second!.row);
    const materializeMs = performance.now() - t;
    await b.driver.restoreCheckpoint(b.vm, dir);
    rmSync(dir, { recursive: true, force: true });
    const woken = await b.driver.wake(b.vm);
    expect(woken.mode).toBe("restore");
    expect(await cgi(woken.vm, "disk-read")).toBe("shipped-on-disk");
    expect(await cgi(woken.vm, "tmp-read")).toBe("in-memory");
    console.log(
      "artifact shipping, built image with a 1 GiB disk:",
      JSON.stringify({
        commitMs: Math.round(first!.ms),
        bytes: first!.row.bytes,
        bytesWritten: first!.bytesWritten,
        diskWrittenMiB: +((statSync(store.blobPath(first!.row.files["disk.ext4"]!.digest)).blocks * 512) / MiB).toFixed(1),
        secondCommitMs: Math.round(second!.ms),
        secondCommitDiskUnchanged: diskSame,
        secondCommitBytesPut: second!.bytesAdded,
        secondCommitBytesWritten: second!.bytesWritten,
        materializeMs: Math.round(materializeMs),
      }),
    );
  }, 900_000);
});

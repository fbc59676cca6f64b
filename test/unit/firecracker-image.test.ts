// Contract test of the firecracker driver with a built image: the real driver against the fake firecracker (which
// validates every request against firecracker.yaml and plays the guest's init for the image's drives). The three
// drives in order before InstanceStart, the launch data on the image's port, SYNC before the pause, the disk's
// fingerprint in the manifest and every reason a wake boots cold instead; the jailer's chroot; boot failures.
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { open } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { guestLeaseDir, type ImageArtifact } from "../../contracts/image.ts";
import { AppError } from "../../lib/errors.ts";
import { createLogger } from "../../lib/log.ts";
import { agentDiskPath, diskFingerprint } from "../../fleet-agent/drivers/common/agent-disk.ts";
import type { RunningVm, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { FirecrackerDriver, type FirecrackerDriverOptions, vmPaths } from "../../fleet-agent/drivers/firecracker/driver.ts";
import { stageImageFiles } from "../../fleet-agent/drivers/firecracker/image-drives.ts";
import { readManifest } from "../../fleet-agent/drivers/firecracker/snapshot.ts";
import type { FakeRequestRecord } from "../helpers/firecracker-fake.ts";
import {
  callGuest,
  fakeDriverOptions,
  makeFakeFirecrackerBinary,
  makeFakeImage,
  writeCpuinfo,
  type FakeFirecrackerBinary,
} from "../helpers/firecracker-harness.ts";
import { firecrackerSpecMissing } from "../helpers/firecracker-spec.ts";

const specMissing = firecrackerSpecMissing("test/unit/firecracker-image.test.ts");

let root: string;
let fake: FakeFirecrackerBinary;
let cpuinfo: string;
let kvm: string;
let image: ImageArtifact;
beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), "fci-"));
  fake = makeFakeFirecrackerBinary(join(root, "bin"));
  cpuinfo = writeCpuinfo(join(root, "cpuinfo"));
  kvm = join(root, "kvm");
  writeFileSync(kvm, "");
  image = makeFakeImage(join(root, "image"));
});
const CIDR = "127.78.0.0/16";
const drivers: FirecrackerDriver[] = [];
afterAll(async () => {
  await Promise.all(drivers.map((d) => d.close()));
  rmSync(root, { recursive: true, force: true });
});

function makeDriver(extra: Partial<FirecrackerDriverOptions> = {}): FirecrackerDriver {
  const d = new FirecrackerDriver({
    ...fakeDriverOptions(fake, { root, cidr: CIDR, kvm, cpuinfo }),
    images: async (name) => {
      // A built image's VM boots the demo's guest (kernel + initramfs whose init runs images).
      if (name !== "demo") throw new Error(`unknown guest image ${name}`);
      return { kernel: fake.kernel, initrd: fake.initrd };
    },
    ...extra,
  });
  drivers.push(d);
  return d;
}

function spec(name: string, extra: Partial<VmSpec> = {}): VmSpec {
  const rootImage = extra.rootImage ?? image;
  return {
    vmId: `vm_${name}`,
    agentId: `agt_${name}`,
    image: rootImage.digest,
    vcpus: 1,
    memMiB: 128,
    allowEgress: false,
    stateDir: join(root, name),
    rootImage,
    diskMiB: 16,
    ...extra,
  };
}

const call = (vm: RunningVm, path: string, method = "GET") => callGuest<unknown>(vm, path, method);

const requestsOf = (pid: number | undefined): FakeRequestRecord[] => fake.requests().filter((r) => r.pid === pid);
const configCalls = (pid: number | undefined) => requestsOf(pid).filter((r) => r.method !== "GET");

describe.skipIf(specMissing)("firecracker driver with a built image (fake firecracker)", () => {
  it("boots: three drives in a fixed order before InstanceStart, the launch data on the image's port", async () => {
    const d = makeDriver();
    const s = spec("boot");
    const { vm } = await d.boot(s);
    expect(vm.endpoint).toEqual({ host: expect.stringMatching(/^127\.78\.0\.\d+$/), port: 9123 });
    const reqs = configCalls(vm.pid);
    expect(reqs.map((r) => `${r.method} ${r.path}`)).toEqual([
      "PUT /machine-config",
      "PUT /boot-source",
      "PUT /drives/image",
      "PUT /drives/disk",
      "PUT /drives/launch",
      "PUT /network-interfaces/eth0",
      "PUT /vsock",
      "PUT /actions",
    ]);
    expect(reqs.every((r) => r.status === 204 && r.schemaErrors.length === 0)).toBe(true);
    const disk = agentDiskPath(s.stateDir);
    expect(reqs.slice(2, 5).map((r) => r.body)).toEqual([
      { drive_id: "image", is_root_device: false, is_read_only: true, path_on_host: image.rootfs },
      { drive_id: "disk", is_root_device: false, is_read_only: false, path_on_host: disk },
      { drive_id: "launch", is_root_device: false, is_read_only: true, path_on_host: join(s.stateDir, "launch.ext4") },
    ]);
    // The disk was made on this first boot: sparse, diskMiB in size, labelled for the init.
    expect(statSync(disk).size).toBe(16 << 20);
    expect(statSync(disk).blocks * 512).toBeLessThan(16 << 20);
    // What the fake init read from the launch drive: the image's command and env, then the host's PORT, AGENT_ID, LEASE_DIR.
    const launch = (await call(vm, "/launch")) as { argv: string[]; env: string[]; workdir: string; uid: number };
    expect(launch.argv).toEqual(["/app/agent", "--serve"]);
    expect(launch.workdir).toBe("/app");
    expect(launch.env).toEqual(expect.arrayContaining(["GREETING=hello", "PORT=9123", "AGENT_ID=agt_boot", `LEASE_DIR=${guestLeaseDir}`]));
    expect(readFileSync(d.logPath(s), "utf8")).toContain("agentvm: entrypoint started");
    await d.stop(vm);
    expect(existsSync(disk)).toBe(true); // stop keeps the disk
  });

  it("hibernate syncs the guest before the pause and records the disk; wake restores without configuring drives", async () => {
    const d = makeDriver();
    const s = spec("cycle");
    const { vm } = await d.boot(s);
    await call(vm, "/counter", "POST");
    await call(vm, "/disk-write", "POST"); // the guest wrote to its disk while it ran
    const snap = await d.hibernate(vm);
    expect(snap.completed).toBe(true);

    const sync = fake.guestCommands().filter((g) => g.pid === vm.pid && g.command === "SYNC");
    expect(sync).toHaveLength(1);
    expect(sync[0]!.answer).toBe("OK synced");
    const pause = requestsOf(vm.pid).find((r) => r.method === "PATCH" && (r.body as { state: string }).state === "Paused")!;
    expect(sync[0]!.at).toBeLessThan(pause.at);

    const { manifest } = await readManifest(vmPaths(s.stateDir).snapDir);
    expect(manifest!.image).toEqual({
      digest: image.digest,
      drives: configCalls(vm.pid)
        .filter((r) => r.path.startsWith("/drives/"))
        .map((r) => r.body),
      disk: await diskFingerprint(agentDiskPath(s.stateDir)),
    });
    expect(manifest!.image!.disk.generation).not.toBe("");

    const launchDrive = join(s.stateDir, "launch.ext4");
    const launchInode = statSync(launchDrive).ino;
    const woke = await d.wake(s);
    expect(woke.mode).toBe("restore");
    expect(woke.vm.endpoint.port).toBe(9123);
    expect(statSync(launchDrive).ino).toBe(launchInode); // a restore keeps the boot's launch drive (no mke2fs per wake)
    expect(await call(woke.vm, "/counter")).toEqual({ count: 1 });
    // Firecracker restores the drives from the snapshot: the load is the only configuration call.
    expect(configCalls(woke.vm.pid).map((r) => r.path)).toEqual(["/snapshot/load"]);
    // The restored guest writes to the disk again: its generation moved on.
    expect((await diskFingerprint(agentDiskPath(s.stateDir))).generation).not.toBe(manifest!.image!.disk.generation);
    await d.stop(woke.vm);
  });

  it("a disk changed while hibernated → cold boot saying so, over the disk as it is", async () => {
    const d = makeDriver();
    const s = spec("touched");
    const { vm } = await d.boot(s);
    await call(vm, "/counter", "POST");
    await d.hibernate(vm);
    const disk = agentDiskPath(s.stateDir);
    const inode = statSync(disk).ino;
    const fh = await open(disk, "r+");
    await fh.write(Buffer.from("changed from outside"), 0, undefined, (16 << 20) - 8192);
    await fh.close();
    const woke = await d.wake(s);
    expect(woke.mode).toBe("boot");
    expect(woke.fallbackReason).toBe("disk changed since the snapshot (modified after it was taken)");
    expect(await call(woke.vm, "/counter")).toEqual({ count: 0 });
    // The same disk, not a new one: the files are intact.
    expect(statSync(disk).ino).toBe(inode);
    expect(readFileSync(disk).includes("changed from outside")).toBe(true);
    await d.stop(woke.vm);
  });

  it("after a host crash the old snapshot is not restored over a disk the restored VM ran on", async () => {
    const first = makeDriver();
    const s = spec("crash");
    const { vm } = await first.boot(s);
    await first.hibernate(vm);
    const woke = await first.wake(s);
    expect(woke.mode).toBe("restore");
    // The host dies while the restored VM runs (no new snapshot); the next fleet-agent reaps what was left.
    process.kill(woke.vm.pid!, "SIGKILL");
    const second = makeDriver();
    await second.reap(s);
    const again = await second.wake(s);
    expect(again.mode).toBe("boot");
    expect(again.fallbackReason).toBe("disk changed since the snapshot (the VM ran on the disk after it was taken)");
    await second.stop(again.vm);
  });

  it("a snapshot of another image, or with the image's file elsewhere, boots cold with the reason", async () => {
    const d = makeDriver();
    const s = spec("other");
    const { vm } = await d.boot(s);
    await d.hibernate(vm);

    const other = makeFakeImage(join(root, "image-2"));
    const w1 = await d.wake({ ...s, rootImage: other, image: other.digest });
    expect(w1.mode).toBe("boot");
    expect(w1.fallbackReason).toBe(`snapshot runs image ${image.digest}, the agent now runs image ${other.digest}`);
    await d.hibernate(w1.vm);

    // The same image (digest) found at another path: Firecracker would reopen the old path, so no restore.
    const moved = join(root, "image-2", "moved.ext4");
    copyFileSync(other.rootfs, moved);
    const w2 = await d.wake({ ...s, rootImage: { ...other, rootfs: moved }, image: other.digest });
    expect(w2.mode).toBe("boot");
    expect(w2.fallbackReason).toMatch(/^the snapshot's drives \(image=.*image-2\/rootfs\.ext4 \(ro\), .*\) are not the VM's now \(image=.*moved\.ext4 \(ro\)/);
    await d.hibernate(w2.vm);

    // Its file gone: no load is tried (Firecracker would fail it); the cold boot then cannot open it either.
    rmSync(moved);
    const before = fake.requests().length;
    const err = await d.wake({ ...s, rootImage: { ...other, rootfs: moved }, image: other.digest }).catch((e: unknown) => e);
    expect(
      fake
        .requests()
        .slice(before)
        .filter((r) => r.path === "/snapshot/load"),
    ).toEqual([]);
    expect(err).toBeInstanceOf(AppError);
    expect((err as AppError).code).toBe("boot_failed");
    expect((err as Error).message).toMatch(/Unable to create the block device.*moved\.ext4/);
  });

  it("an entrypoint that exits at once fails the boot at once: boot_failed with the console's tail", async () => {
    fake.setBehaviour({ entrypointExits: 3 });
    const d = makeDriver({ bootTimeoutMs: 20_000 });
    const t0 = performance.now();
    const err = await d.boot(spec("exits")).catch((e: unknown) => e);
    fake.setBehaviour({});
    expect(performance.now() - t0).toBeLessThan(5000);
    expect(err).toBeInstanceOf(AppError);
    expect((err as AppError).code).toBe("boot_failed");
    expect((err as Error).message).toMatch(
      /^agent agt_exits did not boot: the image's entrypoint exited with status 3 \(console: .*agentvm: entrypoint started \| agentvm: entrypoint exited with status 3\)$/,
    );
  });

  it("an image the init cannot find (wrong label) fails the boot at once, naming the drive", async () => {
    const unlabelled = makeFakeImage(join(root, "image-unlabelled"), {}, { label: "something-else" });
    const d = makeDriver({ bootTimeoutMs: 20_000 });
    const t0 = performance.now();
    const err = await d.boot(spec("nolabel", { rootImage: unlabelled })).catch((e: unknown) => e);
    expect(performance.now() - t0).toBeLessThan(5000);
    expect((err as AppError).code).toBe("boot_failed");
    expect((err as Error).message).toMatch(/the image's image setup failed: no drive labelled agentvm-image/);
  });

  it("readiness is the image's readyPath answering below 500; one that never does fails at the boot timeout", async () => {
    const withReady = makeFakeImage(join(root, "image-ready"), { readyPath: "/ready" });
    fake.setBehaviour({ readyAfterMs: 800 });
    const { vm, bootMs } = await makeDriver().boot(spec("ready", { rootImage: withReady }));
    expect(bootMs).toBeGreaterThan(800);
    expect(await call(vm, "/ready")).toEqual({ ready: true });
    await drivers.at(-1)!.stop(vm);

    fake.setBehaviour({ readyAfterMs: 60_000 });
    const t0 = performance.now();
    const err = await makeDriver({ bootTimeoutMs: 3000 })
      .boot(spec("never", { rootImage: withReady }))
      .catch((e: unknown) => e);
    fake.setBehaviour({});
    const took = performance.now() - t0;
    expect(took).toBeGreaterThan(2900);
    expect(took).toBeLessThan(6000);
    expect((err as AppError).code).toBe("boot_failed");
    expect((err as Error).message).toMatch(/did not answer HTTP on port 9123 \(GET \/ready\) within the boot timeout/);
  });

  it("a guest that cannot sync is logged and the hibernation still completes", async () => {
    const lines: string[] = [];
    fake.setBehaviour({ syncFails: true });
    const d = makeDriver({ logger: createLogger({ level: "warn", write: (l) => lines.push(l) }) });
    const s = spec("nosync");
    const { vm } = await d.boot(s);
    fake.setBehaviour({});
    expect((await d.hibernate(vm)).completed).toBe(true);
    expect(lines.map((l) => JSON.parse(l) as { msg: string; err: { message: string } })).toContainEqual(
      expect.objectContaining({
        msg: "guest sync before the snapshot failed; snapshotting anyway",
        err: expect.objectContaining({ message: "guest agent: sync: Input/output error" }),
      }),
    );
    expect((await d.wake(s)).mode).toBe("restore");
    await d.destroy(s);
  });

  it("destroy removes the disk with the rest of the VM", async () => {
    const d = makeDriver();
    const s = spec("doomed");
    await d.boot(s);
    expect(existsSync(agentDiskPath(s.stateDir))).toBe(true);
    await d.destroy(s);
    expect(existsSync(agentDiskPath(s.stateDir))).toBe(false);
    expect(existsSync(s.stateDir)).toBe(false);
  });

  it("under the jailer the drive files are linked into the chroot (the disk is the same file) and found again on restore", async () => {
    const d = makeDriver({ jailer: { binary: fake.jailer, uid: process.getuid!(), gid: process.getgid!() } });
    const s = spec("jailed");
    const { vm } = await d.boot(s);
    const paths = d.paths(s);
    const drives = configCalls(vm.pid)
      .filter((r) => r.path.startsWith("/drives/"))
      .map((r) => r.body);
    expect(drives).toEqual([
      { drive_id: "image", is_root_device: false, is_read_only: true, path_on_host: "/image.ext4" },
      { drive_id: "disk", is_root_device: false, is_read_only: false, path_on_host: "/disk.ext4" },
      { drive_id: "launch", is_root_device: false, is_read_only: true, path_on_host: "/launch.ext4" },
    ]);
    expect(statSync(join(paths.root, "disk.ext4")).ino).toBe(statSync(agentDiskPath(s.stateDir)).ino);
    expect(statSync(join(paths.root, "image.ext4")).ino).toBe(statSync(image.rootfs).ino); // same filesystem: linked, not copied
    await call(vm, "/counter", "POST");
    await call(vm, "/disk-write", "POST");
    await d.hibernate(vm);
    // A stale link (a chroot restored from elsewhere) is replaced by the real files before the load.
    rmSync(join(paths.root, "launch.ext4"));
    const woke = await d.wake(s);
    expect(woke.mode).toBe("restore");
    expect(await call(woke.vm, "/counter")).toEqual({ count: 1 });
    expect(existsSync(join(paths.root, "launch.ext4"))).toBe(true);
    await d.stop(woke.vm);
  });
});

describe.skipIf(specMissing)("the contract with images", () => {
  it("every request body the driver sent in this file conforms to firecracker.yaml; the only refusals were provoked", () => {
    const all = fake.requests();
    expect(all.filter((r) => r.path.startsWith("/drives/")).length).toBeGreaterThanOrEqual(30);
    expect(all.filter((r) => r.schemaErrors.length > 0)).toEqual([]);
    expect(all.filter((r) => r.status >= 400).map((r) => r.fault)).toEqual([
      expect.stringMatching(/^Unable to create the block device: BackingFile.*moved\.ext4/),
    ]);
  });
});

// /dev/shm is another filesystem than the temp dir here: a link from one to the other fails (EXDEV), as it does from
// an image store on another disk than the VMs' state.
const otherFs = existsSync("/dev/shm") && statSync("/dev/shm").dev !== statSync(tmpdir()).dev ? "/dev/shm" : undefined;
describe.skipIf(!otherFs)("staging the drive files in a jailer's chroot across filesystems", () => {
  it("an image on another filesystem is copied once (and again only for another digest); the disk must link or fail", async () => {
    const chroot = mkdtempSync(join(otherFs!, "fci-chroot-"));
    try {
      const state = join(root, "stage-state");
      const files = { image: image.rootfs, disk: join(state, "disk.ext4"), launch: join(chroot, "launch-src.ext4") };
      mkdirSync(state, { recursive: true });
      writeFileSync(files.disk, "disk");
      writeFileSync(files.launch, "launch");
      const opts = {
        root: chroot,
        vm: (p: string) => `/${p.slice(chroot.length + 1)}`,
        jailer: { uid: process.getuid!(), gid: process.getgid!() },
        imageDigest: image.digest,
      };
      // The disk lives with the VM's state; in a chroot on another filesystem it cannot be the same file: refused.
      await expect(stageImageFiles(files, opts)).rejects.toThrow(/cannot link .*disk\.ext4 into the jailer's chroot/);
      const sameFsDisk = join(chroot, "disk-src.ext4");
      writeFileSync(sameFsDisk, "disk");
      const placed = await stageImageFiles({ ...files, disk: sameFsDisk }, opts);
      expect(placed).toEqual({ image: "/image.ext4", disk: "/disk.ext4", launch: "/launch.ext4" });
      const copy = join(chroot, "image.ext4");
      expect(statSync(copy).ino).not.toBe(statSync(image.rootfs).ino);
      expect(readFileSync(copy).equals(readFileSync(image.rootfs))).toBe(true);
      expect(readFileSync(`${copy}.digest`, "utf8")).toBe(image.digest);
      const inode = statSync(copy).ino;
      await stageImageFiles({ ...files, disk: sameFsDisk }, opts);
      expect(statSync(copy).ino).toBe(inode); // kept: not copied at every wake
      await stageImageFiles({ ...files, disk: sameFsDisk }, { ...opts, imageDigest: `sha256:${"0".repeat(64)}` });
      expect(statSync(copy).ino).not.toBe(inode);
      expect(statSync(join(chroot, "disk.ext4")).ino).toBe(statSync(sameFsDisk).ino);
    } finally {
      rmSync(chroot, { recursive: true, force: true });
    }
  });
});

// The qemu driver with a built image (a busybox ext4 made here): the entrypoint runs in an overlay over the image with
// the agent's persistent disk as its upper layer; hibernate/wake pairs memory and disk; boot failures are boot_failed.
import { execFileSync, spawnSync } from "node:child_process";
import { appendFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AppError } from "../../lib/errors.ts";
import { agentDiskPath, beginDiskGeneration, diskChange, diskFingerprint, ensureAgentDisk } from "../../fleet-agent/drivers/common/agent-disk.ts";
import { launchSpecFor, makeLaunchDrive } from "../../fleet-agent/drivers/common/launch-data.ts";
import type { RunningVm, VmExit, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { machineArgs, TCG_TB_MIB, vmPaths } from "../../fleet-agent/drivers/qemu/args.ts";
import type { QemuDriver } from "../../fleet-agent/drivers/qemu/driver.ts";
import type { SnapshotManifest } from "../../fleet-agent/drivers/qemu/snapshot.ts";
import { decodeLaunchSpec, encodeLaunchSpec, launchSource } from "../../fleet-agent/guest/launch-spec.ts";
import { call, makeDriver, makeSpec } from "../helpers/qemu.ts";
import { fixtureConfig, makeRootfsFixture, type RootfsFixture } from "../helpers/rootfs-fixture.ts";
import { sbin } from "../helpers/sbin.ts";

const DISK_MIB = 64;
const manifestOf = (spec: VmSpec) => JSON.parse(readFileSync(join(spec.stateDir, "snapshot.json"), "utf8")) as SnapshotManifest;

async function cgi(vm: RunningVm, name: string, query = ""): Promise<string> {
  const r = await call(vm.endpoint, `/cgi-bin/${name}${query ? `?${query}` : ""}`);
  expect(r.status, `${name}: ${r.text}`).toBe(200);
  return r.text.trim();
}

/** A file inside the agent's disk, read on the host with debugfs (no mount): proof the write reached the disk. */
function readFromDisk(spec: VmSpec, path: string): string {
  return execFileSync(sbin("debugfs"), ["-R", `cat /upper${path}`, agentDiskPath(spec.stateDir)], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] });
}

async function bootFailure(p: Promise<unknown>): Promise<AppError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(AppError);
  expect((err as AppError).code).toBe("boot_failed");
  return err as AppError;
}

describe("qemu driver with a built image", () => {
  let fixture: RootfsFixture;
  let driver: QemuDriver;
  let spec: VmSpec;
  let vm: RunningVm;

  beforeAll(async () => {
    fixture = makeRootfsFixture();
    driver = await makeDriver();
    spec = makeSpec({ agentId: "agt_rootfs1", image: fixture.artifact.digest, rootImage: fixture.artifact, diskMiB: DISK_MIB });
    vm = (await driver.boot(spec)).vm;
  }, 180_000);

  afterAll(async () => {
    await driver?.close();
    if (spec) await driver?.destroy(spec);
    fixture?.remove();
  });

  it("runs the entrypoint as the image's user with PORT and AGENT_ID; its stdout is the console log", async () => {
    expect(await cgi(vm, "env")).toBe(
      "agent=agt_rootfs1 port=8081 lease=/run/agentvm/leases uid=1000 gid=1000 cwd=/www/cgi-bin path=/usr/sbin:/usr/bin:/sbin:/bin home=/",
    );
    const log = readFileSync(driver.logPath(spec), "utf8");
    expect(log).toContain("workload-started port=8081 agent=agt_rootfs1");
    expect(log).toContain("url:/cgi-bin/env"); // httpd -vv on stderr: the workload's stderr is in the log too
    // Readiness asked the guest whether the port listens: the workload saw no request before the test's own.
    expect(log.match(/url:\S+/g)).toEqual(["url:/cgi-bin/env"]);
    const disk = statSync(agentDiskPath(spec.stateDir));
    expect(disk.size).toBe(DISK_MIB * 1024 * 1024);
    expect(disk.blocks * 512).toBeLessThan(disk.size); // sparse
  });

  it("a lease file written in LEASE_DIR inside the image's root is counted by guestLeases", async () => {
    expect(await driver.guestLeases(vm)).toBe(0);
    expect(await cgi(vm, "lease")).toBe("leased");
    expect(await driver.guestLeases(vm)).toBe(1);
  });

  it("hibernate + wake restores memory and disk: a file on the disk and a value in /tmp both survive", async () => {
    expect(await cgi(vm, "disk-write", "on-the-disk")).toBe("written");
    expect(await cgi(vm, "tmp-write", "in-memory")).toBe("written");
    const snap = await driver.hibernate(vm);
    expect(snap.completed).toBe(true);
    const m = manifestOf(spec);
    expect(m.disk).toMatchObject({ bytes: DISK_MIB * 1024 * 1024 });
    expect(m.disk!.generation).not.toBe("");
    expect(readFromDisk(spec, "/data/note.txt")).toBe("on-the-disk"); // synced before the snapshot
    const launchDrive = () => {
      const st = statSync(join(spec.stateDir, "launch.ext4"));
      return { ino: st.ino, mtimeMs: st.mtimeMs };
    };
    const bootDrive = launchDrive();

    const woke = await driver.wake(spec);
    expect(woke.fallbackReason).toBeUndefined();
    expect(woke.mode).toBe("restore");
    expect(launchDrive()).toEqual(bootDrive); // the guest read it at its boot: a restore makes no new one
    vm = woke.vm;
    expect(await cgi(vm, "disk-read")).toBe("on-the-disk");
    expect(await cgi(vm, "tmp-read")).toBe("in-memory");
  });

  it("a lost memory snapshot boots cold: the disk's file is there, /tmp is empty", async () => {
    expect((await driver.hibernate(vm)).completed).toBe(true);
    for (const f of readdirSync(spec.stateDir)) if (/^snapshot-.*\.bin$/.test(f)) rmSync(join(spec.stateDir, f));
    const woke = await driver.wake(spec);
    expect(woke.mode).toBe("boot");
    expect(woke.fallbackReason).toMatch(/missing/);
    vm = woke.vm;
    expect(await cgi(vm, "disk-read")).toBe("on-the-disk");
    expect(await cgi(vm, "tmp-read")).toMatch(/No such file/);
  });

  it("a disk touched while hibernated is not restored under the old memory: cold boot saying why, files intact", async () => {
    expect(await cgi(vm, "tmp-write", "again")).toBe("written");
    expect((await driver.hibernate(vm)).completed).toBe(true);
    const later = new Date(Date.now() + 5000);
    utimesSync(agentDiskPath(spec.stateDir), later, later);
    const woke = await driver.wake(spec);
    expect(woke.mode).toBe("boot");
    expect(woke.fallbackReason).toMatch(/^disk changed since the snapshot/);
    vm = woke.vm;
    expect(await cgi(vm, "disk-read")).toBe("on-the-disk");
    expect(await cgi(vm, "tmp-read")).toMatch(/No such file/);
  });

  it("a VM that ran on its disk after a restore (then the host died) never gets that old memory again", async () => {
    expect((await driver.hibernate(vm)).completed).toBe(true);
    const restored = await driver.wake(spec);
    expect(restored.mode).toBe("restore");
    // The host dies while the restored VM runs: its QEMU is gone, the snapshot of before the restore is still there.
    await driver.stop(restored.vm);
    expect(existsSync(join(spec.stateDir, manifestOf(spec).file))).toBe(true);
    const woke = await driver.wake(spec);
    expect(woke.mode).toBe("boot");
    expect(woke.fallbackReason).toMatch(/^disk changed since the snapshot/);
    vm = woke.vm;
    expect(await cgi(vm, "disk-read")).toBe("on-the-disk");
  });

  it("writing past diskMiB is ENOSPC in the guest; the VM stays up and the host file stays within diskMiB", async () => {
    const out = await cgi(vm, "fill");
    expect(out).toMatch(/No space left on device/);
    expect(out).toMatch(/dd-status=1/);
    expect(await cgi(vm, "env")).toMatch(/^agent=agt_rootfs1 /); // still serving
    const disk = statSync(agentDiskPath(spec.stateDir));
    expect(disk.size).toBe(DISK_MIB * 1024 * 1024);
    expect(disk.blocks * 512).toBeLessThanOrEqual(DISK_MIB * 1024 * 1024);
    expect(await cgi(vm, "unfill")).toBe("removed");
    expect(await cgi(vm, "disk-read")).toBe("on-the-disk");
  });

  it("an entrypoint that exits after the boot powers the VM off: onExit reports it, the console says why", async () => {
    const exits: VmExit[] = [];
    driver.onExit(vm, (e) => exits.push(e));
    // Under TCG this whole test took 4.0–6.1 s alone; in two full runs on a loaded machine no exit came within 10 s
    // and then 30 s. The crash call is sent again every 10 s (a request that never reached the guest's httpd crashes
    // nothing; once httpd is gone a repeat fails at once), up to 60 s; a failure shows the console's tail.
    for (let i = 0; i < 800 && exits.length === 0; i++) {
      if (i % 200 === 0) void call(vm.endpoint, "/cgi-bin/crash", { signal: AbortSignal.timeout(9_000) }).catch(() => undefined);
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(exits, `no exit; console:\n${readFileSync(driver.logPath(spec), "utf8").slice(-3000)}`).toHaveLength(1);
    expect(readFileSync(driver.logPath(spec), "utf8")).toMatch(/agentvm: entrypoint exited with status \d+/);
    // The next wake boots it again over the same disk.
    const woke = await driver.wake(spec);
    vm = woke.vm;
    expect(await cgi(vm, "disk-read")).toBe("on-the-disk");
  }, 120_000);

  it("destroy removes the agent's disk; stop keeps it", async () => {
    await driver.stop(vm);
    expect(existsSync(agentDiskPath(spec.stateDir))).toBe(true);
    await driver.destroy(spec);
    expect(existsSync(agentDiskPath(spec.stateDir))).toBe(false);
  });
});

describe("qemu driver: when a built image is ready, and when it does not come up", () => {
  let fixture: RootfsFixture;
  const specs: VmSpec[] = [];
  let driver: QemuDriver;
  const BOOT_TIMEOUT_MS = 15_000;

  beforeAll(async () => {
    fixture = makeRootfsFixture();
    driver = await makeDriver({ bootTimeoutMs: BOOT_TIMEOUT_MS });
  }, 180_000);

  afterAll(async () => {
    await driver?.close();
    for (const s of specs) await driver?.destroy(s);
    fixture?.remove();
  });

  const specWith = (config: ReturnType<typeof fixtureConfig>) => {
    const s = makeSpec({ image: fixture.artifact.digest, rootImage: { ...fixture.artifact, config }, diskMiB: 32 });
    specs.push(s);
    return s;
  };

  it("with readyPath the boot waits through 5xx answers on it until it answers 2xx", async () => {
    const s = specWith(fixtureConfig({ cmd: ['(sleep 2; : > /tmp/ready) & exec httpd -f -p "$PORT" -h /www'], readyPath: "/cgi-bin/ready" }));
    const { vm } = await driver.boot(s);
    const log = readFileSync(driver.logPath(s), "utf8");
    expect(log).toContain("ready-probe: not yet");
    expect(log).toContain("ready-probe: ready");
    expect(log.indexOf("ready-probe: not yet")).toBeLessThan(log.indexOf("ready-probe: ready"));
    expect((await call(vm.endpoint, "/cgi-bin/ready")).status).toBe(200);
    await driver.stop(vm);
  });

  it("an entrypoint that exits at once fails the boot at once: boot_failed with its status and the console's tail", async () => {
    const s = specWith(fixtureConfig({ cmd: ['echo "about to fail on purpose"; exit 3'] }));
    const started = performance.now();
    const err = await bootFailure(driver.boot(s));
    expect(performance.now() - started).toBeLessThan(BOOT_TIMEOUT_MS * 0.75);
    expect(err.message).toMatch(/entrypoint exited with status 3/);
    expect(err.message).toContain("about to fail on purpose");
    expect(err.status).toBe(503);
    expect(readFileSync(driver.logPath(s), "utf8")).toContain("about to fail on purpose");
  });

  it("an entrypoint that is not in the image fails the boot at once (the launcher's 127)", async () => {
    const s = specWith(fixtureConfig({ entrypoint: ["no-such-program"], cmd: [] }));
    const err = await bootFailure(driver.boot(s));
    expect(err.message).toMatch(/entrypoint exited with status 127/);
    expect(err.message).toContain("launch: cannot execute no-such-program");
  });

  it("an entrypoint that never listens fails the boot at the boot timeout", async () => {
    const s = specWith(fixtureConfig({ cmd: ['echo "sleeping instead of serving"; exec sleep 1000'] }));
    const started = performance.now();
    const err = await bootFailure(driver.boot(s));
    expect(performance.now() - started).toBeGreaterThanOrEqual(BOOT_TIMEOUT_MS - 500);
    expect(err.message).toMatch(/did not listen on port 8081 within the boot timeout/);
    expect(err.message).toContain("sleeping instead of serving");
  }, 60_000);
});

describe("the pieces of a built image's VM, without a VM", () => {
  let work: string;
  beforeAll(() => {
    work = mkdtempSync(join(tmpdir(), "rootfs-pieces-"));
  });
  afterAll(() => rmSync(work, { recursive: true, force: true }));

  it("machine arguments: the demo's are as before; an image adds its three drives (image and launch read-only) and forwards to its port", () => {
    const stateDir = join(work, "vm");
    const demo = makeSpec({ stateDir });
    const demoArgs = machineArgs({ spec: demo, paths: vmPaths(stateDir), accel: "tcg", hostPort: 4000 });
    // Exactly the demo's arguments before built images (its snapshots name them).
    expect(demoArgs).toEqual([
      "-M",
      "microvm,x-option-roms=off,pit=off,pic=off",
      "-accel",
      `tcg,tb-size=${TCG_TB_MIB}`,
      "-m",
      "256",
      "-smp",
      "1",
      "-nodefaults",
      "-no-user-config",
      "-nographic",
      "-no-reboot",
      "-chardev",
      `file,id=console,path=${stateDir}/console.log,append=on`,
      "-serial",
      "chardev:console",
      "-netdev",
      "user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:4000-:8080",
      "-device",
      "virtio-net-device,netdev=net0",
      "-device",
      "virtio-serial-device",
      "-chardev",
      `socket,id=agent,path=${stateDir}/agent.sock,server=on,wait=off`,
      "-device",
      "virtserialport,chardev=agent,name=agent",
    ]);
    const fixture = makeRootfsFixture();
    try {
      const img = makeSpec({ stateDir, rootImage: fixture.artifact, diskMiB: 32 });
      const args = machineArgs({ spec: img, paths: vmPaths(img.stateDir), accel: "tcg", hostPort: 4000 });
      expect(args.slice(0, demoArgs.length).join(" ")).toBe(demoArgs.join(" ").replace("-:8080", "-:8081"));
      expect(args.slice(demoArgs.length)).toEqual([
        "-drive",
        `file=${fixture.artifact.rootfs},format=raw,if=none,id=image,readonly=on`,
        "-device",
        "virtio-blk-device,drive=image,serial=agentvm-image",
        "-drive",
        `file=${stateDir}/disk.ext4,format=raw,if=none,id=disk,werror=report`,
        "-device",
        "virtio-blk-device,drive=disk,serial=agentvm-disk",
        "-drive",
        `file=${stateDir}/launch.ext4,format=raw,if=none,id=launch,readonly=on`,
        "-device",
        "virtio-blk-device,drive=launch,serial=agentvm-launch",
      ]);
    } finally {
      fixture.remove();
    }
  });

  it("the launch spec: NUL-separated, the host's variables win over the image's, PATH and HOME defaulted", () => {
    const config = fixtureConfig({ env: ["PORT=1", "A=x y", "A=second"], cmd: ["echo 'quoted' \"$PORT\"\nnext line"] });
    const spec = decodeLaunchSpec(launchSpecFor(config, { agentId: "agt_1", port: 8081 }));
    expect(spec).toEqual({
      argv: ["/bin/sh", "-c", "echo 'quoted' \"$PORT\"\nnext line"],
      env: [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME=/",
        "PORT=8081",
        "A=second",
        "AGENT_ID=agt_1",
        "LEASE_DIR=/run/agentvm/leases",
      ],
      workdir: "/www",
      uid: 1000,
      gid: 1000,
    });
    expect(() => encodeLaunchSpec({ ...config, entrypoint: [], cmd: [] }, [])).toThrow(/no command/);
    expect(() => encodeLaunchSpec({ ...config, cmd: ["a\0b"] }, [])).toThrow(/NUL/);
  });

  it("the launch drive is an ext4 labelled agentvm-launch holding the spec and the hostname", async () => {
    const dir = join(work, "launch");
    mkdirSync(dir);
    const path = await makeLaunchDrive(dir, fixtureConfig(), { agentId: "agt_Launch_1", port: 8081 });
    expect(execFileSync(sbin("e2label"), [path], { encoding: "utf8" }).trim()).toBe("agentvm-launch");
    const spec = execFileSync(sbin("debugfs"), ["-R", "cat /launch.spec", path], { stdio: ["ignore", "pipe", "ignore"] });
    expect(decodeLaunchSpec(spec).env).toContain("AGENT_ID=agt_Launch_1");
    expect(execFileSync(sbin("debugfs"), ["-R", "cat /hostname", path], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] })).toBe("agt-launch-1\n");
  });

  it.skipIf(process.getuid?.() !== 0)(
    "the launcher on the host: chroot, workdir made, the image's user and PATH, no shell needed; 127 for a missing command (needs root for chroot)",
    () => {
      const bin = join(work, "launch-bin");
      execFileSync("gcc", ["-static", "-O2", "-Wall", "-o", bin, launchSource]);
      const root = join(work, "root");
      mkdirSync(join(root, "opt/tools"), { recursive: true });
      writeFileSync(join(root, "opt/tools/busybox"), readFileSync("/bin/busybox"), { mode: 0o755 });
      const run = (config: ReturnType<typeof fixtureConfig>) => {
        writeFileSync(join(work, "spec"), launchSpecFor(config, { agentId: "agt_h", port: 9 }));
        return spawnSync(bin, [root, join(work, "spec")], { encoding: "utf8" });
      };
      // busybox found through the image's PATH (not ours), run as 1000:1000 in a workdir that did not exist.
      const ok = run(
        fixtureConfig({
          entrypoint: ["busybox"],
          cmd: ["sh", "-c", "echo $(busybox id -u):$(busybox id -g):$(busybox pwd):$PORT:$AGENT_ID"],
          env: ["PATH=/opt/tools"],
          workdir: "/srv/app",
        }),
      );
      expect(ok.stderr).toBe("");
      expect(ok.stdout.trim()).toBe("1000:1000:/srv/app:9:agt_h");
      const missing = run(fixtureConfig({ entrypoint: ["no-such-program"], cmd: [], env: ["PATH=/opt/tools"] }));
      expect(missing.status).toBe(127);
      expect(missing.stderr).toMatch(/launch: cannot execute no-such-program/);
    },
  );

  it("the agent disk: made once (sparse, labelled agentvm-disk); its fingerprint moves with a write, a touch, and every new run", async () => {
    const dir = join(work, "disk");
    mkdirSync(dir);
    const path = await ensureAgentDisk(dir, 32);
    expect(path).toBe(agentDiskPath(dir));
    expect(execFileSync(sbin("e2label"), [path], { encoding: "utf8" }).trim()).toBe("agentvm-disk");
    const made = statSync(path);
    expect(made.size).toBe(32 << 20);
    expect(made.blocks * 512).toBeLessThan(made.size / 2);
    expect(await ensureAgentDisk(dir, 32)).toBe(path);
    expect(statSync(path).mtimeMs).toBe(made.mtimeMs); // kept, not made again
    expect(readdirSync(dir).filter((f) => f.includes("tmp"))).toEqual([]);

    await beginDiskGeneration(path);
    const taken = await diskFingerprint(path);
    expect(diskChange(taken, await diskFingerprint(path))).toBeUndefined();
    await beginDiskGeneration(path); // a VM ran on it again (a restore resumed, or a boot)
    expect(diskChange(taken, await diskFingerprint(path))).toMatch(/^disk changed since the snapshot \(the VM ran on the disk/);
    const again = await diskFingerprint(path);
    appendFileSync(path, "x");
    expect(diskChange(again, await diskFingerprint(path))).toMatch(/^disk changed since the snapshot \(size/);
    expect(diskChange(undefined, again)).toMatch(/^disk changed since the snapshot/);
  });
});

// Contract test of the firecracker driver: the real driver code spawns a fake `firecracker` (node script) that
// serves the API on --api-sock, enforces Firecracker's documented rules and validates every request body
// against ../shared/firecracker/firecracker.yaml; boot, hibernate, wake, clock fix and every fallback.
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { processAlive } from "../../fleet-agent/drivers/common/proc.ts";
import type { RunningVm, VmExit, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { FirecrackerDriver, type FirecrackerDriverOptions, vmPaths } from "../../fleet-agent/drivers/firecracker/driver.ts";
import { FirecrackerHostError } from "../../fleet-agent/drivers/firecracker/host.ts";
import { readManifest } from "../../fleet-agent/drivers/firecracker/snapshot.ts";
import type { FakeRequestRecord } from "../helpers/firecracker-fake.ts";
import { callGuest, fakeDriverOptions, makeFakeFirecrackerBinary, writeCpuinfo, type FakeFirecrackerBinary } from "../helpers/firecracker-harness.ts";
import { firecrackerSpecMissing } from "../helpers/firecracker-spec.ts";

// Without the spec these skip, saying why in one line (and fail under CI=true).
const specMissing = firecrackerSpecMissing("test/unit/firecracker-driver.test.ts");

// Made before the first test, so that skipped suites leave nothing behind.
let root: string;
let fake: FakeFirecrackerBinary;
let cpuinfo: string;
let otherCpuinfo: string;
let kvm: string; // stands in for /dev/kvm: it only has to open read-write
beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), "fcd-"));
  fake = makeFakeFirecrackerBinary(join(root, "bin"));
  cpuinfo = writeCpuinfo(join(root, "cpuinfo"));
  otherCpuinfo = writeCpuinfo(join(root, "cpuinfo-other"), "Other CPU 1");
  kvm = join(root, "kvm");
  writeFileSync(kvm, "");
});
const CIDR = "127.77.0.0/16"; // loopback: the fake guest's workload listens on the guest address
const drivers: FirecrackerDriver[] = [];

function makeDriver(extra: Partial<FirecrackerDriverOptions> = {}): FirecrackerDriver {
  const d = new FirecrackerDriver({ ...fakeDriverOptions(fake, { root, cidr: CIDR, kvm, cpuinfo }), ...extra });
  drivers.push(d);
  return d;
}

function spec(name: string, extra: Partial<VmSpec> = {}): VmSpec {
  return { vmId: `vm_${name}`, agentId: `agt_${name}`, image: "demo", vcpus: 2, memMiB: 256, allowEgress: false, stateDir: join(root, name), ...extra };
}

const call = (vm: RunningVm, path: string, method = "GET") => callGuest(vm, path, method);

/** Requests the Firecracker process `pid` received, in order. */
function requestsOf(pid: number | undefined): FakeRequestRecord[] {
  return fake.requests().filter((r) => r.pid === pid);
}

function loadRequests(since: number): FakeRequestRecord[] {
  return fake
    .requests()
    .slice(since)
    .filter((r) => r.path === "/snapshot/load");
}

async function gone(pid: number | undefined, stateDir: string): Promise<boolean> {
  return pid !== undefined && !processAlive(pid, vmPaths(stateDir).apiSock);
}

async function until(cond: () => boolean, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!cond() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
}

afterAll(async () => {
  await Promise.all(drivers.map((d) => d.close()));
  rmSync(root, { recursive: true, force: true });
});

describe.skipIf(specMissing)("firecracker driver against a fake firecracker", () => {
  it("refuses to start when /dev/kvm is unusable, naming what is missing", async () => {
    const d = makeDriver({ hostCheck: { kvmPath: join(root, "no-kvm"), cpuinfoPath: cpuinfo, hostKernel: "6.1.0-test" } });
    const err = await d.boot(spec("nokvm")).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(FirecrackerHostError);
    expect((err as Error).message).toMatch(/no-kvm does not exist/);
  });

  it("refuses a firecracker older than the minimum release", async () => {
    const old = makeFakeFirecrackerBinary(join(root, "bin-old"), { version: "1.7.0" });
    const d = makeDriver({ binary: old.binary });
    await expect(d.ready()).rejects.toThrow(/firecracker 1\.7\.0 is older than 1\.8\.0/);
  });

  it("boots: configures the VM through the API, then the guest agent and workload answer", async () => {
    const d = makeDriver();
    const s = spec("boot");
    const { vm, bootMs } = await d.boot(s);
    expect(bootMs).toBeGreaterThan(0);
    expect(vm.endpoint).toEqual({ host: "127.77.0.2", port: 8080 });
    expect(await call(vm, "/")).toEqual({ ok: true, agent: "demo" });

    const reqs = requestsOf(vm.pid).filter((r) => r.method !== "GET");
    expect(reqs.map((r) => `${r.method} ${r.path}`)).toEqual([
      "PUT /machine-config",
      "PUT /boot-source",
      "PUT /network-interfaces/eth0",
      "PUT /vsock",
      "PUT /actions",
    ]);
    expect(reqs.every((r) => r.status === 204 && r.schemaErrors.length === 0)).toBe(true);
    expect(reqs[0]!.body).toEqual({ vcpu_count: 2, mem_size_mib: 256, smt: false });
    const bootSource = reqs[1]!.body as { boot_args: string; initrd_path: string };
    expect(bootSource.boot_args).toContain("reboot=k");
    expect(bootSource.boot_args).toContain("ip=127.77.0.2::127.77.0.1:255.255.255.252::eth0:off");
    expect(bootSource.initrd_path).toBe(fake.initrd);
    expect(reqs[2]!.body).toEqual({ iface_id: "eth0", host_dev_name: "fcvm0", guest_mac: "06:00:00:00:00:00" });
    expect(reqs[4]!.body).toEqual({ action_type: "InstanceStart" });
    // The tap was set up before Firecracker opened it, with egress denied.
    expect(fake.netCalls()).toContainEqual(["up", "--tap", "fcvm0", "--host-ip", "127.77.0.1", "--guest-ip", "127.77.0.2", "--prefix", "30"]);
    await d.stop(vm);
  });

  it("hibernates and wakes from the snapshot: memory survives, the frozen guest clock is set before resolving", async () => {
    fake.setBehaviour({ clockRealtime: "ignore" }); // the guest's wall clock stays where the snapshot froze it
    const d = makeDriver();
    const s = spec("cycle");
    const { vm } = await d.boot(s);
    await call(vm, "/counter", "POST");
    await call(vm, "/counter", "POST");

    const snap = await d.hibernate(vm);
    expect(snap.completed).toBe(true);
    expect(snap.bytes).toBeGreaterThan(0);
    expect(await gone(vm.pid, s.stateDir)).toBe(true);
    const { manifest } = await readManifest(vmPaths(s.stateDir).snapDir);
    expect(manifest).toMatchObject({
      generation: 1,
      type: "Full",
      firecrackerVersion: "1.10.1",
      snapshotFormat: "5.0.0",
      hostKernel: "6.1.0-test",
      cpu: { vendor: "GenuineTest", modelName: "Test CPU 9000" },
      vcpus: 2,
      memMiB: 256,
      tap: expect.stringMatching(/^fcvm\d+$/),
    });
    expect(manifest!.mem.sha256).toMatch(/^[0-9a-f]{64}$/);
    expect(readdirSync(vmPaths(s.stateDir).snapDir).sort()).toEqual(["snap-1.mem", "snap-1.state", "snapshot.json"]);
    const hib = requestsOf(vm.pid)
      .filter((r) => r.method !== "GET")
      .slice(-2);
    expect(hib.map((r) => [r.method, r.path, r.body])).toEqual([
      ["PATCH", "/vm", { state: "Paused" }],
      [
        "PUT",
        "/snapshot/create",
        { snapshot_type: "Full", snapshot_path: expect.stringMatching(/snap-1\.state\.tmp$/), mem_file_path: expect.stringMatching(/snap-1\.mem\.tmp$/) },
      ],
    ]);

    await new Promise((r) => setTimeout(r, 1200));
    const woke = await d.wake(s);
    expect(woke.mode).toBe("restore");
    expect(woke.fallbackReason).toBeUndefined();
    expect(woke.timings.skewBeforeMs).toBeLessThan(-1000); // measurably wrong before the fix
    expect(Math.abs(woke.timings.skewAfterMs)).toBeLessThan(50);
    expect(await call(woke.vm, "/counter")).toEqual({ count: 2 });
    const t0 = Date.now();
    const guestClock = (await call(woke.vm, "/clock")).nowMs as number;
    expect(guestClock).toBeGreaterThanOrEqual(t0 - 50);
    expect(guestClock).toBeLessThanOrEqual(Date.now() + 50);

    // A restore is the first thing the new process is asked: no boot-time configuration before it.
    const calls = requestsOf(woke.vm.pid).filter((r) => r.method !== "GET");
    expect(calls).toHaveLength(1);
    expect(calls[0]).toMatchObject({
      method: "PUT",
      path: "/snapshot/load",
      status: 204,
      body: {
        snapshot_path: expect.stringMatching(/snap-1\.state$/),
        mem_backend: { backend_type: "File", backend_path: expect.stringMatching(/snap-1\.mem$/) },
        resume_vm: true,
        clock_realtime: true,
      },
    });
    await d.stop(woke.vm);
    fake.setBehaviour({});
  });

  it("with clock_realtime honoured the guest wakes close to the host clock already", async () => {
    const d = makeDriver();
    const s = spec("realtime");
    const { vm } = await d.boot(s);
    await d.hibernate(vm);
    await new Promise((r) => setTimeout(r, 600));
    const woke = await d.wake(s);
    expect(woke.mode).toBe("restore");
    expect(Math.abs(woke.timings.skewBeforeMs)).toBeLessThan(100);
    await d.stop(woke.vm);
  });

  it("drops clock_realtime for a firecracker that does not know it, and still restores", async () => {
    const d = makeDriver();
    const s = spec("oldload");
    const { vm } = await d.boot(s);
    await call(vm, "/counter", "POST");
    await d.hibernate(vm);
    fake.setBehaviour({ rejectFields: ["clock_realtime"] });
    const before = fake.requests().length;
    const woke = await d.wake(s);
    fake.setBehaviour({});
    expect(woke.mode).toBe("restore");
    expect(await call(woke.vm, "/counter")).toEqual({ count: 1 });
    const loads = loadRequests(before);
    expect(loads.map((l) => l.status)).toEqual([400, 204]);
    expect(loads[0]!.fault).toMatch(/unknown field `clock_realtime`/);
    expect(loads[1]!.body).not.toHaveProperty("clock_realtime");
    await d.stop(woke.vm);
  });

  it("a corrupt snapshot is never loaded: cold boot with the reason", async () => {
    const d = makeDriver();
    const s = spec("corrupt");
    const { vm } = await d.boot(s);
    await call(vm, "/counter", "POST");
    await d.hibernate(vm);
    const { manifest } = await readManifest(vmPaths(s.stateDir).snapDir);
    const memPath = join(vmPaths(s.stateDir).snapDir, manifest!.mem.file);
    const bytes = readFileSync(memPath);
    const at = bytes.length - 10;
    bytes[at] = bytes[at]! ^ 0x20;
    writeFileSync(memPath, bytes);
    const before = fake.requests().length;
    const woke = await d.wake(s);
    expect(woke.mode).toBe("boot");
    expect(woke.fallbackReason).toMatch(/memory file snap-1\.mem checksum mismatch/);
    expect(loadRequests(before)).toHaveLength(0);
    expect(await call(woke.vm, "/counter")).toEqual({ count: 0 });
    await d.stop(woke.vm);
  });

  it("a missing snapshot → cold boot saying so", async () => {
    const d = makeDriver();
    const woke = await d.wake(spec("fresh"));
    expect(woke.mode).toBe("boot");
    expect(woke.fallbackReason).toBe("no snapshot");
    await d.stop(woke.vm);
  });

  it("a snapshot from another firecracker release, CPU or host kernel → cold boot with the mismatch", async () => {
    const d = makeDriver();
    const s = spec("mismatch");
    const { vm } = await d.boot(s);
    await d.hibernate(vm);

    fake.setVersion("1.11.0");
    const upgraded = makeDriver();
    const w1 = await upgraded.wake(s);
    expect(w1.mode).toBe("boot");
    expect(w1.fallbackReason).toBe("snapshot made by firecracker 1.10.1, this host runs 1.11.0");
    await upgraded.hibernate(w1.vm);
    fake.setVersion("1.10.1");

    const w2 = await makeDriver().wake(s);
    expect(w2.fallbackReason).toMatch(/snapshot made by firecracker 1\.11\.0/);
    await drivers.at(-1)!.hibernate(w2.vm);

    const otherCpu = makeDriver({ hostCheck: { kvmPath: kvm, cpuinfoPath: otherCpuinfo, hostKernel: "6.1.0-test" } });
    const w3 = await otherCpu.wake(s);
    expect(w3.fallbackReason).toMatch(/^snapshot made on CPU GenuineTest family 25 model 17 \(Test CPU 9000\), this host has .*Other CPU 1/);
    await otherCpu.hibernate(w3.vm);

    const otherKernel = makeDriver({ hostCheck: { kvmPath: kvm, cpuinfoPath: otherCpuinfo, hostKernel: "6.12.0-new" } });
    const w4 = await otherKernel.wake(s);
    expect(w4.fallbackReason).toBe("snapshot made on host kernel 6.1.0-test, this host runs 6.12.0-new");
    await otherKernel.stop(w4.vm);
  });

  it("a refused /snapshot/load ends that firecracker process; the driver falls back to a cold boot", async () => {
    const d = makeDriver();
    const s = spec("loadfail");
    const { vm } = await d.boot(s);
    await d.hibernate(vm);
    fake.setBehaviour({ loadFault: "Failed to restore vCPU state: Invalid argument" });
    const before = fake.requests().length;
    const woke = await d.wake(s);
    fake.setBehaviour({});
    expect(woke.mode).toBe("boot");
    expect(woke.fallbackReason).toBe("firecracker refused the snapshot: Load snapshot error: Failed to restore vCPU state: Invalid argument");
    const [load] = loadRequests(before);
    expect(load).toMatchObject({ status: 400 });
    expect(load!.pid).not.toBe(woke.vm.pid);
    expect(await gone(load!.pid, s.stateDir)).toBe(true);
    expect(await call(woke.vm, "/")).toEqual({ ok: true, agent: "demo" });
    await d.stop(woke.vm);
  });

  it("a restored guest whose agent never answers → cold boot", async () => {
    const d = makeDriver({ restoreTimeoutMs: 500 });
    const s = spec("deadagent");
    const { vm } = await d.boot(s);
    await d.hibernate(vm);
    fake.setBehaviour({ noGuestAgent: "afterRestore" });
    const woke = await d.wake(s).finally(() => fake.setBehaviour({}));
    expect(woke.mode).toBe("boot");
    expect(woke.fallbackReason).toMatch(/^restored guest did not answer: .*vsock port 1024/);
    await d.stop(woke.vm);
  });

  it("an abort while pausing resumes the VM: {completed:false}, no snapshot call, no files left", async () => {
    const d = makeDriver();
    const s = spec("abort");
    const { vm } = await d.boot(s);
    await call(vm, "/counter", "POST");
    fake.setBehaviour({ pauseDelayMs: 300 }); // read at process start: only a new process sees it
    expect((await d.hibernate(vm, AbortSignal.abort())).completed).toBe(false);
    await d.stop(vm);
    const { vm: vm2 } = await d.boot(s);
    fake.setBehaviour({});
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 100);
    const snap = await d.hibernate(vm2, ac.signal);
    expect(snap.completed).toBe(false);
    expect(await call(vm2, "/")).toEqual({ ok: true, agent: "demo" });
    const calls = requestsOf(vm2.pid).filter((r) => r.method === "PATCH" || r.path.startsWith("/snapshot"));
    expect(calls.map((r) => (r.body as { state?: string }).state ?? r.path)).toEqual(["Paused", "Resumed"]);
    expect(readdirSync(vmPaths(s.stateDir).snapDir)).toEqual([]);
    // The VM keeps working and a later hibernation completes.
    expect((await d.hibernate(vm2)).completed).toBe(true);
  });

  it("diff snapshots: a restored VM's next hibernation writes a Diff onto a copy of its base", async () => {
    const d = makeDriver({ diffSnapshots: true });
    const s = spec("diff");
    const { vm } = await d.boot(s);
    expect(requestsOf(vm.pid).find((r) => r.path === "/machine-config")!.body).toMatchObject({ track_dirty_pages: true });
    await d.hibernate(vm);
    const w1 = await d.wake(s);
    expect(w1.mode).toBe("restore");
    expect(requestsOf(w1.vm.pid).find((r) => r.path === "/snapshot/load")!.body).toMatchObject({ track_dirty_pages: true });
    await call(w1.vm, "/counter", "POST");
    await d.hibernate(w1.vm);
    expect(requestsOf(w1.vm.pid).find((r) => r.path === "/snapshot/create")!.body).toMatchObject({ snapshot_type: "Diff" });
    const { manifest } = await readManifest(vmPaths(s.stateDir).snapDir);
    expect(manifest).toMatchObject({ generation: 2, type: "Diff" });
    expect(readdirSync(vmPaths(s.stateDir).snapDir).sort()).toEqual(["snap-2.mem", "snap-2.state", "snapshot.json"]);
    const w2 = await d.wake(s);
    expect(w2.mode).toBe("restore");
    expect(await call(w2.vm, "/counter")).toEqual({ count: 1 });
    await d.stop(w2.vm);
  });

  it("onExit fires once when firecracker dies on its own, never for hibernate or stop", async () => {
    const d = makeDriver();
    const crashed = await d.boot(spec("crash"));
    const exits: VmExit[] = [];
    d.onExit(crashed.vm, (e) => exits.push(e));
    process.kill(crashed.vm.pid!, "SIGKILL");
    await until(() => exits.length > 0);
    await new Promise((r) => setTimeout(r, 100));
    expect(exits).toEqual([{ code: null, signal: "SIGKILL" }]);

    const s = spec("calm");
    const calm = await d.boot(s);
    const calmExits: VmExit[] = [];
    d.onExit(calm.vm, (e) => calmExits.push(e));
    await d.hibernate(calm.vm);
    const woke = await d.wake(s);
    d.onExit(woke.vm, (e) => calmExits.push(e));
    await d.stop(woke.vm);
    expect(calmExits).toEqual([]);
    expect(requestsOf(woke.vm.pid).at(-1)).toMatchObject({ path: "/actions", body: { action_type: "SendCtrlAltDel" } });
    expect(await gone(woke.vm.pid, s.stateDir)).toBe(true);
  });

  it("reap kills a firecracker a previous fleet-agent left running; the complete snapshot survives, temp files go", async () => {
    const first = makeDriver();
    const s = spec("reap");
    const { vm } = await first.boot(s);
    await call(vm, "/counter", "POST");
    await first.hibernate(vm);
    const running = await first.wake(s);
    const dir = vmPaths(s.stateDir).snapDir;
    writeFileSync(join(dir, "snap-7.mem.tmp"), "half a snapshot");
    writeFileSync(join(dir, "snap-6.state"), "an unreferenced generation");

    const second = makeDriver(); // the fleet-agent restarted: it knows nothing of the running process
    await second.reap(s);
    expect(await gone(running.vm.pid, s.stateDir)).toBe(true);
    expect(readdirSync(dir).sort()).toEqual(["snap-1.mem", "snap-1.state", "snapshot.json"]);
    expect(existsSync(vmPaths(s.stateDir).pidFile)).toBe(false);
    const woke = await second.wake(s);
    expect(woke.mode).toBe("restore");
    expect(await call(woke.vm, "/counter")).toEqual({ count: 1 });
    await second.stop(woke.vm);
  });

  it("cpuSeconds follows the VM process; guestLeases asks the guest agent", async () => {
    const d = makeDriver();
    const { vm } = await d.boot(spec("meter"));
    const before = await d.cpuSeconds(vm);
    await call(vm, "/work?ms=400", "POST");
    const after = await d.cpuSeconds(vm);
    expect(after - before).toBeGreaterThanOrEqual(0.3);
    expect(await d.guestLeases(vm)).toBe(0);
    await call(vm, "/lease?seconds=60", "POST");
    expect(await d.guestLeases(vm)).toBe(1);
    await d.stop(vm);
  });

  it("execTarget: the guest's address and port 1025, a key pushed once per process over vsock; a guest without exec is guest_outdated", async () => {
    const d = makeDriver();
    const s = spec("exec");
    const { vm } = await d.boot(s);
    const t = await d.execTarget!(vm);
    expect(t).toEqual({ host: vm.endpoint.host, port: 1025, key: expect.stringMatching(/^[0-9a-f]{64}$/) });
    expect(await d.execTarget!(vm)).toEqual(t);
    expect(await call(vm, "/exec-key")).toEqual({ key: t.key });
    await d.hibernate(vm);
    const woke = await d.wake(s);
    const again = await d.execTarget!(woke.vm);
    expect(again.key).not.toBe(t.key); // a new process: a new key
    expect(await call(woke.vm, "/exec-key")).toEqual({ key: again.key });
    await d.stop(woke.vm);
    fake.setBehaviour({ noExec: true });
    try {
      const old = makeDriver();
      const o = await old.boot(spec("exec-old"));
      await expect(old.execTarget!(o.vm)).rejects.toMatchObject({ code: "guest_outdated", message: expect.stringContaining("restart it to update") });
      await old.stop(o.vm);
    } finally {
      fake.setBehaviour({});
    }
  });

  it("destroy removes the tap, frees the network slot and deletes the state dir", async () => {
    const d = makeDriver();
    const s = spec("doomed", { allowEgress: true });
    const { vm } = await d.boot(s);
    const slotOwner = () => readdirSync(join(root, "slots")).filter((n) => readFileSync(join(root, "slots", n), "utf8") === s.vmId);
    expect(slotOwner()).toHaveLength(1);
    expect(fake.netCalls().filter((c) => c[0] === "up" && c.includes("--allow-egress")).length).toBeGreaterThan(0);
    await d.destroy(s);
    expect(await gone(vm.pid, s.stateDir)).toBe(true);
    expect(existsSync(s.stateDir)).toBe(false);
    expect(slotOwner()).toHaveLength(0);
    expect(fake.netCalls().at(-1)!.slice(0, 3)).toEqual(["down", "--tap", vm.endpoint.host === "127.77.0.2" ? "fcvm0" : expect.any(String)]);
  });
});

describe.skipIf(specMissing)("firecracker driver under the jailer (fake jailer)", () => {
  for (const variant of ["jailer", "forkingJailer"] as const) {
    it(`${variant}: files go into the chroot, the API sees chroot paths, hibernate/wake/crash/reap work`, async () => {
      const jailed = () => makeDriver({ jailer: { binary: fake[variant], uid: process.getuid!(), gid: process.getgid!() } });
      const d = jailed();
      const s = spec(`jail-${variant}`);
      const { vm } = await d.boot(s);
      const paths = d.paths(s);
      expect(paths.root).toBe(join(s.stateDir, "jail", "firecracker", `vm-jail-${variant}`, "root"));
      expect(processAlive(vm.pid!, paths.marker)).toBe(true);
      await call(vm, "/counter", "POST");
      const boot = requestsOf(vm.pid).filter((r) => r.method === "PUT");
      expect(boot.find((r) => r.path === "/boot-source")!.body).toMatchObject({ kernel_image_path: "/vmlinux", initrd_path: "/initrd" });
      expect(boot.find((r) => r.path === "/vsock")!.body).toEqual({ guest_cid: 3, uds_path: "/vsock.sock" });

      await d.hibernate(vm);
      expect(requestsOf(vm.pid).find((r) => r.path === "/snapshot/create")!.body).toMatchObject({ snapshot_path: "/snapshots/snap-1.state.tmp" });
      expect(readdirSync(paths.snapDir).sort()).toEqual(["snap-1.mem", "snap-1.state", "snapshot.json"]);
      const woke = await d.wake(s);
      expect(woke.mode).toBe("restore");
      expect(requestsOf(woke.vm.pid).find((r) => r.path === "/snapshot/load")!.body).toMatchObject({ snapshot_path: "/snapshots/snap-1.state" });
      expect(await call(woke.vm, "/counter")).toEqual({ count: 1 });

      const exits: VmExit[] = [];
      d.onExit(woke.vm, (e) => exits.push(e));
      process.kill(woke.vm.pid!, "SIGKILL");
      await until(() => exits.length > 0);
      await new Promise((r) => setTimeout(r, 300));
      expect(exits).toHaveLength(1);

      // A jailed VM a previous fleet-agent left running is found by its --id and killed.
      const again = await d.wake(s);
      const restarted = jailed();
      await restarted.reap(s);
      expect(processAlive(again.vm.pid!, paths.marker)).toBe(false);
      const last = await restarted.wake(s);
      expect(last.mode).toBe("restore");
      await restarted.stop(last.vm);
    });
  }
});

describe.skipIf(specMissing)("misuse", () => {
  it("booting or waking a VM that already runs is refused, and the running one is left alone", async () => {
    const d = makeDriver();
    const s = spec("twice");
    const { vm } = await d.boot(s);
    await expect(d.boot(s)).rejects.toThrow(/vm_twice already runs/);
    await expect(d.wake(s)).rejects.toThrow(/vm_twice already runs/);
    expect(await call(vm, "/")).toEqual({ ok: true, agent: "demo" });
    await d.stop(vm);
  });
});

describe.skipIf(specMissing)("the contract", () => {
  it("every request body the driver sent in this file conforms to firecracker.yaml", () => {
    const all = fake.requests();
    expect(all.length).toBeGreaterThan(50);
    expect(all.filter((r) => r.schemaErrors.length > 0)).toEqual([]);
    // The only refusals are the ones provoked on purpose above.
    const refused = all.filter((r) => r.status >= 400).map((r) => r.fault);
    expect(refused).toEqual([
      expect.stringMatching(/unknown field `clock_realtime`/),
      expect.stringMatching(/^Load snapshot error: Failed to restore vCPU state/),
    ]);
  });
});

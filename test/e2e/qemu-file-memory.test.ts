// The qemu driver with file-backed guest RAM (`memory: "file"`) on real QEMU: device-state-only snapshots, wakes
// that consume them, and kill -9 at every point (awake, mid-hibernate, mid-wake) never loading state over other RAM.
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { copyFileSync, existsSync, mkdirSync, readFileSync, rmSync, statSync, watch, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningVm, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { processAlive } from "../../fleet-agent/drivers/common/proc.ts";
import type { QemuDriver } from "../../fleet-agent/drivers/qemu/driver.ts";
import type { SnapshotManifest } from "../../fleet-agent/drivers/qemu/snapshot.ts";
import { json, makeDriver, makeSpec } from "../helpers/qemu.ts";
import { waitFor } from "../helpers/wait.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const manifestOf = (spec: VmSpec) => JSON.parse(readFileSync(join(spec.stateDir, "snapshot.json"), "utf8")) as SnapshotManifest;
const count = async (vm: RunningVm) => (await json<{ count: number }>(vm.endpoint, "/counter")).count;
const bump = async (vm: RunningVm) => (await json<{ count: number }>(vm.endpoint, "/counter", { method: "POST" })).count;

/** Whether a hibernated VM's QEMU is gone within 5 s (the stopped process exits after the hibernation answered). */
async function exits(pid: number): Promise<boolean> {
  for (let i = 0; i < 500 && processAlive(pid); i++) await sleep(10);
  return !processAlive(pid);
}

/** SIGKILL and wait until the process is gone (reaped by its parent, or an orphan reaped by init). */
async function kill9(pid: number): Promise<void> {
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    return;
  }
  for (let i = 0; i < 500 && processAlive(pid); i++) await sleep(10);
}

/**
 * Points of a hibernation, by the file that appears in the stateDir: `data`, the attempt's data file (created with
 * the migration socket while the guest still runs, just before `stop`); `manifest`, the manifest's temporary (the
 * guest stopped, its state received and being made durable beside it, nothing committed yet).
 */
const HIBERNATION_POINTS = { data: /^snapshot-\d+-[0-9a-f]+\.(tmp|bin)$/, manifest: /^snapshot\.json\.tmp$/ } as const;

/** Calls `onFile` as soon as the file of a hibernation's `point` appears in the stateDir. */
function onSnapshotAttempt(dir: string, onFile: () => void, point: keyof typeof HIBERNATION_POINTS = "manifest"): () => void {
  let fired = false;
  const fire = (name: string | null) => {
    if (!fired && name && HIBERNATION_POINTS[point].test(name)) {
      fired = true;
      onFile();
    }
  };
  const w = watch(dir, (_e, name) => fire(name));
  return () => w.close();
}

/**
 * A child process running the driver (file memory), reporting steps as JSON lines; the test kills it with SIGKILL.
 * `hibernate`: boot, count 1, hibernate, wake, count 2, hibernate again (killed during it).
 * `wake`: boot, count 1, hibernate, wake, and stop just before `cont` (killed there).
 * `load`: the same, stopped after the load, before the wake's new generations are committed (killed there).
 */
function startChild(mode: "hibernate" | "wake" | "load", spec: VmSpec) {
  const helpers = pathToFileURL(join(import.meta.dirname, "..", "helpers", "qemu.ts")).href;
  const script = `
    import { json, makeDriver, makeSpec } from ${JSON.stringify(helpers)};
    const [mode, stateDir, vmId] = process.argv.slice(1);
    const say = (o) => process.stdout.write(JSON.stringify(o) + "\\n");
    const stop = (step) => async (pid) => { say({ step, pid }); await new Promise(() => {}); };
    const driver = await makeDriver({
      memory: "file",
      beforeCont: mode === "wake" ? stop("before-cont") : undefined,
      beforeGenerations: mode === "load" ? stop("before-generations") : undefined,
    });
    const spec = makeSpec({ stateDir, vmId });
    const { vm } = await driver.boot(spec);
    await json(vm.endpoint, "/counter", { method: "POST" });
    say({ step: "hibernated", completed: (await driver.hibernate(vm)).completed });
    const woke = await driver.wake(spec);
    const { count } = await json(woke.vm.endpoint, "/counter", { method: "POST" });
    say({ step: "hibernating", count, pid: woke.vm.pid });
    await driver.hibernate(woke.vm);
    say({ step: "finished" });
  `;
  const child = spawn(process.execPath, ["--input-type=module", "-e", script, mode, spec.stateDir, spec.vmId], { stdio: ["ignore", "pipe", "inherit"] });
  const exited = new Promise<void>((r) => child.on("exit", () => r()));
  return { child, exited, lines: createInterface({ input: child.stdout! }) };
}

/** Runs the child in `mode` until it reports `step`, then kills it and its QEMU with SIGKILL: the host died there. */
async function killedAt(mode: "wake" | "load", step: string, spec: VmSpec): Promise<void> {
  const { child, exited, lines } = startChild(mode, spec);
  let qemuPid: number | undefined;
  for await (const line of lines) {
    const msg = JSON.parse(line) as { step: string; pid?: number };
    if (msg.step === step) {
      qemuPid = msg.pid;
      child.kill("SIGKILL");
      break;
    }
  }
  await exited;
  expect(qemuPid).toBeGreaterThan(0);
  await kill9(qemuPid!);
}

describe("qemu driver with file-backed guest RAM", () => {
  let driver: QemuDriver;
  const specs: VmSpec[] = [];
  const spec = (): VmSpec => {
    const s = makeSpec();
    specs.push(s);
    return s;
  };

  /** The first test's VM (B in the last test) and the VM the crash tests share (A in the last test). */
  let b: VmSpec;
  let vb: RunningVm;
  let a: VmSpec;
  let va: RunningVm;

  beforeAll(async () => {
    driver = await makeDriver({ memory: "file" });
  });

  afterAll(async () => {
    await driver?.close();
    for (const s of specs) await driver?.destroy(s);
  });

  it("hibernates device state only (< 1 MB) bound to the RAM file; the counter survives several rounds of restore", async () => {
    const s = (b = spec());
    let vm = (await driver.boot(s)).vm;
    expect(statSync(join(s.stateDir, "ram")).size).toBe(256 * 1024 * 1024);
    // Awake, every block of the RAM file is reserved (ram-space.ts: a full disk must not kill the guest).
    const allocatedMiB = () => (statSync(join(s.stateDir, "ram")).blocks * 512) / 2 ** 20;
    expect(allocatedMiB()).toBeGreaterThanOrEqual(256);
    expect(readFileSync(join(vm.spec.stateDir, "ram.gen"), "utf8").trim()).not.toBe("");
    for (let i = 0; i < 3; i++) await bump(vm);
    for (let round = 0; round < 3; round++) {
      const snap = await driver.hibernate(vm);
      expect(snap.completed).toBe(true);
      expect(snap.bytes).toBeLessThan(1_000_000);
      expect(snap.bytes).toBeGreaterThan(1000);
      expect(await exits(vm.pid!)).toBe(true); // just after the answer: its quit is off the hibernation's path
      const m = manifestOf(s);
      expect(statSync(join(s.stateDir, m.file)).size).toBe(snap.bytes);
      expect(m.ram).toMatchObject({ bytes: 256 * 1024 * 1024, generation: readFileSync(join(s.stateDir, "ram.gen"), "utf8").trim() });
      expect(m.machineArgs.join(" ")).toMatch(/memory-backend-file,id=microvm.ram,size=256M,mem-path=.*,share=on/);
      // Asleep, it takes what the guest holds: its zero pages and the reserved blocks never written are holes again.
      if (round === 0) await waitFor(() => allocatedMiB() < 128, 30_000, "the RAM file's holes dug after the hibernation");

      const woke = await driver.wake(s);
      expect(woke.mode).toBe("restore");
      expect(woke.fallbackReason).toBeUndefined();
      vm = woke.vm;
      expect(await count(vm)).toBe(3 + round);
      expect(await bump(vm)).toBe(4 + round);
      // The wake consumed the snapshot: the RAM file is in a new generation the manifest does not name.
      expect(readFileSync(join(s.stateDir, "ram.gen"), "utf8").trim()).not.toBe(m.ram!.generation);
    }
    expect(allocatedMiB()).toBeGreaterThanOrEqual(256);
    vb = vm;
  }, 120_000);

  it("kill -9 of QEMU while awake after a restore: the next wake boots cold and says why", async () => {
    const s = (a = spec());
    let vm = (await driver.boot(s)).vm;
    await bump(vm);
    expect((await driver.hibernate(vm)).completed).toBe(true);
    const woke = await driver.wake(s);
    expect(woke.mode).toBe("restore");
    vm = woke.vm;
    expect(await bump(vm)).toBe(2);
    const exited = new Promise((r) => driver.onExit(vm, r));
    await kill9(vm.pid!);
    await exited;
    const again = await driver.wake(s);
    expect(again.mode).toBe("boot");
    expect(again.fallbackReason).toMatch(/RAM file changed since the snapshot \(another generation/);
    expect(await count(again.vm)).toBe(0); // a new guest: the old device state never ran over the newer RAM
    va = again.vm;
  }, 120_000);

  it.each(["data", "manifest"] as const)(
    "kill -9 of QEMU during a hibernation (at its %s file): the next wake restores a complete snapshot or boots cold",
    async (point) => {
      const s = a;
      let vm = va;
      expect(await bump(vm)).toBe(1);
      expect((await driver.hibernate(vm)).completed).toBe(true);
      vm = (await driver.wake(s)).vm;
      expect(await bump(vm)).toBe(2);
      const pid = vm.pid!;
      let killed = false;
      const stop = onSnapshotAttempt(
        s.stateDir,
        () => {
          killed = true;
          process.kill(pid, "SIGKILL");
        },
        point,
      );
      const exited = new Promise((r) => driver.onExit(vm, r));
      const hib = await driver
        .hibernate(vm)
        .then(
          (r) => r.completed,
          (err: Error) => err.message,
        )
        .finally(stop);
      expect(killed).toBe(true);
      await kill9(pid);
      if (hib !== true) await exited; // a crash; after a committed hibernation QEMU was on its way out anyway
      if (point === "manifest") expect(hib).toBe(true); // its state was received: QEMU is no longer needed to commit it
      const woke = await driver.wake(s);
      if (woke.mode === "restore") {
        // Only if the snapshot won the race (committed before the kill landed): then it is the complete, newest one.
        expect(hib).toBe(true);
        expect(await count(woke.vm)).toBe(2);
      } else {
        expect(woke.fallbackReason).toMatch(/RAM file changed since the snapshot/); // the old snapshot's RAM moved on at the wake
        expect(await count(woke.vm)).toBe(0);
      }
      va = woke.vm;
    },
    120_000,
  );

  it("device state is never loaded over a RAM file of another hibernation or VM; a missing RAM file boots cold", async () => {
    expect((await driver.hibernate(vb)).completed).toBe(true);
    const hibernateA = async () => expect((await driver.hibernate(va)).completed).toBe(true);
    const wakeA = async (reason: RegExp) => {
      const woke = await driver.wake(a);
      expect(woke.mode).toBe("boot");
      expect(woke.fallbackReason).toMatch(reason);
      expect(await count(woke.vm)).toBe(0); // a new guest: the refused state never ran
      va = woke.vm;
    };

    // The device state of an earlier hibernation of A over the RAM of a later one.
    await hibernateA();
    const first = manifestOf(a);
    const keep = join(a.stateDir, "keep");
    mkdirSync(keep);
    for (const f of ["snapshot.json", first.file]) copyFileSync(join(a.stateDir, f), join(keep, f));
    va = (await driver.wake(a)).vm;
    await bump(va);
    await hibernateA();
    for (const f of ["snapshot.json", first.file]) copyFileSync(join(keep, f), join(a.stateDir, f));
    await wakeA(/RAM file changed since the snapshot \(another generation/);

    // B's RAM file alone (A's generation file kept): not the file the snapshot recorded.
    await hibernateA();
    copyFileSync(join(b.stateDir, "ram"), join(a.stateDir, "ram"));
    await wakeA(/replaced or written from outside/);
    await driver.stop(va);

    // No RAM file at all.
    rmSync(join(b.stateDir, "ram"));
    const woke = await driver.wake(b);
    expect(woke.mode).toBe("boot");
    expect(woke.fallbackReason).toMatch(/RAM file is missing/);
    expect(await count(woke.vm)).toBe(0);
    await driver.stop(woke.vm);
  }, 180_000);

  it("a snapshot committed while its RAM pages were still being written back: restored within the same boot, refused after a reboot unless ram.synced names it", async () => {
    const s = spec();
    let vm = (await driver.boot(s)).vm;
    expect(await bump(vm)).toBe(1);
    const bootId = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
    const synced = join(s.stateDir, "ram.synced");
    /** Hibernates, waits for the RAM write-back's record, then makes the manifest say it was committed before it. */
    const hibernatePending = async (pendingBootId: string, keepMark: boolean) => {
      rmSync(synced, { force: true });
      expect((await driver.hibernate(vm)).completed).toBe(true);
      const m = manifestOf(s);
      if (m.ramPending) {
        // The driver's own write-back finished after the commit: its record names this snapshot and generation.
        for (let i = 0; i < 500 && !existsSync(synced); i++) await sleep(10);
        expect(readFileSync(synced, "utf8").trim()).toBe(`${m.ram!.generation} ${m.file}`);
      } else expect(existsSync(synced)).toBe(false); // committed after the write-back: nothing to record
      writeFileSync(join(s.stateDir, "snapshot.json"), JSON.stringify({ ...m, ramPending: { bootId: pendingBootId } }));
      if (keepMark) writeFileSync(synced, `${m.ram!.generation} ${m.file}\n`);
      else rmSync(synced, { force: true });
    };

    // The fleet-agent killed before the write-back was recorded (same boot): the page cache held every page.
    await hibernatePending(bootId, false);
    let woke = await driver.wake(s);
    expect(woke.mode).toBe("restore");
    vm = woke.vm;
    expect(await bump(vm)).toBe(2);

    // A reboot (another boot id) after the write-back was recorded: the pages are on disk.
    await hibernatePending("another-boot", true);
    woke = await driver.wake(s);
    expect(woke.mode).toBe("restore");
    vm = woke.vm;
    expect(await bump(vm)).toBe(3);

    // A reboot before it was recorded: the RAM file may be torn, so the device state is not loaded over it.
    await hibernatePending("another-boot", false);
    woke = await driver.wake(s);
    expect(woke.mode).toBe("boot");
    expect(woke.fallbackReason).toMatch(/host restarted before the RAM file's pages of this snapshot were durable/);
    expect(await count(woke.vm)).toBe(0);
    await driver.stop(woke.vm);
  }, 180_000);
});

describe('prestart "paused": the hibernated QEMU itself waits, stopped', () => {
  let driver: QemuDriver;
  const s = makeSpec();

  beforeAll(async () => {
    driver = await makeDriver({ memory: "file", prestart: "paused" });
  });

  afterAll(async () => {
    await driver?.close();
    await driver?.destroy(s);
  });

  it("a wake of its own snapshot runs it on (same QEMU, new generation); killed while waiting, the files restore; never run on another snapshot", async () => {
    let vm = (await driver.boot(s)).vm;
    expect(await bump(vm)).toBe(1);
    const pid = vm.pid!;

    // Hibernated: committed like any snapshot, and the same QEMU waits, stopped.
    expect((await driver.hibernate(vm)).completed).toBe(true);
    const m = manifestOf(s);
    expect(m.ram!.generation).toBe(readFileSync(join(s.stateDir, "ram.gen"), "utf8").trim());
    expect(processAlive(pid)).toBe(true);
    let woke = await driver.wake(s);
    expect(woke.mode).toBe("restore");
    expect(woke.vm.pid).toBe(pid);
    expect(woke.tier).toBe("kept");
    expect(readFileSync(join(s.stateDir, "ram.gen"), "utf8").trim()).not.toBe(m.ram!.generation); // consumed, as a restore
    vm = woke.vm;
    expect(await bump(vm)).toBe(2);

    // Many wakes of the same QEMU, each watched for a crash as the host does: only the current run's listener is kept.
    const crashListeners = () =>
      (driver as unknown as { sup: { running: Map<string, { proc: { crashListeners: unknown[] } }> } }).sup.running.get(s.vmId)!.proc.crashListeners.length;
    for (let i = 0; i < 3; i++) {
      driver.onExit(vm, () => undefined);
      expect(crashListeners()).toBe(1);
      expect((await driver.hibernate(vm)).completed).toBe(true);
      vm = (await driver.wake(s)).vm;
      expect(vm.pid).toBe(pid);
    }
    expect(crashListeners()).toBe(0);
    expect(await count(vm)).toBe(2);

    // The waiting QEMU killed: the snapshot on disk is the VM, a new QEMU loads it.
    expect((await driver.hibernate(vm)).completed).toBe(true);
    await kill9(pid);
    woke = await driver.wake(s);
    expect(woke.mode).toBe("restore");
    expect(woke.vm.pid).not.toBe(pid);
    vm = woke.vm;
    expect(await bump(vm)).toBe(3);

    // The manifest names other device state than the one the waiting QEMU holds: it is not run on; that state is loaded
    // instead (here bytes QEMU refuses: a cold boot, the waiting QEMU gone).
    const waitingPid = vm.pid!;
    expect((await driver.hibernate(vm)).completed).toBe(true);
    const now = manifestOf(s);
    const junk = Buffer.alloc(now.bytes, 7);
    writeFileSync(join(s.stateDir, now.file), junk);
    writeFileSync(join(s.stateDir, "snapshot.json"), JSON.stringify({ ...now, sha256: createHash("sha256").update(junk).digest("hex") }));
    woke = await driver.wake(s);
    expect(woke.mode).toBe("boot");
    expect(await exits(waitingPid)).toBe(true);
    expect(await count(woke.vm)).toBe(0);
  }, 180_000);
});

describe("kept QEMUs are bounded: in time after the hibernation, and in number", () => {
  let driver: QemuDriver;
  const a = makeSpec();
  const b = makeSpec();

  beforeAll(async () => {
    driver = await makeDriver({ memory: "file", prestart: "paused", prestartKeepMs: 2000, prestartMax: 1 });
  });

  afterAll(async () => {
    await driver?.close();
    for (const s of [a, b]) await driver?.destroy(s);
  });

  it("a second kept QEMU ends the first; the second ends after keepMs; both VMs restore from their files in new QEMUs", async () => {
    const vmA = (await driver.boot(a)).vm;
    const vmB = (await driver.boot(b)).vm;
    expect(await bump(vmA)).toBe(1);
    expect(await bump(vmB)).toBe(1);
    expect(await bump(vmB)).toBe(2);
    expect((await driver.hibernate(vmA)).completed).toBe(true);
    expect(processAlive(vmA.pid!)).toBe(true); // kept, stopped
    expect((await driver.hibernate(vmB)).completed).toBe(true);
    expect(await exits(vmA.pid!)).toBe(true); // over prestartMax: the oldest went
    expect(processAlive(vmB.pid!)).toBe(true);
    await sleep(2500);
    expect(await exits(vmB.pid!)).toBe(true); // past prestartKeepMs

    const wokeA = await driver.wake(a);
    const wokeB = await driver.wake(b);
    for (const w of [wokeA, wokeB]) expect(w).toMatchObject({ mode: "restore", tier: "files" }); // their kept QEMUs ended
    expect(wokeA.vm.pid).not.toBe(vmA.pid);
    expect(wokeB.vm.pid).not.toBe(vmB.pid);
    expect(await count(wokeA.vm)).toBe(1);
    expect(await count(wokeB.vm)).toBe(2);
  }, 180_000);
});

/** What the host started after the killed one does: a new driver reaps what is left of the VM, then `check` runs; the VM is destroyed after. */
async function onNextHost(s: VmSpec, check: (driver: QemuDriver) => Promise<void>): Promise<void> {
  const driver = await makeDriver({ memory: "file" });
  try {
    await driver.reap(s);
    await check(driver);
  } finally {
    await driver.close();
    await driver.destroy(s);
  }
}

describe("a driver process killed with SIGKILL (file-backed RAM)", () => {
  it.each(["data", "manifest"] as const)(
    "mid-hibernate (at its %s file): reap kills its QEMU; the next wake restores the complete snapshot or boots cold, never a partial one",
    async (point) => {
      const s = makeSpec();
      const { child, exited, lines } = startChild("hibernate", s);
      let qemuPid: number | undefined;
      let committedBefore: SnapshotManifest | undefined;
      for await (const line of lines) {
        const msg = JSON.parse(line) as { step: string; pid?: number };
        if (msg.step === "hibernating") {
          committedBefore = manifestOf(s);
          qemuPid = msg.pid;
          const attempt = new Promise<void>((r) => {
            const stop = onSnapshotAttempt(
              s.stateDir,
              () => {
                child.kill("SIGKILL");
                stop();
                r();
              },
              point,
            );
          });
          await Promise.race([attempt, sleep(30_000)]);
          break;
        }
      }
      await exited;
      expect(qemuPid).toBeGreaterThan(0);
      await onNextHost(s, async (driver) => {
        expect(processAlive(qemuPid!) && readFileSync(`/proc/${qemuPid}/cmdline`, "utf8") !== "").toBe(false);
        const m = manifestOf(s);
        const woke = await driver.wake(s);
        if (m.file !== committedBefore!.file) {
          expect(woke.mode).toBe("restore"); // the second snapshot was committed before the kill: complete, restorable
          expect(await count(woke.vm)).toBe(2);
        } else {
          expect(woke.mode).toBe("boot"); // the first snapshot's RAM moved on at the wake: never loaded over it
          expect(woke.fallbackReason).toMatch(/RAM file changed since the snapshot/);
          expect(await count(woke.vm)).toBe(0);
        }
      });
    },
    180_000,
  );

  it("mid-wake (QEMU started and loaded, the new generations not yet committed): the next wake restores the snapshot", async () => {
    const s = makeSpec();
    await killedAt("load", "before-generations", s);
    await onNextHost(s, async (driver) => {
      const woke = await driver.wake(s);
      expect(woke.fallbackReason).toBeUndefined();
      expect(woke.mode).toBe("restore"); // no guest ran on the snapshot: it is still the VM
      expect(await count(woke.vm)).toBe(1);
    });
  }, 180_000);

  it("mid-wake (after migrate-incoming and the generation's renewal, before cont): the next wake boots cold", async () => {
    const s = makeSpec();
    await killedAt("wake", "before-cont", s);
    await onNextHost(s, async (driver) => {
      const woke = await driver.wake(s);
      expect(woke.mode).toBe("boot");
      expect(woke.fallbackReason).toMatch(/RAM file changed since the snapshot/);
      expect(await count(woke.vm)).toBe(0);
    });
  }, 180_000);
});

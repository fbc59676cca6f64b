// Contract test of the firecracker driver's checkpoints, restore and fork against the fake firecracker (which
// validates every API call against firecracker.yaml and keeps the fake guest's counter, RNG state and identity in its
// memory snapshot): the calls of a checkpoint in order, its files, a restore's wake loading them with the right paths
// and pushing IDENTITY, forks with their own entropy, refused pairs, and kill -9 at every step of a restore.
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { AppError } from "../../lib/errors.ts";
import type { RunningVm } from "../../fleet-agent/drivers/driver.ts";
import { readCheckpoint } from "../../fleet-agent/drivers/firecracker/checkpoint.ts";
import { readManifest } from "../../fleet-agent/drivers/firecracker/snapshot.ts";
import type { FakeRequestRecord } from "../helpers/firecracker-fake.ts";
import { useFakeFirecrackerHost } from "../helpers/firecracker-fake-host.ts";
import { callGuest } from "../helpers/firecracker-harness.ts";
import { firecrackerSpecMissing } from "../helpers/firecracker-spec.ts";

const specMissing = firecrackerSpecMissing("test/unit/firecracker-checkpoints.test.ts");
const here = dirname(fileURLToPath(import.meta.url));

const CIDR = "127.79.0.0/16";
const host = useFakeFirecrackerHost({ prefix: "fcc-", cidr: CIDR });
const { makeDriver, spec, imageSpec } = host;

const call = <T = Record<string, unknown>>(vm: RunningVm, path: string, method = "GET") => callGuest<T>(vm, path, method);
const count = async (vm: RunningVm) => (await call<{ count: number }>(vm, "/counter")).count;
const bump = (vm: RunningVm) => call(vm, "/counter", "POST");
/** A file's digest: comparing 16 MiB disks byte by byte in expect() takes seconds. */
const digest = (path: string) => createHash("sha256").update(readFileSync(path)).digest("hex");
const ckDir = (name: string) => join(host.root, "checkpoints", `ckp_${name}`);
const mutating = (rs: FakeRequestRecord[]) =>
  rs.filter((r) => r.method !== "GET").map((r) => `${r.method} ${r.path}${r.path === "/vm" ? ` ${(r.body as { state: string }).state}` : ""}`);

describe.skipIf(specMissing)("firecracker checkpoints against a fake firecracker", () => {
  it("checkpoints a running VM: Paused → Full snapshot → Resumed, clock set, files moved into the checkpoint; the VM runs on", async () => {
    const d = makeDriver();
    const s = spec("run");
    const { vm } = await d.boot(s);
    await bump(vm);
    await bump(vm);
    const since = host.fake.requests().length;
    const guestSince = host.fake.guestCommands().length;
    const dir = ckDir("run");
    const info = await d.checkpoint(s, vm, dir);

    const reqs = host.fake.requests().slice(since);
    expect(reqs.every((r) => r.schemaErrors.length === 0 && r.status < 300)).toBe(true);
    expect(mutating(reqs)).toEqual(["PATCH /vm Paused", "PUT /snapshot/create", "PATCH /vm Resumed"]);
    const create = reqs.find((r) => r.path === "/snapshot/create")!.body as Record<string, string>;
    expect(create.snapshot_type).toBe("Full");
    // Written inside the VM's snapshot directory (what a jailed Firecracker can reach), then moved.
    expect(create.snapshot_path).toMatch(new RegExp(`^${s.stateDir}/snapshots/snap-ckpt-[0-9a-f]+\\.state\\.tmp$`));
    expect(create.mem_file_path).toMatch(/\.mem\.tmp$/);
    // The guest's clock stood still while paused: set through the guest agent after the resume.
    const resumedAt = reqs.find((r) => r.path === "/vm" && (r.body as { state: string }).state === "Resumed")!.at;
    expect(
      host.fake
        .guestCommands()
        .slice(guestSince)
        .some((c) => c.command === "SETTIME" && c.at > resumedAt),
    ).toBe(true);

    expect(readdirSync(dir).sort()).toEqual(["checkpoint.json", "mem", "state"]);
    expect(readdirSync(join(host.root, "checkpoints")).filter((n) => n.includes(".tmp-"))).toEqual([]);
    expect(readdirSync(join(s.stateDir, "snapshots")).filter((n) => n.includes("ckpt"))).toEqual([]);
    const { manifest: c } = await readCheckpoint(dir);
    expect(c).toMatchObject({
      driver: "firecracker",
      image: "demo",
      vcpus: 1,
      memMiB: 128,
      takenOf: "running",
      sourceAgentId: "agt_run",
      firecrackerVersion: "1.10.1",
    });
    expect(c!.net.guestIp).toBe(vm.endpoint.host);
    expect(c!.vsock).toBe(join(s.stateDir, "vsock.sock"));
    const sizes = ["state", "mem"].map((f) => readFileSync(join(dir, f)).length);
    expect(info.bytes).toBe(sizes[0]! + sizes[1]!);
    expect(c!.totalBytes).toBe(info.bytes);
    expect(info.copy).toBe("copy"); // Firecracker wrote all of the memory
    expect(info.pausedMs).toBeGreaterThan(0);
    expect(info.ms).toBeGreaterThanOrEqual(info.pausedMs);
    // The memory file holds the guest as it was: its counter.
    expect(readFileSync(join(dir, "mem"), "utf8")).toContain('"counter":2');

    // The VM runs on, memory intact, and may hibernate as usual afterwards (a Full snapshot: the checkpoint reset tracking).
    await bump(vm);
    expect(await count(vm)).toBe(3);
    expect(existsSync(dir)).toBe(true);
    await expect(d.checkpoint(s, vm, dir)).rejects.toThrow(/exists/);
  });

  it("restore: the agent rolls back to the checkpoint (snapshot files named by a fresh manifest), the wake pushes IDENTITY", async () => {
    const d = makeDriver();
    const s = spec("back");
    const { vm } = await d.boot(s);
    await bump(vm);
    const dir = ckDir("back");
    await d.checkpoint(s, vm, dir);
    await bump(vm);
    await bump(vm);
    expect(await count(vm)).toBe(3);
    expect((await d.hibernate(vm)).completed).toBe(true);
    const { manifest: before } = await readManifest(join(s.stateDir, "snapshots"));
    expect(before!.clonedFrom).toBeUndefined();

    await d.restoreCheckpoint(s, dir);
    const snapDir = join(s.stateDir, "snapshots");
    const { manifest: m } = await readManifest(snapDir);
    expect(m).toMatchObject({
      generation: 1,
      type: "Full",
      clonedFrom: "ckp_back",
      guestIp: vm.endpoint.host,
      state: { file: "snap-1.state" },
      mem: { file: "snap-1.mem" },
    });
    expect(readdirSync(snapDir).sort()).toEqual(["snap-1.mem", "snap-1.state", "snapshot.json"]); // the old generation is gone
    expect(readFileSync(join(snapDir, "snap-1.mem"))).toEqual(readFileSync(join(dir, "mem")));

    const since = host.fake.requests().length;
    const guestSince = host.fake.guestCommands().length;
    const woke = await d.wake(s);
    expect(woke.mode).toBe("restore");
    const load = host.fake
      .requests()
      .slice(since)
      .find((r) => r.path === "/snapshot/load")!;
    expect(load.status).toBe(204);
    expect(load.body).toMatchObject({
      snapshot_path: join(snapDir, "snap-1.state"),
      mem_backend: { backend_type: "File", backend_path: join(snapDir, "snap-1.mem") },
      resume_vm: true,
    });
    expect(load.body).not.toHaveProperty("vsock_override"); // its own socket path
    const identity = host.fake
      .guestCommands()
      .slice(guestSince)
      .find((c) => c.command === "IDENTITY");
    expect(identity?.answer).toMatch(/^OK identity 1 /);
    expect(await count(woke.vm)).toBe(1); // the memory of the checkpoint, not of the last hibernation
    expect(await call(woke.vm, "/identity")).toEqual({ agentId: "agt_back", hostname: "agt-back", clonedFrom: "ckp_back", generation: 1 });
    // The checkpoint itself is unchanged, and the agent's next hibernation is an ordinary one (no identity at its wake).
    expect((await readCheckpoint(dir)).manifest).toBeDefined();
    await bump(woke.vm);
    await d.hibernate(woke.vm);
    expect((await readManifest(snapDir)).manifest!.clonedFrom).toBeUndefined();
    const again = await d.wake(s);
    expect(await count(again.vm)).toBe(2);
    expect(((await call(again.vm, "/identity")) as { generation: number }).generation).toBe(1);
    await d.stop(again.vm);
  });

  it("fork: a new agent restores the checkpoint with vsock_override and its own identity; two forks draw different random bytes", async () => {
    const d = makeDriver();
    const s = spec("src");
    const { vm } = await d.boot(s);
    await bump(vm);
    const dir = ckDir("src");
    await d.checkpoint(s, vm, dir);

    // While the source holds its network slot, a fork cannot have the guest's address: a cold boot that says so.
    const blocked = spec("fork0");
    await d.restoreCheckpoint(blocked, dir);
    const cold = await d.wake(blocked);
    expect(cold.mode).toBe("boot");
    expect(cold.fallbackReason).toMatch(/snapshot's guest has address .* this VM's network slot gives/);
    await d.destroy(blocked);
    await d.destroy(s); // the slot is free now

    const draws: string[] = [];
    for (const name of ["fork1", "fork2"]) {
      const f = spec(name);
      await d.restoreCheckpoint(f, dir);
      const since = host.fake.requests().length;
      const woke = await d.wake(f);
      expect(woke.mode).toBe("restore");
      const load = host.fake
        .requests()
        .slice(since)
        .find((r) => r.path === "/snapshot/load")!;
      expect(load.body).toMatchObject({
        snapshot_path: join(f.stateDir, "snapshots", "snap-1.state"),
        mem_backend: { backend_type: "File", backend_path: join(f.stateDir, "snapshots", "snap-1.mem") },
        vsock_override: { uds_path: join(f.stateDir, "vsock.sock") },
      });
      expect(woke.vm.endpoint.host).toBe(vm.endpoint.host);
      expect(await count(woke.vm)).toBe(1);
      expect(await call(woke.vm, "/identity")).toMatchObject({ agentId: `agt_${name}`, clonedFrom: "ckp_src" });
      draws.push((await call<{ hex: string }>(woke.vm, "/random")).hex);
      await d.destroy(f);
    }
    // Both are the first draw after the same memory: equal unless each guest's RNG got entropy of its own.
    expect(draws[0]).not.toBe(draws[1]);
  });

  it("checkpoints a hibernated VM by copying its snapshot; a pair that no longer matches is refused", async () => {
    const d = makeDriver();
    const s = spec("hib");
    const { vm } = await d.boot(s);
    await bump(vm);
    await d.hibernate(vm);
    const since = host.fake.requests().length;
    const dir = ckDir("hib");
    const info = await d.checkpoint(s, undefined, dir);
    expect(host.fake.requests().length).toBe(since); // no Firecracker was started for it
    expect(info.pausedMs).toBe(0);
    expect(["reflink", "copy"]).toContain(info.copy);
    const { manifest: c } = await readCheckpoint(dir);
    const { manifest: m } = await readManifest(join(s.stateDir, "snapshots"));
    expect(c).toMatchObject({ takenOf: "hibernated", sourceGeneration: m!.generation, state: { sha256: m!.state.sha256 }, mem: { sha256: m!.mem.sha256 } });
    expect(readFileSync(join(dir, "mem"))).toEqual(readFileSync(join(s.stateDir, "snapshots", m!.mem.file)));

    // A memory file that is not the one the state was taken with (same size, other bytes): no checkpoint of it.
    const memPath = join(s.stateDir, "snapshots", m!.mem.file);
    const mem = readFileSync(memPath);
    mem[mem.length - 1] = "x".charCodeAt(0);
    writeFileSync(memPath, mem);
    const err = await d.checkpoint(s, undefined, ckDir("hib2")).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AppError);
    expect((err as AppError).code).toBe("conflict");
    expect((err as Error).message).toMatch(/checksum mismatch/);
    expect(existsSync(ckDir("hib2"))).toBe(false);
    expect(readdirSync(join(host.root, "checkpoints")).filter((n) => n.startsWith("ckp_hib2"))).toEqual([]);

    // A checkpoint whose files do not pair, or that is of another size of VM, is not restored (the old snapshot stays).
    const broken = ckDir("broken");
    const t = spec("hib3");
    const booted = await d.boot(t);
    await d.checkpoint(t, booted.vm, broken);
    await d.hibernate(booted.vm);
    const good = readManifest(join(t.stateDir, "snapshots"));
    const memFile = join(broken, "mem");
    writeFileSync(memFile, Buffer.concat([readFileSync(memFile).subarray(1), Buffer.from(" ")]));
    await expect(d.restoreCheckpoint(t, broken)).rejects.toThrow(/does not fit agent agt_hib3: .*checksum mismatch/);
    await expect(d.restoreCheckpoint({ ...t, memMiB: 256 }, dir)).rejects.toThrow(/128 MiB, the agent now asks for 1 vCPU \/ 256 MiB/);
    await expect(d.restoreCheckpoint(imageSpec("hib3"), dir)).rejects.toThrow(/checkpoint is of image demo/);
    expect((await readManifest(join(t.stateDir, "snapshots"))).manifest).toEqual((await good).manifest);
    // An agent that never ran has no state to checkpoint.
    const never = await d.checkpoint(spec("never"), undefined, ckDir("never")).catch((e: unknown) => e);
    expect((never as AppError).code).toBe("conflict");
  });

  it("a built image's checkpoint keeps the disk as the paused guest left it; restore puts it back, paired with the memory", async () => {
    const d = makeDriver({ images: async () => ({ kernel: host.fake.kernel, initrd: host.fake.initrd }) });
    const s = imageSpec("img");
    const { vm } = await d.boot(s);
    await call(vm, "/disk-write", "POST");
    const since = host.fake.requests().length;
    const guestSince = host.fake.guestCommands().length;
    const dir = ckDir("img");
    await d.checkpoint(s, vm, dir);
    // The guest flushes its disk before the pause.
    const pausedAt = host.fake
      .requests()
      .slice(since)
      .find((r) => r.path === "/vm")!.at;
    expect(
      host.fake
        .guestCommands()
        .slice(guestSince)
        .some((c) => c.command === "SYNC" && c.at < pausedAt),
    ).toBe(true);
    expect(readdirSync(dir).sort()).toEqual(["checkpoint.json", "disk.ext4", "mem", "state"]);
    const disk = join(s.stateDir, "disk.ext4");
    const atCheckpoint = digest(disk);
    expect(digest(join(dir, "disk.ext4"))).toBe(atCheckpoint);
    const { manifest: c } = await readCheckpoint(dir);
    expect(c!.disk).toMatchObject({ digest: host.image.digest, drives: [{ drive_id: "image" }, { drive_id: "disk" }, { drive_id: "launch" }] });

    await new Promise((r) => setTimeout(r, 5)); // a later write is another one
    await call(vm, "/disk-write", "POST");
    expect(digest(disk)).not.toBe(atCheckpoint);
    await d.stop(vm);
    await d.restoreCheckpoint(s, dir);
    expect(digest(disk)).toBe(atCheckpoint);
    const woke = await d.wake(s);
    expect(woke.mode).toBe("restore");
    expect(await call(woke.vm, "/identity")).toMatchObject({ clonedFrom: "ckp_img" });
    await d.stop(woke.vm);
  });

  it("kill -9 at every step of a restore leaves the old snapshot gone and no new one: the wake boots cold; after the commit it restores", async () => {
    const d = makeDriver();
    const script = join(host.root, "restore-child.ts");
    writeFileSync(
      script,
      `import { FirecrackerDriver } from ${JSON.stringify(resolve(here, "../../fleet-agent/drivers/firecracker/driver.ts"))};
const [opts, spec, dir, killAt] = process.argv.slice(2).map((a, i) => (i < 2 ? JSON.parse(a) : a));
const driver = new FirecrackerDriver({ ...opts, images: async () => ({ kernel: opts.kernel, initrd: opts.initrd }),
  restoreCheckpointStep: (step) => { if (step === killAt) process.kill(process.pid, "SIGKILL"); } });
await driver.restoreCheckpoint(spec, dir);
process.exit(0);
`,
    );
    const { images: _images, ...plain } = host.options();
    const childOpts = JSON.stringify({ ...plain, kernel: host.fake.kernel, initrd: host.fake.initrd });
    const s = spec("crash");
    const { vm } = await d.boot(s);
    await bump(vm);
    const dir = ckDir("crash");
    await d.checkpoint(s, vm, dir);
    await bump(vm);
    await d.hibernate(vm); // its own snapshot: counter 2
    for (const step of ["manifest removed", "state copied", "memory copied", "network slot recorded", "committed"]) {
      const exit = await new Promise<{ code: number | null; signal: string | null }>((done) => {
        const child = spawn(process.execPath, [script, childOpts, JSON.stringify(s), dir, step], { stdio: ["ignore", "ignore", "inherit"] });
        child.on("exit", (code, signal) => done({ code, signal }));
      });
      expect(exit, step).toEqual({ code: null, signal: "SIGKILL" });
      const woke = await d.wake(s);
      if (step === "committed") {
        expect(woke.mode, step).toBe("restore");
        expect(await count(woke.vm)).toBe(1);
      } else {
        // Never the checkpoint's state over the old snapshot's files or the reverse: no snapshot at all.
        expect(woke.mode, step).toBe("boot");
        expect(woke.fallbackReason, step).toBe("no snapshot");
        expect(await count(woke.vm)).toBe(0);
      }
      // Leftover temporary files were taken away by the wake (removeStaleSnapshotFiles).
      expect(
        readdirSync(join(s.stateDir, "snapshots")).filter((n) => n.endsWith(".tmp")),
        step,
      ).toEqual([]);
      await bump(woke.vm);
      await bump(woke.vm);
      await d.hibernate(woke.vm); // an ordinary snapshot again before the next crash
    }
  }, 60_000);

  it("guestCheckpointRequests names each checkpoint the workload asked for once", async () => {
    const d = makeDriver();
    const s = spec("ask");
    const { vm } = await d.boot(s);
    expect(await d.guestCheckpointRequests(vm)).toEqual([]);
    await call(vm, "/checkpoint-request?name=episode-1", "POST");
    await call(vm, "/checkpoint-request?name=episode-2", "POST");
    expect(await d.guestCheckpointRequests(vm)).toEqual(["episode-1", "episode-2"]);
    expect(await d.guestCheckpointRequests(vm)).toEqual([]);
    await d.stop(vm);
  });

  it("every request body the driver sent in this file conforms to firecracker.yaml", () => {
    const reqs = host.fake.requests();
    expect(reqs.length).toBeGreaterThan(20);
    expect(reqs.filter((r) => r.schemaErrors.length > 0)).toEqual([]);
  });
});

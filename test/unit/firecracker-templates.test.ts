// Contract test of the firecracker driver's warm templates against the fake firecracker (spec-checked API calls, a fake
// guest whose counter, RNG state and identity live in its memory snapshot): the first boot of a kind is cold and builds
// a template, the next is a clone (snapshot load, fresh identity, the template's network slot), a clone that cannot
// have that slot or whose load fails boots cold, other kinds and a changed environment get templates of their own,
// and listTemplates shows ready, building and failed ones.
import { createHash } from "node:crypto";
import { copyFileSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { describe, expect, it } from "vitest";
import type { DriverTemplate, RunningVm, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { readCheckpoint } from "../../fleet-agent/drivers/firecracker/checkpoint.ts";
import type { FirecrackerDriver } from "../../fleet-agent/drivers/firecracker/driver.ts";
import { readManifest } from "../../fleet-agent/drivers/firecracker/snapshot.ts";
import type { FakeRequestRecord } from "../helpers/firecracker-fake.ts";
import { useFakeFirecrackerHost } from "../helpers/firecracker-fake-host.ts";
import { callGuest } from "../helpers/firecracker-harness.ts";
import { firecrackerSpecMissing } from "../helpers/firecracker-spec.ts";

const specMissing = firecrackerSpecMissing("test/unit/firecracker-templates.test.ts");
const host = useFakeFirecrackerHost({ prefix: "fct-", cidr: "127.81.0.0/16" });
const { spec } = host;

/** A driver with templates under a root of its own (tests do not share templates). */
function templatedDriver(name: string, extra: Parameters<typeof host.makeDriver>[0] = {}): FirecrackerDriver {
  return host.makeDriver({ templates: { root: join(host.root, `templates-${name}`) }, ...extra });
}

const call = <T = Record<string, unknown>>(vm: RunningVm, path: string, method = "GET") => callGuest<T>(vm, path, method);
/** The snapshot loads the fake answered since `since` into this VM's snapshot directory. */
const loadsOf = (s: VmSpec, since: number): FakeRequestRecord[] =>
  host.fake
    .requests()
    .slice(since)
    .filter((r) => r.path === "/snapshot/load" && JSON.stringify(r.body).includes(s.stateDir));
const ready = async (d: FirecrackerDriver): Promise<DriverTemplate[]> => (await d.listTemplates()).filter((t) => t.state === "ready");
const templateDir = async (d: FirecrackerDriver, key: string) => (await d.templates!.list()).find((t) => t.key === key)!.dir!;

/** The draw a guest restored from `memFile` would make first if nothing gave it entropy of its own. */
function drawWithoutEntropy(memFile: string): string {
  const mem = JSON.parse(readFileSync(memFile, "utf8")) as { guest: { rng: string; draws: number } };
  return createHash("sha256").update(`${mem.guest.rng}:${mem.guest.draws}`).digest("hex");
}

describe.skipIf(specMissing)("firecracker templates against a fake firecracker", () => {
  it("the first boot of a kind is cold and builds a template; the next is a clone with a fresh identity in the template's slot", async () => {
    const d = templatedDriver("first");
    const a = spec("tpl-a");
    const booting = d.boot(a);
    // The build starts with the first cold boot of the kind, in the background.
    let seen: DriverTemplate[] = [];
    while (seen.length === 0) {
      seen = await d.listTemplates();
      await sleep(5);
    }
    expect(seen).toMatchObject([{ image: "demo", memMiB: 128, vcpus: 1, allowEgress: false, state: "building" }]);
    const first = await booting;
    expect(first.template).toBeUndefined();
    await d.templates!.settle();
    const [t] = await ready(d);
    expect(t).toMatchObject({ key: seen[0]!.key, state: "ready", image: "demo", memMiB: 128 });
    expect(t!.bytes).toBeGreaterThan(0);
    expect(t!.bootMs).toBeGreaterThan(0);
    const dir = await templateDir(d, t!.key);
    const { manifest: c } = await readCheckpoint(dir);
    expect(c).toMatchObject({ takenOf: "running", memMiB: 128, vcpus: 1 });

    const b = spec("tpl-b");
    const since = host.fake.requests().length;
    const guestSince = host.fake.guestCommands().length;
    const clone = await d.boot(b);
    expect(clone.template).toBe(t!.key);
    const snapDir = join(b.stateDir, "snapshots");
    const load = host.fake
      .requests()
      .slice(since)
      .find((r) => r.path === "/snapshot/load")!;
    expect(load).toMatchObject({ status: 204, schemaErrors: [] });
    expect(load.body).toMatchObject({
      snapshot_path: join(snapDir, "snap-1.state"),
      mem_backend: { backend_path: join(snapDir, "snap-1.mem") },
      vsock_override: { uds_path: join(b.stateDir, "vsock.sock") },
    });
    // Not booted: no InstanceStart on the clone's process.
    expect(
      host.fake
        .requests()
        .slice(since)
        .filter((r) => r.pid === load.pid && r.path === "/actions"),
    ).toEqual([]);
    // The guest's address is in the template's memory: the clone has the template's network slot.
    expect(clone.vm.endpoint.host).toBe(c!.net.guestIp);
    expect(clone.vm.endpoint.host).not.toBe(first.vm.endpoint.host);
    // A fresh identity: its own id and hostname, the clone marker, entropy of its own mixed into the copied RNG.
    const identity = host.fake
      .guestCommands()
      .slice(guestSince)
      .find((g) => g.command === "IDENTITY");
    expect(identity?.answer).toMatch(/^OK identity 1 /);
    expect(await call(clone.vm, "/identity")).toEqual({ agentId: "agt_tpl-b", hostname: "agt-tpl-b", clonedFrom: basename(dir), generation: 1 });
    expect((await call<{ hex: string }>(clone.vm, "/random")).hex).not.toBe(drawWithoutEntropy(join(dir, "mem")));

    // The clone holds the template's slot: the next boot of the kind is cold while a new template is built elsewhere.
    const c2 = spec("tpl-c");
    const beforeCold = host.fake.requests().length;
    const cold = await d.boot(c2);
    expect(cold.template).toBeUndefined();
    expect(loadsOf(c2, beforeCold)).toEqual([]); // not even tried: the slot was seen taken first
    await d.templates!.settle();
    const [renewed] = await ready(d);
    expect(renewed!.key).toBe(t!.key); // the same kind: its template replaced
    const newDir = await templateDir(d, t!.key);
    expect(newDir).not.toBe(dir);
    const { manifest: c3 } = await readCheckpoint(newDir);
    expect(c3!.net.slot).not.toBe(c!.net.slot);
    const next = await d.boot(spec("tpl-d"));
    expect(next.template).toBe(t!.key);
    expect(next.vm.endpoint.host).toBe(c3!.net.guestIp);
    await d.templates!.settle();
  }, 60_000);

  it("a kind that differs (memMiB) boots cold and gets a template of its own", async () => {
    const d = templatedDriver("kinds");
    await d.boot(spec("kind-a"));
    await d.templates!.settle();
    const since = host.fake.requests().length;
    const big = spec("kind-big", { memMiB: 256 });
    const booted = await d.boot(big);
    expect(booted.template).toBeUndefined();
    const mine = host.fake
      .requests()
      .slice(since)
      .filter((r) => r.path === "/machine-config" && (r.body as { mem_size_mib: number }).mem_size_mib === 256);
    expect(mine.length).toBeGreaterThanOrEqual(1); // booted from the kernel, as 256 MiB
    await d.templates!.settle();
    const list = await ready(d);
    expect(list.map((t) => t.memMiB).sort()).toEqual([128, 256]);
    expect(new Set(list.map((t) => t.key)).size).toBe(2);
    expect((await d.boot(spec("kind-big2", { memMiB: 256 }))).template).toBe(list.find((t) => t.memMiB === 256)!.key);
    await d.templates!.settle();
  }, 60_000);

  it("a changed environment (the guest kernel) makes a new key: cold boot, then a new template clones", async () => {
    const own = join(host.root, "env-image");
    mkdirSync(own, { recursive: true });
    const kernel = join(own, "vmlinux");
    copyFileSync(host.fake.kernel, kernel);
    const d = templatedDriver("env", { images: async () => ({ kernel, initrd: host.fake.initrd }) });
    await d.boot(spec("env-a"));
    await d.templates!.settle();
    const [before] = await ready(d);
    expect((await d.boot(spec("env-b"))).template).toBe(before!.key);
    await d.templates!.settle();

    writeFileSync(kernel, "another kernel: other size, other mtime\n");
    const after = await d.boot(spec("env-c"));
    expect(after.template).toBeUndefined();
    await d.templates!.settle();
    const keys = (await ready(d)).map((t) => t.key);
    expect(keys).toContain(before!.key); // the old one stays on disk, unused
    const fresh = keys.find((k) => k !== before!.key);
    expect(fresh).toBeDefined();
    expect((await d.boot(spec("env-d"))).template).toBe(fresh);
    await d.templates!.settle();
  }, 60_000);

  it("a clone whose snapshot load fails boots cold (wake's fallback, not another clone)", async () => {
    const d = templatedDriver("fault");
    await d.boot(spec("fault-a"));
    await d.templates!.settle();
    expect(await ready(d)).toHaveLength(1);
    const b = spec("fault-b");
    const since = host.fake.requests().length;
    host.fake.setBehaviour({ loadFault: "the fake refuses this snapshot" });
    try {
      const booted = await d.boot(b);
      expect(booted.template).toBeUndefined();
      const reqs = host.fake.requests().slice(since);
      const loads = loadsOf(b, since);
      expect(loads).toHaveLength(1); // one attempt, no loop back into the template
      expect(loads[0]!.status).toBeGreaterThanOrEqual(400);
      const started = reqs.filter((r) => r.path === "/actions" && (r.body as { action_type: string }).action_type === "InstanceStart" && r.at > loads[0]!.at);
      expect(started.length).toBeGreaterThanOrEqual(1);
      expect(await call(booted.vm, "/")).toMatchObject({ ok: true });
    } finally {
      await d.templates!.settle();
      host.fake.setBehaviour({});
    }
  }, 60_000);

  it("a wake whose snapshot cannot be used boots cold, never from a template (the agent's own state is not replaced)", async () => {
    const d = templatedDriver("wake");
    const a = spec("wake-a");
    const { vm } = await d.boot(a);
    await d.templates!.settle();
    expect(await ready(d)).toHaveLength(1);
    await call(vm, "/counter", "POST");
    expect((await d.hibernate(vm)).completed).toBe(true);
    const snapDir = join(a.stateDir, "snapshots");
    const { manifest } = await readManifest(snapDir);
    rmSync(join(snapDir, manifest!.mem.file));
    const since = host.fake.requests().length;
    const woke = await d.wake(a);
    expect(woke.mode).toBe("boot");
    expect(woke.fallbackReason).toMatch(/missing/);
    expect(loadsOf(a, since)).toEqual([]);
    expect(await call(woke.vm, "/counter")).toEqual({ count: 0 }); // booted: no memory of anyone's
    await expect(call(woke.vm, "/identity")).rejects.toThrow(/404/); // no clone's identity either
    await d.stop(woke.vm);
  }, 60_000);

  it("listTemplates lists ready, building and failed templates", async () => {
    const d = templatedDriver("list");
    await d.boot(spec("list-a"));
    await d.templates!.settle();
    // A kind whose build cannot make its directory (a file is in the way): its build fails.
    const broken = spec("list-broken", { vcpus: 2 });
    const brokenKey = await d.templates!.key(broken);
    mkdirSync(join(host.root, "templates-list"), { recursive: true });
    writeFileSync(join(host.root, "templates-list", brokenKey), "in the way\n");
    await d.boot(broken);
    await d.templates!.settle();
    const slow = d.boot(spec("list-slow", { memMiB: 192 }));
    let states: string[] = [];
    while (!states.includes("building")) {
      states = (await d.listTemplates()).map((t) => t.state);
      await sleep(5);
    }
    const list = await d.listTemplates();
    expect(list.map((t) => [t.memMiB, t.vcpus, t.state]).sort()).toEqual([
      [128, 1, "ready"],
      [128, 2, "failed"],
      [192, 1, "building"],
    ]);
    expect(list.find((t) => t.state === "failed")!.error).toMatch(/EEXIST|ENOTDIR|exists/);
    await slow;
    await d.templates!.settle();
    expect((await d.listTemplates()).map((t) => t.state).sort()).toEqual(["failed", "ready", "ready"]);
  }, 60_000);

  it("every request body the driver sent in this file conforms to firecracker.yaml", () => {
    const reqs = host.fake.requests();
    expect(reqs.length).toBeGreaterThan(20);
    expect(reqs.filter((r) => r.schemaErrors.length > 0)).toEqual([]);
  });
});

// Contract test of the firecracker driver's doze (pause/resume) against the fake firecracker, which validates every
// API call against firecracker.yaml and stops its guest (answers, wall clock) while paused: PATCH /vm Paused and
// Resumed, the clock set over the vsock channel kept through the pause, the guest agent not asked while it dozes,
// and a dozing VM's hibernation (resumed first) and stop.
import { describe, expect, it } from "vitest";
import type { RunningVm } from "../../fleet-agent/drivers/driver.ts";
import type { FakeRequestRecord } from "../helpers/firecracker-fake.ts";
import { useFakeFirecrackerHost } from "../helpers/firecracker-fake-host.ts";
import { callGuest } from "../helpers/firecracker-harness.ts";
import { firecrackerSpecMissing } from "../helpers/firecracker-spec.ts";
import { processAlive } from "../../fleet-agent/drivers/common/proc.ts";

const specMissing = firecrackerSpecMissing("test/unit/firecracker-doze.test.ts");
const host = useFakeFirecrackerHost({ prefix: "fcz-", cidr: "127.82.0.0/16" });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const mutating = (rs: FakeRequestRecord[]) =>
  rs.filter((r) => r.method !== "GET").map((r) => `${r.method} ${r.path}${r.path === "/vm" ? ` ${(r.body as { state: string }).state}` : ""}`);

/** Guest wall clock minus host wall clock through the workload's /clock (host time at the request's midpoint). */
async function skewMs(vm: RunningVm): Promise<number> {
  const t0 = Date.now();
  const p0 = performance.now();
  const { nowMs } = await callGuest<{ nowMs: number }>(vm, "/clock");
  return nowMs - (t0 + (performance.now() - p0) / 2);
}

describe.skipIf(specMissing)("firecracker doze against a fake firecracker", () => {
  it("pause is PATCH /vm Paused (the guest answers nothing, its clock stops); resume is Resumed, then the clock set through the guest agent", async () => {
    const d = host.makeDriver();
    const { vm } = await d.boot(host.spec("doze"));
    expect(await d.guestLeases(vm)).toBe(0);
    const since = host.fake.requests().length;
    const guestSince = host.fake.guestCommands().length;

    await d.pause(vm);
    await d.pause(vm); // a second pause changes nothing
    const paused = await fetch(`http://${vm.endpoint.host}:${vm.endpoint.port}/`, { signal: AbortSignal.timeout(500) }).catch((err: Error) => err);
    expect(paused).toBeInstanceOf(Error); // a paused guest answers nothing
    // Answered without the stopped guest: its leases as it last said, no checkpoint requests.
    expect(await d.guestLeases(vm)).toBe(0);
    expect(await d.guestCheckpointRequests(vm)).toEqual([]);
    await sleep(1000);
    const { clockFixMs } = await d.resume(vm);

    const reqs = host.fake.requests().slice(since);
    expect(reqs.every((r) => r.schemaErrors.length === 0 && r.status < 300)).toBe(true);
    expect(mutating(reqs)).toEqual(["PATCH /vm Paused", "PATCH /vm Resumed"]);
    const guest = host.fake.guestCommands().slice(guestSince);
    const resumedAt = reqs.find((r) => r.path === "/vm" && (r.body as { state: string }).state === "Resumed")!.at;
    expect(guest.filter((c) => c.at < resumedAt)).toEqual([]); // nothing asked of the stopped guest
    expect(guest.some((c) => c.command === "SETTIME")).toBe(true);
    expect(clockFixMs).toBeGreaterThan(0);
    expect(Math.abs(await skewMs(vm))).toBeLessThan(50); // it lost the 1.5 s it stood still, and got them back
    expect(await callGuest(vm, "/")).toEqual({ ok: true, agent: "demo" });
    await d.stop(vm);
  });

  it("a dozing VM hibernates (resumed first) and wakes; a dozing VM stops (resumed to take Ctrl-Alt-Del)", async () => {
    const d = host.makeDriver();
    const s = host.spec("dozehib");
    const { vm } = await d.boot(s);
    await callGuest(vm, "/counter", "POST");
    await d.pause(vm);
    const since = host.fake.requests().length;
    expect((await d.hibernate(vm)).completed).toBe(true);
    expect(mutating(host.fake.requests().slice(since))).toEqual(["PATCH /vm Resumed", "PATCH /vm Paused", "PUT /snapshot/create"]);
    const woke = await d.wake(s);
    expect(woke.mode).toBe("restore");
    expect(await callGuest(woke.vm, "/counter")).toEqual({ count: 1 });

    await d.pause(woke.vm);
    const before = host.fake.requests().length;
    const t0 = performance.now();
    await d.stop(woke.vm);
    expect(mutating(host.fake.requests().slice(before))).toEqual(["PATCH /vm Resumed", "PUT /actions"]);
    expect(processAlive(woke.vm.pid!)).toBe(false);
    expect(performance.now() - t0).toBeLessThan(1000); // the guest took Ctrl-Alt-Del: no grace period spent
  });

  it("every request body the driver sent in this file conforms to firecracker.yaml, none refused", () => {
    const all = host.fake.requests();
    expect(all.length).toBeGreaterThan(10);
    expect(all.filter((r) => r.schemaErrors.length > 0 || r.status >= 400)).toEqual([]);
  });
});

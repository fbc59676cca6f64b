// A host whose QEMU_MEMORY changes, on real QEMU: every hibernated agent wakes from the snapshot it has (its memory
// kept, never a cold boot), then hibernates in the host's new mode. Streamed → file-backed converts at the wake (the
// snapshot's pages are loaded into a fresh RAM file); file-backed → streamed at the next hibernation.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import type { RunningVm, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import type { QemuDriver } from "../../fleet-agent/drivers/qemu/driver.ts";
import { snapshotMemory, type SnapshotManifest } from "../../fleet-agent/drivers/qemu/snapshot.ts";
import { json, makeDriver, makeSpec } from "../helpers/qemu.ts";

const manifestOf = (spec: VmSpec) => JSON.parse(readFileSync(join(spec.stateDir, "snapshot.json"), "utf8")) as SnapshotManifest;
const bump = async (vm: RunningVm) => (await json<{ count: number }>(vm.endpoint, "/counter", { method: "POST" })).count;
const drivers: QemuDriver[] = [];
const specs: VmSpec[] = [];

/** A driver as a host restarted with this QEMU_MEMORY makes it. */
async function host(memory: "stream" | "file"): Promise<QemuDriver> {
  const d = await makeDriver({ memory });
  drivers.push(d);
  return d;
}

afterAll(async () => {
  for (const d of drivers) await d.close();
  for (const s of specs) await (await makeDriver()).destroy(s);
});

describe("a host whose memory mode changes", () => {
  it("wakes each agent from the snapshot it has, memory kept, and hibernates it in the new mode, both ways", async () => {
    const spec = makeSpec();
    specs.push(spec);
    const streamed = await host("stream");
    const { vm } = await streamed.boot(spec);
    for (let i = 0; i < 3; i++) await bump(vm);
    expect((await streamed.hibernate(vm)).completed).toBe(true);
    expect(snapshotMemory(manifestOf(spec))).toBe("stream");
    await streamed.close();

    // Restarted with file-backed RAM: the streamed snapshot loads into a fresh RAM file.
    const filed = await host("file");
    let woke = await filed.wake(spec);
    expect(woke.fallbackReason).toBeUndefined();
    expect(woke.mode).toBe("restore");
    expect(await bump(woke.vm)).toBe(4);
    expect((await filed.hibernate(woke.vm)).completed).toBe(true);
    let m = manifestOf(spec);
    expect(snapshotMemory(m)).toBe("file");
    expect(m.bytes).toBeLessThan(1_000_000); // device state only: the RAM is in the file
    woke = await filed.wake(spec);
    expect(woke.mode).toBe("restore");
    expect(await bump(woke.vm)).toBe(5);
    expect((await filed.hibernate(woke.vm)).completed).toBe(true);
    await filed.close();

    // Back to streamed: the file-backed snapshot wakes in a file-backed QEMU, and its hibernation streams.
    const back = await host("stream");
    woke = await back.wake(spec);
    expect(woke.fallbackReason).toBeUndefined();
    expect(woke.mode).toBe("restore");
    expect(await bump(woke.vm)).toBe(6);
    expect((await back.hibernate(woke.vm)).completed).toBe(true);
    m = manifestOf(spec);
    expect(snapshotMemory(m)).toBe("stream");
    expect(m.bytes).toBeGreaterThan(10_000_000); // the guest's RAM is in the data file
    expect(existsSync(join(spec.stateDir, "ram"))).toBe(false); // the RAM file pairs with nothing now
    woke = await back.wake(spec);
    expect(woke.mode).toBe("restore");
    expect(await bump(woke.vm)).toBe(7);
    await back.stop(woke.vm);
  }, 240_000);
});

// ram-file.ts durability rule: a snapshot committed while its RAM pages were being written back is loadable when
// `ram.synced` names it, or within the same boot (the page cache survives a process kill), and refused after a reboot.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { currentBootId, markRamDurable, ramDurability, type RamFingerprint } from "../../fleet-agent/drivers/qemu/ram-file.ts";

const ram: RamFingerprint = { bytes: 1 << 20, mtimeNs: "1", ino: "2", generation: "gen-1" };
const dirs: string[] = [];
const paths = () => {
  const dir = mkdtempSync(join(tmpdir(), "ram-durability-"));
  dirs.push(dir);
  return { ram: join(dir, "ram") };
};

afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

describe("ramDurability", () => {
  it("a manifest committed after the RAM sync (no ramPending) needs nothing more", async () => {
    expect(await ramDurability(paths(), { file: "snapshot-1.bin", ram }, "boot-a")).toBeUndefined();
  });

  it("pending: loadable within the boot it was taken in, refused after a reboot", async () => {
    const p = paths();
    const m = { file: "snapshot-1.bin", ram, ramPending: { bootId: "boot-a" } };
    expect(await ramDurability(p, m, "boot-a")).toBeUndefined();
    expect(await ramDurability(p, m, "boot-b")).toMatch(/host restarted before the RAM file's pages of this snapshot were durable/);
    // An unknown boot id (no /proc) never vouches for the page cache.
    expect(await ramDurability(p, { ...m, ramPending: { bootId: "" } }, "")).toMatch(/host restarted/);
  });

  it("ram.synced naming the snapshot and its generation makes it loadable after a reboot; naming another does not", async () => {
    const p = paths();
    const m = { file: "snapshot-1.bin", ram, ramPending: { bootId: "boot-a" } };
    await markRamDurable(p, "snapshot-1.bin", "gen-1");
    expect(readFileSync(`${p.ram}.synced`, "utf8")).toBe("gen-1 snapshot-1.bin\n");
    expect(await ramDurability(p, m, "boot-b")).toBeUndefined();
    await markRamDurable(p, "snapshot-0.bin", "gen-1"); // an earlier snapshot's record
    expect(await ramDurability(p, m, "boot-b")).toMatch(/host restarted/);
    writeFileSync(`${p.ram}.synced`, "gen-0 snapshot-1.bin\n"); // same file name, another RAM generation
    expect(await ramDurability(p, m, "boot-b")).toMatch(/host restarted/);
  });

  it("the boot id is this kernel's", () => {
    expect(currentBootId()).toBe(readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim());
  });
});

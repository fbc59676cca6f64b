// Snapshot bookkeeping of the firecracker driver: the manifest is the commit point (old snapshot intact until
// it is replaced), files are checked by size and sha256, and compatibility is judged against host facts.
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { sha256File } from "../../fleet-agent/drivers/common/snapshot-files.ts";
import { MANIFEST_FILE } from "../../fleet-agent/drivers/common/state-dir.ts";
import type { FirecrackerHostFacts } from "../../fleet-agent/drivers/firecracker/host.ts";
import { drivesChange, imageDrives } from "../../fleet-agent/drivers/firecracker/image-drives.ts";
import {
  commitSnapshot,
  generationFiles,
  incompatibility,
  readManifest,
  removeStaleSnapshotFiles,
  verifyFiles,
} from "../../fleet-agent/drivers/firecracker/snapshot.ts";

const root = mkdtempSync(join(tmpdir(), "fcs-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const host: FirecrackerHostFacts = {
  binary: "firecracker",
  firecrackerVersion: "1.10.1",
  snapshotFormat: "5.0.0",
  cpu: { vendor: "AuthenticAMD", family: "25", model: "17", modelName: "AMD EPYC" },
  hostKernel: "6.1.0-28-amd64",
};

function dir(name: string): string {
  const d = join(root, name);
  mkdirSync(d, { recursive: true });
  return d;
}

async function take(d: string, generation: number, mem: string) {
  const f = generationFiles(d, generation);
  writeFileSync(f.stateTmp, `state ${generation}`);
  writeFileSync(f.memTmp, mem);
  return commitSnapshot({ dir: d, generation, type: "Full", host, vcpus: 1, memMiB: 128, tap: "fcvm0" });
}

describe("firecracker snapshot files", () => {
  it("commit: renames the temporary files and writes the manifest with sizes and checksums", async () => {
    const d = dir("commit");
    const m = await take(d, 1, "memory one");
    expect(m).toMatchObject({ generation: 1, firecrackerVersion: "1.10.1", state: { file: "snap-1.state", bytes: 7 }, mem: { file: "snap-1.mem", bytes: 10 } });
    expect(m.mem.sha256).toBe((await sha256File(join(d, "snap-1.mem"))).sha256);
    expect(readdirSync(d).sort()).toEqual(["snap-1.mem", "snap-1.state", MANIFEST_FILE]);
    expect((await readManifest(d)).manifest).toEqual(m);
    expect(await verifyFiles(d, m, { checksums: true })).toBeUndefined();
  });

  it("until the new manifest is committed the old snapshot stays the valid one; stale files are removed", async () => {
    const d = dir("crash");
    await take(d, 1, "memory one");
    // A crash after firecracker wrote generation 2 but before the commit:
    const f2 = generationFiles(d, 2);
    writeFileSync(f2.stateTmp, "half");
    writeFileSync(f2.memTmp, "half");
    writeFileSync(join(d, "snap-0.mem"), "an older generation nobody names");
    writeFileSync(join(d, `${MANIFEST_FILE}.tmp`), "{");
    const { manifest } = await readManifest(d);
    expect(manifest?.generation).toBe(1);
    expect(await verifyFiles(d, manifest!, { checksums: true })).toBeUndefined();
    expect((await removeStaleSnapshotFiles(d)).sort()).toEqual(["snap-0.mem", "snap-2.mem.tmp", "snap-2.state.tmp", `${MANIFEST_FILE}.tmp`]);
    // The next snapshot supersedes the first; its files are then unreferenced and go.
    await take(d, 2, "memory two");
    await removeStaleSnapshotFiles(d);
    expect(readdirSync(d).sort()).toEqual(["snap-2.mem", "snap-2.state", MANIFEST_FILE]);
  });

  it("verify: a missing file, a changed size and a flipped byte are each reported", async () => {
    const d = dir("verify");
    const m = await take(d, 1, "0123456789");
    writeFileSync(join(d, "snap-1.mem"), "0123456780");
    expect(await verifyFiles(d, m, { checksums: false })).toBeUndefined(); // same size: only the checksum sees it
    expect(await verifyFiles(d, m, { checksums: true })).toBe("snapshot memory file snap-1.mem checksum mismatch (corrupt)");
    writeFileSync(join(d, "snap-1.mem"), "01234");
    expect(await verifyFiles(d, m, { checksums: false })).toBe("snapshot memory file snap-1.mem has 5 bytes, the manifest says 10 (corrupt)");
    rmSync(join(d, "snap-1.state"));
    expect(await verifyFiles(d, m, { checksums: true })).toBe("snapshot state file snap-1.state is missing");
  });

  it("a manifest that is not JSON is a problem, not a crash; none at all is simply no snapshot", async () => {
    expect(await readManifest(dir("empty"))).toEqual({});
    const d = dir("garbage");
    writeFileSync(join(d, MANIFEST_FILE), "{not json");
    expect(await readManifest(d)).toEqual({ problem: "snapshot manifest is not valid JSON" });
  });

  it("compatibility: firecracker release, snapshot format, CPU, host kernel and VM size must match", async () => {
    const m = await take(dir("compat"), 1, "m");
    const spec = { vcpus: 1, memMiB: 128 };
    expect(incompatibility(m, host, spec)).toBeUndefined();
    expect(incompatibility(m, { ...host, firecrackerVersion: "1.11.0" }, spec)).toBe("snapshot made by firecracker 1.10.1, this host runs 1.11.0");
    expect(incompatibility(m, { ...host, snapshotFormat: "6.0.0" }, spec)).toBe("snapshot data format 5.0.0, this firecracker reads 6.0.0");
    expect(incompatibility(m, { ...host, cpu: { ...host.cpu, model: "1" } }, spec)).toMatch(/^snapshot made on CPU AuthenticAMD family 25 model 17/);
    expect(incompatibility(m, { ...host, hostKernel: "6.12.0" }, spec)).toBe("snapshot made on host kernel 6.1.0-28-amd64, this host runs 6.12.0");
    expect(incompatibility(m, host, { vcpus: 2, memMiB: 128 })).toBe("snapshot has 1 vCPU / 128 MiB, the agent now asks for 2 vCPU / 128 MiB");
  });

  it("compatibility: a built image's snapshot restores only for the same image, and a built-in one only without one", async () => {
    const a = `sha256:${"a".repeat(64)}`;
    const b = `sha256:${"b".repeat(64)}`;
    const d = dir("image");
    const f = generationFiles(d, 1);
    writeFileSync(f.stateTmp, "state");
    writeFileSync(f.memTmp, "mem");
    const disk = { bytes: 16 << 20, mtimeNs: "1700000000000000000", generation: "g1" };
    const drives = [{ drive_id: "image", is_root_device: false, is_read_only: true, path_on_host: "/i" }];
    const m = await commitSnapshot({ dir: d, generation: 1, type: "Full", host, vcpus: 1, memMiB: 128, tap: "fcvm0", image: { digest: a, drives, disk } });
    expect((await readManifest(d)).manifest?.image).toEqual({ digest: a, drives, disk });
    expect(incompatibility(m, host, { vcpus: 1, memMiB: 128, rootImage: { digest: a } })).toBeUndefined();
    expect(incompatibility(m, host, { vcpus: 1, memMiB: 128, rootImage: { digest: b } })).toBe(`snapshot runs image ${a}, the agent now runs image ${b}`);
    expect(incompatibility(m, host, { vcpus: 1, memMiB: 128 })).toBe(`snapshot runs image ${a}, the agent now runs the built-in image`);
    const builtIn = await take(dir("builtin"), 1, "m");
    expect(builtIn).not.toHaveProperty("image");
    expect(incompatibility(builtIn, host, { vcpus: 1, memMiB: 128, rootImage: { digest: a } })).toBe(
      `snapshot runs the built-in image, the agent now runs image ${a}`,
    );
  });

  it("drives: the same paths and modes are no change; any other path or mode is, naming both", () => {
    const at = (dir: string) => imageDrives({ image: `${dir}/rootfs.ext4`, disk: "/vm/disk.ext4", launch: "/vm/launch.ext4" });
    expect(drivesChange(at("/images/a"), at("/images/a"))).toBeUndefined();
    expect(drivesChange(at("/images/a"), at("/images/b"))).toBe(
      "the snapshot's drives (image=/images/a/rootfs.ext4 (ro), disk=/vm/disk.ext4, launch=/vm/launch.ext4 (ro)) are not the VM's now " +
        "(image=/images/b/rootfs.ext4 (ro), disk=/vm/disk.ext4, launch=/vm/launch.ext4 (ro))",
    );
    const writable = at("/images/a").map((d) => ({ ...d, is_read_only: false }));
    expect(drivesChange(at("/images/a"), writable)).toMatch(/are not the VM's now/);
    expect(drivesChange(at("/images/a"), at("/images/a").slice(0, 2))).toMatch(/are not the VM's now/);
  });
});

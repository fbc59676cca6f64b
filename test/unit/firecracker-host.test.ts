// Host readiness for Firecracker: version and CPU parsing, and a refusal that lists every missing piece.
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import {
  checkFirecrackerHost,
  compareVersions,
  FirecrackerHostError,
  kvmUnusable,
  parseCpuInfo,
  parseFirecrackerVersion,
  parseSnapshotFormat,
} from "../../fleet-agent/drivers/firecracker/host.ts";
import { writeCpuinfo } from "../helpers/firecracker-harness.ts";

const root = mkdtempSync(join(tmpdir(), "fch-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

function fakeBinary(name: string, versionOut: string, snapshotOut = "v5.0.0"): string {
  const path = join(root, name);
  writeFileSync(path, `#!/bin/sh\ncase "$1" in --version) printf '%s\\n' '${versionOut}';; --snapshot-version) echo '${snapshotOut}';; esac\n`);
  chmodSync(path, 0o755);
  return path;
}

describe("firecracker host check", () => {
  it("parses versions, snapshot formats and compares releases numerically", () => {
    expect(parseFirecrackerVersion("Firecracker v1.10.1\n\n")).toBe("1.10.1");
    expect(parseFirecrackerVersion("Firecracker v1.4.0\n\nSupported snapshot data format versions: v1.0.0")).toBe("1.4.0");
    expect(parseFirecrackerVersion("something else")).toBeUndefined();
    expect(parseSnapshotFormat("v5.0.0\n")).toBe("5.0.0");
    expect(compareVersions("1.10.0", "1.8.0")).toBeGreaterThan(0);
    expect(compareVersions("1.8.0", "1.8.0")).toBe(0);
    expect(compareVersions("1.7.9", "1.8.0")).toBeLessThan(0);
  });

  it("reads the CPU identity of the first processor", () => {
    expect(
      parseCpuInfo(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC 9654\n\nprocessor\t: 1\nvendor_id\t: Other\n",
      ),
    ).toEqual({
      vendor: "AuthenticAMD",
      family: "25",
      model: "17",
      modelName: "AMD EPYC 9654",
    });
  });

  it("answers the facts a snapshot is bound to when everything is there", async () => {
    const kvm = join(root, "kvm");
    writeFileSync(kvm, "");
    const facts = await checkFirecrackerHost({
      binary: fakeBinary("fc-ok", "Firecracker v1.10.1"),
      kvmPath: kvm,
      cpuinfoPath: writeCpuinfo(join(root, "cpuinfo")),
      hostKernel: "6.1.0",
    });
    expect(facts).toMatchObject({ firecrackerVersion: "1.10.1", snapshotFormat: "5.0.0", hostKernel: "6.1.0", cpu: { vendor: "GenuineTest" } });
  });

  it("refuses with one message naming every missing piece", async () => {
    const err = await checkFirecrackerHost({ binary: join(root, "no-such-firecracker"), kvmPath: join(root, "no-kvm") }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(FirecrackerHostError);
    const msg = (err as Error).message;
    expect(msg).toMatch(/no-kvm does not exist/);
    expect(msg).toMatch(/no-such-firecracker" cannot run \(ENOENT\); install a release binary and set FIRECRACKER_BIN/);
  });

  it("refuses releases older than 1.8.0 and binaries that print no version", async () => {
    const kvm = join(root, "kvm2");
    writeFileSync(kvm, "");
    await expect(checkFirecrackerHost({ binary: fakeBinary("fc-old", "Firecracker v1.5.0"), kvmPath: kvm })).rejects.toThrow(
      /firecracker 1\.5\.0 is older than 1\.8\.0/,
    );
    await expect(checkFirecrackerHost({ binary: fakeBinary("fc-odd", "hello"), kvmPath: kvm })).rejects.toThrow(/printed no version/);
  });

  it("a /dev/kvm that exists but is not writable is named as such", async () => {
    if (process.getuid?.() === 0) {
      // root opens anything: check the message for a missing device instead
      expect(await kvmUnusable(join(root, "missing"))).toMatch(/does not exist/);
      return;
    }
    const ro = join(root, "kvm-ro");
    writeFileSync(ro, "");
    chmodSync(ro, 0o400);
    expect(await kvmUnusable(ro)).toMatch(/not readable and writable/);
  });
});

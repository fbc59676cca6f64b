// The fake Firecracker host a driver test file shares: a temporary root with the fake binary, stand-ins for /dev/kvm and
// /proc/cpuinfo, a small built image, the drivers made over them (closed after the file) and VM specs under the root.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll } from "vitest";
import type { ImageArtifact } from "../../contracts/image.ts";
import type { VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { FirecrackerDriver, type FirecrackerDriverOptions } from "../../fleet-agent/drivers/firecracker/driver.ts";
import { fakeDriverOptions, makeFakeFirecrackerBinary, makeFakeImage, writeCpuinfo, type FakeFirecrackerBinary } from "./firecracker-harness.ts";

export interface FakeFirecrackerHost {
  /** Set in beforeAll: read them inside tests, not at the file's top level. */
  root: string;
  fake: FakeFirecrackerBinary;
  cpuinfo: string;
  kvm: string;
  image: ImageArtifact;
  /** The driver's options over this host (fakeDriverOptions). */
  options(): FirecrackerDriverOptions;
  /** A driver over this host, closed after the file. */
  makeDriver(extra?: Partial<FirecrackerDriverOptions>): FirecrackerDriver;
  /** A built-in image's VM (1 vCPU, 128 MiB) with its stateDir `<root>/<name>`. */
  spec(name: string, extra?: Partial<VmSpec>): VmSpec;
  /** A VM of the host's built image with a 16 MiB disk. */
  imageSpec(name: string): VmSpec;
}

/** Registers the file's beforeAll/afterAll that make and remove the host; `cidr` is the file's own tap range. */
export function useFakeFirecrackerHost(opts: { prefix: string; cidr: string }): FakeFirecrackerHost {
  const drivers: FirecrackerDriver[] = [];
  const host = {
    options: () => fakeDriverOptions(host.fake, { root: host.root, cidr: opts.cidr, kvm: host.kvm, cpuinfo: host.cpuinfo }),
    makeDriver: (extra: Partial<FirecrackerDriverOptions> = {}) => {
      const d = new FirecrackerDriver({ ...host.options(), ...extra });
      drivers.push(d);
      return d;
    },
    spec: (name: string, extra: Partial<VmSpec> = {}): VmSpec => ({
      vmId: `vm_${name}`,
      agentId: `agt_${name}`,
      image: "demo",
      vcpus: 1,
      memMiB: 128,
      allowEgress: false,
      stateDir: join(host.root, name),
      ...extra,
    }),
    imageSpec: (name: string) => host.spec(name, { image: host.image.digest, rootImage: host.image, diskMiB: 16 }),
  } as FakeFirecrackerHost;
  beforeAll(() => {
    host.root = mkdtempSync(join(tmpdir(), opts.prefix));
    host.fake = makeFakeFirecrackerBinary(join(host.root, "bin"));
    host.cpuinfo = writeCpuinfo(join(host.root, "cpuinfo"));
    host.kvm = join(host.root, "kvm");
    writeFileSync(host.kvm, "");
    host.image = makeFakeImage(join(host.root, "image"));
  });
  afterAll(async () => {
    await Promise.all(drivers.map((d) => d.close()));
    if (host.root) rmSync(host.root, { recursive: true, force: true });
  });
  return host;
}

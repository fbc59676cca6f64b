// Test harness for the firecracker driver without the real binary: a fake `firecracker` executable (wrapper
// script → firecracker-fake-bin.ts), a recording tap setup script, stand-in kernel/initrd files, a tiny built image
// (an ext4 labelled agentvm-image), and readers for what the fake saw.
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import type { ImageArtifact, ImageConfig } from "../../contracts/image.ts";
import type { RunningVm } from "../../fleet-agent/drivers/driver.ts";
import type { FirecrackerDriverOptions } from "../../fleet-agent/drivers/firecracker/driver.ts";
import type { FakeBehaviour, FakeGuestRecord, FakeRequestRecord } from "./firecracker-fake.ts";
import type { FakeBinaryConfig } from "./firecracker-fake-bin.ts";
import { firecrackerSpecPath } from "./firecracker-spec.ts";
import { sbin } from "./sbin.ts";

const here = dirname(fileURLToPath(import.meta.url));

export interface FakeFirecrackerBinary {
  /** Executable to pass as the driver's `binary`. */
  binary: string;
  /** Fake jailers: one execs firecracker in place, the other forks it and exits (as newer jailers may). */
  jailer: string;
  forkingJailer: string;
  requestLog: string;
  guestLog: string;
  netLog: string;
  /** Stand-in for scripts/setup-firecracker-net.sh: records its arguments. */
  netScript: string;
  kernel: string;
  initrd: string;
  setBehaviour(b: FakeBehaviour): void;
  setVersion(version: string, snapshotFormat?: string): void;
  requests(): FakeRequestRecord[];
  /** Guest agent commands the fake guests answered, in order. */
  guestCommands(): FakeGuestRecord[];
  netCalls(): string[][];
}

export function makeFakeFirecrackerBinary(
  dir: string,
  opts: { version?: string; snapshotFormat?: string; behaviour?: FakeBehaviour } = {},
): FakeFirecrackerBinary {
  mkdirSync(dir, { recursive: true });
  const configPath = join(dir, "fake-config.json");
  const requestLog = join(dir, "requests.jsonl");
  const guestLog = join(dir, "guest.jsonl");
  const netLog = join(dir, "net.log");
  let config: FakeBinaryConfig = {
    version: opts.version ?? "1.10.1",
    snapshotFormat: opts.snapshotFormat ?? "5.0.0",
    specPath: firecrackerSpecPath(),
    requestLog,
    guestLog,
    behaviour: opts.behaviour ?? {},
  };
  const save = () => writeFileSync(configPath, JSON.stringify(config));
  save();
  const binary = join(dir, "firecracker");
  writeFileSync(binary, `#!/bin/sh\nexec ${sh(process.execPath)} ${sh(resolve(here, "firecracker-fake-bin.ts"))} --fake-config ${sh(configPath)} "$@"\n`);
  chmodSync(binary, 0o755);
  const jailer = join(dir, "jailer");
  const forkingJailer = join(dir, "jailer-forking");
  for (const [path, fork] of [
    [jailer, false],
    [forkingJailer, true],
  ] as const) {
    writeFileSync(path, fakeJailer(fork));
    chmodSync(path, 0o755);
  }
  const netScript = join(dir, "setup-net.sh");
  writeFileSync(netScript, `#!/bin/sh\necho "$*" >> ${sh(netLog)}\n`);
  chmodSync(netScript, 0o755);
  const kernel = join(dir, "vmlinux");
  const initrd = join(dir, "initrd.img");
  writeFileSync(kernel, "not a kernel: the fake firecracker only checks that it exists\n");
  writeFileSync(initrd, "not an initramfs\n");
  return {
    binary,
    jailer,
    forkingJailer,
    requestLog,
    guestLog,
    netLog,
    netScript,
    kernel,
    initrd,
    setBehaviour(b) {
      config = { ...config, behaviour: b };
      save();
    },
    setVersion(version, snapshotFormat) {
      config = { ...config, version, snapshotFormat: snapshotFormat ?? config.snapshotFormat };
      save();
    },
    requests: () => readJsonLines<FakeRequestRecord>(requestLog),
    guestCommands: () => readJsonLines<FakeGuestRecord>(guestLog),
    netCalls: () =>
      existsSync(netLog)
        ? readFileSync(netLog, "utf8")
            .trim()
            .split("\n")
            .filter(Boolean)
            .map((l) => l.split(" "))
        : [],
  };
}

/**
 * A built image as the image store hands it to a driver: a small ext4 (label `agentvm-image` unless told otherwise)
 * with a file or two, and its config. The fake guest never runs what is in it; it reads only the drives' labels and
 * the launch drive.
 */
export function makeFakeImage(dir: string, config: Partial<ImageConfig> = {}, opts: { label?: string } = {}): ImageArtifact {
  const content = join(dir, "content");
  mkdirSync(join(content, "app"), { recursive: true });
  writeFileSync(join(content, "app", "agent.txt"), "a stand-in for the agent's files\n");
  const rootfs = join(dir, "rootfs.ext4");
  execFileSync(sbin("mke2fs"), ["-q", "-F", "-t", "ext4", "-L", opts.label ?? "agentvm-image", "-d", content, rootfs, "8M"]);
  return {
    digest: `sha256:${createHash("sha256").update(readFileSync(rootfs)).digest("hex")}`,
    rootfs,
    sizeBytes: statSync(rootfs).size,
    config: { entrypoint: ["/app/agent"], cmd: ["--serve"], env: ["GREETING=hello"], workdir: "/app", user: "", uid: 0, gid: 0, port: 9123, ...config },
  };
}

/** A /proc/cpuinfo stand-in (the driver's snapshot manifest records the CPU identity). */
export function writeCpuinfo(path: string, modelName = "Test CPU 9000"): string {
  writeFileSync(path, `processor\t: 0\nvendor_id\t: GenuineTest\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: ${modelName}\n\nprocessor\t: 1\n`);
  return path;
}

/** Parses the jailer's arguments, makes the chroot (refusing a leftover /dev, as the real one does), starts firecracker in it. */
function fakeJailer(fork: boolean): string {
  return `#!/bin/sh
[ "$1" = --version ] && { echo "Jailer v1.10.1"; exit 0; }
id= exec_file= base=
while [ $# -gt 0 ]; do
  case "$1" in
    --id) id=$2; shift 2 ;;
    --exec-file) exec_file=$2; shift 2 ;;
    --chroot-base-dir) base=$2; shift 2 ;;
    --uid|--gid) shift 2 ;;
    --) shift; break ;;
    *) echo "fake jailer: unknown argument $1" >&2; exit 2 ;;
  esac
done
root="$base/$(basename "$exec_file")/$id/root"
[ -e "$root/dev" ] && { echo "fake jailer: $root/dev: File exists" >&2; exit 1; }
mkdir -p "$root/dev" "$root/run"
${
  fork
    ? `"$exec_file" --fake-root "$root" --id "$id" "$@" &
echo $! > "$root/firecracker.pid"
exit 0`
    : `echo $$ > "$root/firecracker.pid"
exec "$exec_file" --fake-root "$root" --id "$id" "$@"`
}
`;
}

function readJsonLines<T>(path: string): T[] {
  if (!existsSync(path)) return [];
  return readFileSync(path, "utf8")
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l) as T);
}

function sh(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/** The driver's options over the fake binary: tap slots under `root`, the fake host's kvm and cpuinfo, every guest image the fake's. */
export function fakeDriverOptions(fake: FakeFirecrackerBinary, host: { root: string; cidr: string; kvm: string; cpuinfo: string }): FirecrackerDriverOptions {
  return {
    binary: fake.binary,
    images: async () => ({ kernel: fake.kernel, initrd: fake.initrd }),
    network: { slotsDir: join(host.root, "slots"), cidr: host.cidr, setupScript: fake.netScript },
    hostCheck: { kvmPath: host.kvm, cpuinfoPath: host.cpuinfo, hostKernel: "6.1.0-test" },
    bootTimeoutMs: 15_000,
  };
}

/** A 200 JSON answer of the fake guest's workload (anything else fails the test). */
export async function callGuest<T = Record<string, unknown>>(vm: RunningVm, path: string, method = "GET"): Promise<T> {
  const res = await fetch(`http://${vm.endpoint.host}:${vm.endpoint.port}${path}`, { method, signal: AbortSignal.timeout(5000) });
  if (res.status !== 200) throw new Error(`${method} ${path} answered ${res.status}`);
  return (await res.json()) as T;
}

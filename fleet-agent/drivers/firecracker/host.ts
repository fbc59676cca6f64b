// Host readiness for Firecracker: /dev/kvm access, the firecracker binary and its version, and the host facts
// (CPU identity, kernel release) that a snapshot is only valid against.
import { execFile } from "node:child_process";
import { constants } from "node:fs";
import { access, open, readFile } from "node:fs/promises";
import { release } from "node:os";

/** Oldest release the driver accepts: 1.8.0 describes virtio devices via ACPI (Debian's cloud kernel needs that). */
export const MIN_FIRECRACKER_VERSION = "1.8.0";

export interface CpuIdentity {
  vendor: string;
  family: string;
  model: string;
  modelName: string;
}

export interface FirecrackerHostFacts {
  binary: string;
  /** e.g. "1.10.1" (without the leading v). */
  firecrackerVersion: string;
  /** Snapshot data format version the binary writes and reads (`--snapshot-version`), e.g. "5.0.0". */
  snapshotFormat: string;
  cpu: CpuIdentity;
  hostKernel: string;
}

/** The host cannot run Firecracker VMs; the message says what is missing and how to fix it. */
export class FirecrackerHostError extends Error {
  override name = "FirecrackerHostError";
}

export interface HostCheckOptions {
  binary: string;
  /** The jailer binary, when VMs run under it. */
  jailer?: string;
  kvmPath?: string;
  minVersion?: string;
  /** Overrides for tests: where /proc/cpuinfo is, and the kernel release. */
  cpuinfoPath?: string;
  hostKernel?: string;
}

/** Checks everything and answers the facts, or throws one FirecrackerHostError listing every problem. */
export async function checkFirecrackerHost(opts: HostCheckOptions): Promise<FirecrackerHostFacts> {
  const problems: string[] = [];
  const kvmProblem = await kvmUnusable(opts.kvmPath ?? "/dev/kvm");
  if (kvmProblem) problems.push(kvmProblem);

  let version: string | undefined;
  let snapshotFormat: string | undefined;
  try {
    const out = await run(opts.binary, ["--version"]);
    version = parseFirecrackerVersion(out);
    if (!version) problems.push(`"${opts.binary} --version" printed no version: ${JSON.stringify(out.slice(0, 120))}`);
  } catch (err) {
    problems.push(
      `firecracker binary "${opts.binary}" cannot run (${(err as Error).message}); install a release binary and set FIRECRACKER_BIN or put it on PATH (see the README section on Firecracker)`,
    );
  }
  const min = opts.minVersion ?? MIN_FIRECRACKER_VERSION;
  if (version && compareVersions(version, min) < 0)
    problems.push(`firecracker ${version} is older than ${min} (needed: ACPI device discovery, snapshot format checks)`);
  if (version && compareVersions(version, min) >= 0) {
    try {
      snapshotFormat = parseSnapshotFormat(await run(opts.binary, ["--snapshot-version"]));
      if (!snapshotFormat) problems.push(`"${opts.binary} --snapshot-version" printed no snapshot data format version`);
    } catch (err) {
      problems.push(`"${opts.binary} --snapshot-version" failed: ${(err as Error).message}`);
    }
  }
  if (opts.jailer) {
    try {
      const out = await run(opts.jailer, ["--version"]);
      const jv = /v(\d+\.\d+\.\d+)/.exec(out)?.[1];
      if (jv && version && jv !== version) problems.push(`jailer ${jv} and firecracker ${version} come from different releases`);
    } catch (err) {
      problems.push(`jailer "${opts.jailer}" cannot run (${(err as Error).message}); it ships in the same release archive as firecracker`);
    }
  }
  if (problems.length > 0 || !version || !snapshotFormat) {
    throw new FirecrackerHostError(`this host cannot run the firecracker driver:\n  - ${problems.join("\n  - ")}`);
  }
  return {
    binary: opts.binary,
    firecrackerVersion: version,
    snapshotFormat,
    cpu: parseCpuInfo(await readFile(opts.cpuinfoPath ?? "/proc/cpuinfo", "utf8")),
    hostKernel: opts.hostKernel ?? release(),
  };
}

/** Why /dev/kvm cannot be used (undefined when it can): it must exist and open read-write. */
export async function kvmUnusable(path = "/dev/kvm"): Promise<string | undefined> {
  try {
    await access(path, constants.R_OK | constants.W_OK);
    const fh = await open(path, "r+");
    await fh.close();
    return undefined;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return `${path} does not exist (no KVM: enable virtualization, or load kvm_intel/kvm_amd)`;
    if (code === "EACCES" || code === "EPERM") return `${path} is not readable and writable by this user (add it to the kvm group or run as root)`;
    return `${path} cannot be opened read-write: ${(err as Error).message}`;
  }
}

/** "Firecracker v1.10.1" (possibly followed by more lines) → "1.10.1". */
export function parseFirecrackerVersion(text: string): string | undefined {
  return /Firecracker v(\d+\.\d+\.\d+)/.exec(text)?.[1];
}

/** `--snapshot-version` prints e.g. "v5.0.0". */
export function parseSnapshotFormat(text: string): string | undefined {
  return /v?(\d+\.\d+\.\d+)/.exec(text.trim())?.[1];
}

/** Numeric comparison of x.y.z versions (pre-release suffixes ignored). */
export function compareVersions(a: string, b: string): number {
  const pa = a
    .split(/[.-]/)
    .slice(0, 3)
    .map((p) => Number.parseInt(p, 10) || 0);
  const pb = b
    .split(/[.-]/)
    .slice(0, 3)
    .map((p) => Number.parseInt(p, 10) || 0);
  for (let i = 0; i < 3; i++) {
    const d = (pa[i] ?? 0) - (pb[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

/** The CPU identity a snapshot depends on: the first processor's vendor, family, model and name. */
export function parseCpuInfo(text: string): CpuIdentity {
  const first = text.split(/\n\s*\n/)[0] ?? "";
  const field = (name: string) => new RegExp(`^${name}\\s*:\\s*(.*)$`, "m").exec(first)?.[1]?.trim() ?? "unknown";
  return { vendor: field("vendor_id"), family: field("cpu family"), model: field("model"), modelName: field("model name") };
}

export function describeCpu(cpu: CpuIdentity): string {
  return `${cpu.vendor} family ${cpu.family} model ${cpu.model} (${cpu.modelName})`;
}

function run(binary: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(binary, args, { timeout: 5000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${(err as NodeJS.ErrnoException).code ?? err.message}${stderr ? `: ${stderr.trim().slice(0, 200)}` : ""}`));
      else resolve(stdout + stderr);
    });
  });
}

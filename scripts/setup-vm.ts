// Provisions what the qemu driver needs on this machine (QEMU, busybox-static, the guest image); `npm run setup:vm`.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { detectAccel, type AccelChoice } from "../fleet-agent/drivers/qemu/host.ts";
import { customKernelFromEnv, ensureGuestImage, type CustomKernel, type GuestImage } from "../fleet-agent/guest/build-image.ts";

export interface ProvisionOptions {
  /** In CI a missing QEMU is a failure; elsewhere it is reported and the image is still built when possible. */
  ci?: boolean;
  dataDir: string;
  log?: (line: string) => void;
  /** Build the image around this kernel instead of Debian's (see customKernelFromEnv). */
  kernel?: CustomKernel;
}

export interface ProvisionResult {
  qemu: string | undefined;
  /** What the qemu driver will use here, and why. */
  accel: AccelChoice;
  image: GuestImage | undefined;
  /** One line per thing that is missing, with the command that fixes it. */
  missing: string[];
}

const QEMU = "qemu-system-x86_64";

function which(cmd: string): string | undefined {
  const r = spawnSync("sh", ["-c", `command -v ${cmd}`], { encoding: "utf8" });
  return r.status === 0 ? r.stdout.trim() || undefined : undefined;
}

function hasStaticBusybox(): boolean {
  return (
    existsSync("/bin/busybox") &&
    spawnSync("dpkg-query", ["-W", "-f", "${Status}", "busybox-static"], { encoding: "utf8" }).stdout.includes("install ok installed")
  );
}

/** Debian or Ubuntu (apt-get is there to install packages). */
export function isDebian(): boolean {
  return existsSync("/etc/debian_version") && which("apt-get") !== undefined;
}

/** QEMU is on PATH. */
export function qemuInstalled(): boolean {
  return which(QEMU) !== undefined;
}

/** The Debian packages the qemu driver needs that are missing here: QEMU, a static busybox and gcc (the guest image is built from them). */
export function missingVmPackages(): string[] {
  return [...(which(QEMU) ? [] : ["qemu-system-x86"]), ...(hasStaticBusybox() ? [] : ["busybox-static"]), ...(which("gcc") ? [] : ["gcc", "libc6-dev"])];
}

/** Installs Debian packages (apt-get update and retry once when the first try fails); true when it worked. */
export function aptInstall(packages: string[], log: (line: string) => void): boolean {
  // dpkg runs tools from sbin (ldconfig, start-stop-daemon): a restricted PATH (CI's) may not have it.
  const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive", PATH: `${process.env.PATH ?? "/usr/bin:/bin"}:/usr/local/sbin:/usr/sbin:/sbin` };
  const install = () =>
    spawnSync("apt-get", ["install", "-y", "--no-install-recommends", ...packages], { stdio: ["ignore", "ignore", "pipe"], env, encoding: "utf8" });
  log(`installing ${packages.join(", ")} … (apt-get install)`);
  let r = install();
  if (r.status !== 0) {
    log("setup-vm: install failed; running apt-get update and retrying");
    spawnSync("apt-get", ["update"], { stdio: "ignore", env });
    r = install();
  }
  if (r.status !== 0) log(`setup-vm: apt-get install failed: ${(r.stderr ?? "").trim().split("\n").pop()}`);
  return r.status === 0;
}

/**
 * Installs QEMU, busybox-static and gcc when missing (root on Debian only), then builds the guest image.
 * Throws with one line naming what is missing and the fix when it cannot go on.
 */
export async function provisionVm(opts: ProvisionOptions): Promise<ProvisionResult> {
  const log = opts.log ?? ((line: string) => console.log(line));
  const missingPackages = missingVmPackages();
  if (missingPackages.length > 0 && process.getuid?.() === 0 && isDebian()) aptInstall(missingPackages, log);

  const missing: string[] = [];
  const qemu = which(QEMU);
  if (!qemu) missing.push(`${QEMU} is missing: run \`sudo apt-get install -y qemu-system-x86\``);
  if (!hasStaticBusybox()) missing.push(`busybox-static is missing: run \`sudo apt-get install -y busybox-static\``);
  if (!which("gcc")) missing.push("gcc is missing (the guest agent and demo workload are built from C): run `sudo apt-get install -y gcc libc6-dev`");
  for (const line of missing) log(`setup-vm: ${line}`);
  if (opts.ci && !qemu) throw new Error(`setup-vm: ${missing[0]}`);

  let image: GuestImage | undefined;
  if (hasStaticBusybox() && which("gcc")) image = await ensureGuestImage({ dataDir: opts.dataDir, log, ...(opts.kernel ? { kernel: opts.kernel } : {}) });
  else if (opts.ci) throw new Error(`setup-vm: cannot build the guest image: ${missing.join("; ")}`);
  const accel = detectAccel();
  log(`setup-vm: accelerator ${accel.accel} (${accel.reason})`);
  return { qemu, accel, image, missing };
}

function parseDataDir(argv: string[], env: NodeJS.ProcessEnv): string {
  const i = argv.indexOf("--data-dir");
  const fromArg = i >= 0 ? argv[i + 1] : argv.find((a) => a.startsWith("--data-dir="))?.slice("--data-dir=".length);
  return resolve(fromArg ?? env.DATA_DIR ?? join(import.meta.dirname, "..", ".data"));
}

if (import.meta.main) {
  const dataDir = parseDataDir(process.argv.slice(2), process.env);
  const ci = process.argv.includes("--ci") || process.env.CI === "true";
  try {
    const kernel = customKernelFromEnv(process.env);
    const r = await provisionVm({ ci, dataDir, ...(kernel ? { kernel } : {}) });
    console.log(
      JSON.stringify(
        {
          qemu: r.qemu ?? null,
          accel: r.accel.accel,
          kernel: r.image?.kernel ?? null,
          initrd: r.image?.initrd ?? null,
          vmlinux: r.image?.vmlinux ?? null,
          missing: r.missing,
        },
        null,
        2,
      ),
    );
    process.exitCode = r.image && r.qemu ? 0 : 1;
  } catch (err) {
    console.error((err as Error).message);
    process.exitCode = 1;
  }
}

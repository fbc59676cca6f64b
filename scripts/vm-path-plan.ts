// What `npm start` does about real VMs before it picks a driver: provision them, use them, or fall back to processes (pure: facts in, plan out).
import type { DriverChoice } from "../fleet-agent/drivers/select.ts";

/** What this machine has and is, as far as the VM path cares (probed by scripts/vm-path.ts: machineFacts). */
export interface MachineFacts {
  /** qemu-system-x86_64 is on PATH. */
  qemu: boolean;
  /** The Debian packages the VM path needs that are not installed (QEMU, busybox-static, gcc; scripts/setup-vm.ts). */
  missingPackages: string[];
  /** This process runs as root (uid 0). */
  root: boolean;
  /** Debian or Ubuntu with apt-get. */
  apt: boolean;
}

export type VmPathPlan =
  /** DRIVER names a driver other than qemu (process, firecracker): nothing to provision. */
  | { kind: "skip" }
  /** Every package is there: make sure of the guest image (built once, then cached) and use QEMU. */
  | { kind: "use" }
  /** Install these Debian packages with apt-get, build the guest image, use QEMU. */
  | { kind: "provision"; install: string[] }
  /** No QEMU and no way to install it here: workloads run as processes; `reason` is the one line that says why and what to run. */
  | { kind: "fallback"; reason: string }
  /** DRIVER=qemu on a machine that cannot have QEMU this way: `npm start` stops with `reason`. */
  | { kind: "fail"; reason: string };

/** The line `npm start` prints when it runs agents as processes because the VM path cannot be provisioned. */
export function fallbackLine(why: string, fix: string): string {
  return `driver: process (workloads run as plain host processes, NOT isolated): ${why}; for real VMs ${fix}, then npm start again`;
}

/** The plan for DRIVER `driver` on this machine; `probe` (which runs commands) is called only when the plan depends on it. */
export function planVmPath(driver: DriverChoice, probe: () => MachineFacts): VmPathPlan {
  if (driver !== "auto" && driver !== "qemu") return { kind: "skip" };
  const f = probe();
  if (f.missingPackages.length === 0) return { kind: "use" };
  if (f.root && f.apt) return { kind: "provision", install: f.missingPackages };
  // QEMU is there but something the image build wants may not be: the build itself says whether what is here will do.
  if (f.qemu) return { kind: "use" };
  const packages = f.missingPackages.join(" ");
  const [why, fix] = f.apt
    ? ["qemu-system-x86_64 is missing and installing it needs root", `run \`sudo apt-get install -y ${packages}\` (or \`sudo npm run setup:vm\`)`]
    : [
        "qemu-system-x86_64 is missing and this is not Debian or Ubuntu (no apt-get to install it)",
        "install QEMU (qemu-system-x86_64), a static busybox and gcc with this system's package manager",
      ];
  if (driver === "qemu") return { kind: "fail", reason: `DRIVER=qemu but ${why}: ${fix}` };
  return { kind: "fallback", reason: fallbackLine(why, fix) };
}

// Host facts the qemu driver needs: accelerator, TSC rate, CPU model, QEMU version.
import { execFileSync } from "node:child_process";
import { closeSync, existsSync, openSync, readFileSync } from "node:fs";
import type { Accel } from "./args.ts";

export interface AccelChoice {
  accel: Accel;
  /** Why, in one line (shown in logs and benchmark output). */
  reason: string;
}

/**
 * KVM when /dev/kvm opens read-write and is served by a hardware-virtualisation module. `kvm_pvm`
 * (nested virtualisation by page tables, found on some cloud sandboxes) also answers on /dev/kvm but
 * runs only kernels built as PVM guests: Debian's kernel hangs right after its real-mode setup there.
 */
export function detectAccel(sysModule = "/sys/module", devKvm = "/dev/kvm"): AccelChoice {
  try {
    closeSync(openSync(devKvm, "r+"));
  } catch (err) {
    return { accel: "tcg", reason: `${devKvm} not usable (${(err as NodeJS.ErrnoException).code})` };
  }
  const has = (m: string) => existsSync(`${sysModule}/${m}`);
  if (has("kvm_intel") || has("kvm_amd")) return { accel: "kvm", reason: `${devKvm} usable (${has("kvm_intel") ? "kvm_intel" : "kvm_amd"})` };
  if (has("kvm_pvm")) return { accel: "tcg", reason: `${devKvm} is served by kvm_pvm, which boots only PVM-built guest kernels` };
  return { accel: "kvm", reason: `${devKvm} usable` };
}

/**
 * The host TSC rate in kHz (under TCG the guest's TSC is the host's). Intel names its nominal rate,
 * which is the TSC rate, in the model name ("@ 2.60GHz"); otherwise "cpu MHz", which is the TSC rate
 * in a VM and close to it on hosts without frequency scaling. Undefined when unknown.
 */
export function hostTscKhz(cpuinfo = "/proc/cpuinfo"): number | undefined {
  try {
    const text = readFileSync(cpuinfo, "utf8");
    const ghz = /^model name\s*:.*@\s*([\d.]+)\s*GHz/m.exec(text)?.[1];
    const mhz = /^cpu MHz\s*:\s*([\d.]+)/m.exec(text)?.[1];
    const khz = ghz ? Math.round(Number(ghz) * 1e6) : mhz ? Math.round(Number(mhz) * 1000) : NaN;
    return Number.isFinite(khz) && khz > 0 ? khz : undefined;
  } catch {
    return undefined;
  }
}

/** The host CPU's model name: a KVM snapshot taken with `-cpu host` belongs to that CPU model. */
export function hostCpuModel(cpuinfo = "/proc/cpuinfo"): string {
  try {
    return /^model name\s*:\s*(.+)$/m.exec(readFileSync(cpuinfo, "utf8"))?.[1]?.trim() ?? "unknown";
  } catch {
    return "unknown";
  }
}

/** `qemu-system-x86_64 --version`'s first line, e.g. "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)". */
export function qemuVersion(binary: string): string {
  return execFileSync(binary, ["--version"], { encoding: "utf8" }).split("\n")[0]!.trim();
}

// Host facts and process probes the qemu driver needs: accelerator, TSC rate, QEMU version, free ports, /proc.
import { execFileSync } from "node:child_process";
import { closeSync, existsSync, openSync, readFileSync } from "node:fs";
import { createServer } from "node:net";
import type { Accel } from "./qemu-args.ts";

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

/** A loopback port free right now (the OS picks it). */
export function freeLoopbackPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address ? address.port : 0;
      server.close(() => (port ? resolve(port) : reject(new Error("no port"))));
    });
  });
}

let clockTicks: number | undefined;
function clkTck(): number {
  if (clockTicks === undefined) {
    try {
      clockTicks = Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
    } catch {
      clockTicks = 100;
    }
  }
  return clockTicks;
}

/** utime + stime of a process in seconds, from /proc/<pid>/stat; undefined when it is gone. */
export function processCpuSeconds(pid: number): number | undefined {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return undefined;
  }
  // Fields after the command name (which may hold spaces and parentheses): state is field 3, utime 14, stime 15.
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const utime = Number(fields[11]);
  const stime = Number(fields[12]);
  return (utime + stime) / clkTck();
}

/** The argv of a running process, or undefined when it is gone or a zombie. */
export function processArgv(pid: number): string[] | undefined {
  try {
    const raw = readFileSync(`/proc/${pid}/cmdline`, "utf8");
    if (!raw) return undefined;
    return raw.replace(/\0$/, "").split("\0");
  } catch {
    return undefined;
  }
}

export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

// bench:scale's host process: starts the all-in-one (system.ts) as a child with the environment the bench gives, reads its RSS, fds and CPU from /proc, finds its QEMUs, and stops it.
import { spawn, type ChildProcess } from "node:child_process";
import { createWriteStream, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { readCpuSeconds } from "../../../fleet-agent/drivers/common/proc.ts";
import { AppError } from "../../../lib/errors.ts";
import { stopChild } from "../children.ts";

export interface HostProcess {
  url: string;
  token: string;
  pid: number;
  dataDir: string;
  /** Where the child's own output goes (its log lines at LOG_LEVEL). */
  logFile: string;
  proc: ChildProcess;
  /** What the host's last full collection left live (its `MEMORY` line, after a SIGUSR2), bytes. */
  memory: HostMemory | undefined;
}

export interface HostMemory {
  heapUsed: number;
  external: number;
  /** How long the malloc trim after the collection held the host, ms. */
  trimMs: number;
}

/** Starts the system with `env` (DATA_DIR set by the caller) and resolves once it prints READY; its output goes to `logFile`. */
export async function startHost(opts: { env: Record<string, string>; imageDir: string; dataDir: string; logFile: string }): Promise<HostProcess> {
  const proc = spawn(process.execPath, ["--expose-gc", join(import.meta.dirname, "system.ts"), "--image-dir", opts.imageDir], {
    env: { ...process.env, ...opts.env, DATA_DIR: opts.dataDir },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const log = createWriteStream(opts.logFile);
  proc.stderr!.pipe(log);
  const lines = createInterface({ input: proc.stdout! });
  const host = { dataDir: opts.dataDir, logFile: opts.logFile, proc, memory: undefined as HostMemory | undefined };
  const ready = await new Promise<{ url: string; token: string; pid: number }>((resolve, reject) => {
    const timer = setTimeout(() => reject(new AppError("internal", `the system did not start in 180 s (see ${opts.logFile})`)), 180_000);
    proc.once("exit", (code) => {
      clearTimeout(timer);
      reject(new AppError("internal", `the system exited (${code}) before it was ready (see ${opts.logFile})`));
    });
    lines.on("line", (line) => {
      if (line.startsWith("MEMORY ")) {
        host.memory = JSON.parse(line.slice(7)) as HostMemory;
        return;
      }
      log.write(`${line}\n`);
      if (!line.startsWith("READY ")) return;
      clearTimeout(timer);
      resolve(JSON.parse(line.slice(6)) as { url: string; token: string; pid: number });
    });
  });
  return Object.assign(host, ready);
}

/** Resident memory of `pid`, KiB (VmRSS). */
export function rssKiB(pid: number): number {
  const m = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) : NaN;
}

/** Open file descriptors of `pid`. */
export function fdCount(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}

/** User + system CPU seconds of `pid` (its own, not its children's). */
export function cpuSeconds(pid: number): number {
  return readCpuSeconds(pid) ?? NaN;
}

/** PIDs of the QEMUs whose command line names `dataDir` (this host's VMs, running or kept paused). */
export function qemuPids(dataDir: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let cmd: string;
    try {
      cmd = readFileSync(`/proc/${entry}/cmdline`, "utf8");
    } catch {
      continue;
    }
    if (cmd.startsWith("qemu-system") && cmd.includes(dataDir)) pids.push(Number(entry));
    else if (cmd.includes("/qemu-system") && cmd.includes(dataDir)) pids.push(Number(entry));
  }
  return pids;
}

/** Stops the system (SIGTERM: it drains and hibernates its awake agents; SIGKILL after `graceMs`), then ends by PID any QEMU of its data dir left. */
export async function stopHost(host: HostProcess, graceMs: number): Promise<{ qemusLeft: number }> {
  await stopChild(host.proc, "SIGTERM", graceMs);
  const left = qemuPids(host.dataDir);
  for (const pid of left) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // gone already
    }
  }
  return { qemusLeft: left.length };
}

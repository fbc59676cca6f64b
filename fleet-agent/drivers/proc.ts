// Reading host processes from /proc: CPU time for the idle rule, liveness for reaping pid files.
import { readFileSync } from "node:fs";

const clockTicks = 100; // USER_HZ: 100 on every Linux architecture we run on

/** utime + stime (+ reaped children's when asked) of `pid`, in seconds; all threads included. */
export function readCpuSeconds(pid: number, opts: { includeChildren?: boolean } = {}): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  // The command name (field 2) may hold spaces and parentheses: fields are counted after its closing ")".
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const n = (i: number) => Number(fields[i - 3] ?? 0);
  const ticks = n(14) + n(15) + (opts.includeChildren ? n(16) + n(17) : 0);
  return ticks / clockTicks;
}

/** True when `pid` runs and, if `executable` is given, its command line starts with it (no pid reuse). */
export function processAlive(pid: number, executable?: string): boolean {
  try {
    const cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8");
    if (readFileSync(`/proc/${pid}/stat`, "utf8").includes(") Z")) return false; // zombie
    return executable === undefined || cmdline.split("\0")[0] === executable;
  } catch {
    return false;
  }
}

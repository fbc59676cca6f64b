// Host processes as /proc shows them: liveness (recycled pids excluded), CPU time for the idle rule, and the pid
// files every driver leaves in a VM's stateDir so that the next fleet-agent can end what this one left running.
//
// Written once for all drivers; before, each had its own with different answers:
// - liveness: `kill(pid, 0)` (qemu) counts a zombie and any recycled pid as alive; /proc (process, firecracker)
//   does not. Kept: /proc, not a zombie, and, given a marker, only a process whose command line contains it.
// - CPU time: USER_HZ assumed to be 100 (process, firecracker) or asked of `getconf CLK_TCK` (qemu). Kept: getconf,
//   once, 100 when it cannot answer; and `undefined` for a process that is gone (one driver threw, one said 0).
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

/** The command line of `pid` (arguments joined by spaces), or undefined when it is gone or a zombie. */
export function commandLine(pid: number): string | undefined {
  try {
    const cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8");
    // The command name (field 2) may hold spaces and parentheses: the state follows its last ")".
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    if (stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) === "Z" || !cmdline) return undefined;
    return cmdline.replace(/\0$/, "").split("\0").join(" ");
  } catch {
    return undefined;
  }
}

/**
 * True when `pid` runs (not a zombie) and, if `marker` is given, its command line contains it. A marker unique to
 * one VM (its API or QMP socket path, its jailer id, its workload command) keeps a recycled pid from counting.
 */
export function processAlive(pid: number, marker?: string): boolean {
  const line = commandLine(pid);
  return line !== undefined && (marker === undefined || line.includes(marker));
}

/** Waits until `processAlive(pid, marker)` is false; answers whether it went within the time. */
export async function waitForProcessGone(pid: number, marker: string | undefined, timeoutMs: number): Promise<boolean> {
  const deadline = performance.now() + timeoutMs;
  while (performance.now() < deadline) {
    if (!processAlive(pid, marker)) return true;
    await sleep(10);
  }
  return !processAlive(pid, marker);
}

let clockTicks: number | undefined;
/** USER_HZ, the unit of /proc/<pid>/stat times: 100 on x86_64 and arm64, but the kernel's answer wins. */
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

/** utime + stime (+ reaped children's when asked) of `pid` in seconds, all threads included; undefined when it is gone. */
export function readCpuSeconds(pid: number, opts: { includeChildren?: boolean } = {}): number | undefined {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return undefined;
  }
  // Fields are counted after the command name's closing ")": state is field 3, utime 14, stime 15, cutime 16, cstime 17.
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const n = (i: number) => Number(fields[i - 3] ?? 0);
  const ticks = n(14) + n(15) + (opts.includeChildren ? n(16) + n(17) : 0);
  return ticks / clkTck();
}

/** Pid file of a VM process: `<pid>\n<marker>\n`, the marker being what `processAlive` checks the pid against. */
export function writePidFile(path: string, pid: number, marker: string): void {
  writeFileSync(path, `${pid}\n${marker}\n`);
}

export function readPidFile(path: string): { pid: number; marker: string | undefined } | undefined {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch {
    return undefined;
  }
  const [pidLine, marker] = text.split("\n");
  const pid = Number(pidLine?.trim());
  return Number.isInteger(pid) && pid > 1 ? { pid, marker: marker?.trim() || undefined } : undefined;
}

/**
 * Kills the process a previous fleet-agent left running (its pid file, checked against `marker`, or the marker
 * written in the file), waits until it is gone and removes the pid file. Answers the pid it killed, if any.
 * Without any marker nothing is killed: a bare pid may belong to anyone by now.
 */
export async function killLeftover(pidFile: string, marker?: string): Promise<number | undefined> {
  const entry = readPidFile(pidFile);
  let killed: number | undefined;
  const mark = marker ?? entry?.marker;
  if (entry && mark && processAlive(entry.pid, mark)) {
    try {
      process.kill(entry.pid, "SIGKILL");
      killed = entry.pid;
    } catch {
      // gone already
    }
    await waitForProcessGone(entry.pid, mark, 5000);
  }
  rmSync(pidFile, { force: true });
  return killed;
}

/**
 * A process's memory from /proc/<pid>/smaps_rollup, KiB: `rss` counts every resident page, `pss` divides each shared
 * page by the processes that map it (what many clones of one template really cost: their sum), `anonymous` the
 * resident pages backed by no file (what the host cannot reclaim without swap). Undefined when gone.
 */
export function readMemoryKiB(pid: number): { rss: number; pss: number; anonymous: number } | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/smaps_rollup`, "utf8");
    const field = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, "m").exec(text)?.[1] ?? NaN);
    return { rss: field("Rss"), pss: field("Pss"), anonymous: field("Anonymous") };
  } catch {
    return undefined;
  }
}

/**
 * Whether this kernel lists a thread's children (`/proc/<pid>/task/<tid>/children`, CONFIG_PROC_CHILDREN): a tree is
 * then walked from its root, reading a few files per process, instead of reading every process's stat on the host.
 */
const childrenFiles = existsSync("/proc/thread-self/children");

/**
 * `pid` and every live descendant of it, `pid` first; empty when it is gone. A process that forks or exits during the
 * walk may be missed (the kernel's lists are read one at a time): callers that must miss none walk again
 * (`signalTree`), a sum tolerates it (`treeCpuSeconds`).
 */
export function processTree(pid: number): number[] {
  return childrenFiles ? walkChildren(pid) : scanParents(pid);
}

/** The tree from the children files of each process's threads. */
function walkChildren(pid: number): number[] {
  if (!existsSync(`/proc/${pid}/task`)) return [];
  const tree = [pid];
  const seen = new Set(tree);
  for (let i = 0; i < tree.length; i++) {
    let tasks: string[];
    try {
      tasks = readdirSync(`/proc/${tree[i]}/task`);
    } catch {
      continue; // gone meanwhile
    }
    for (const task of tasks) {
      let text: string;
      try {
        text = readFileSync(`/proc/${tree[i]}/task/${task}/children`, "utf8");
      } catch {
        continue;
      }
      for (const word of text.split(" ")) {
        const child = Number(word);
        if (word && !seen.has(child)) {
          seen.add(child);
          tree.push(child);
        }
      }
    }
  }
  return tree;
}

/** The tree from the parent pid in every process's /proc/<n>/stat. */
function scanParents(pid: number): number[] {
  const children = new Map<number, number[]>();
  let entries: string[];
  try {
    entries = readdirSync("/proc");
  } catch {
    return [];
  }
  for (const name of entries) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, "utf8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      const list = children.get(ppid) ?? [];
      list.push(Number(name));
      children.set(ppid, list);
    } catch {
      // gone meanwhile
    }
  }
  if (!entries.includes(String(pid))) return [];
  const tree = [pid];
  for (let i = 0; i < tree.length; i++) tree.push(...(children.get(tree[i]!) ?? []));
  return tree;
}

/**
 * CPU seconds of `pid`'s whole tree: each live process's own and its reaped children's (a process that ended is
 * counted in whoever reaped it, inside the tree). Undefined when `pid` is gone.
 */
export function treeCpuSeconds(pid: number): number | undefined {
  let total: number | undefined;
  for (const p of processTree(pid)) {
    const s = readCpuSeconds(p, { includeChildren: true });
    if (s !== undefined) total = (total ?? 0) + s;
  }
  return total;
}

/**
 * Sends `signal` to every process of `pid`'s tree, walking it again until a walk finds none it has not signalled: a
 * process forked meanwhile by one not yet stopped is caught by the next walk (a stopped one forks no more).
 */
export function signalTree(pid: number, signal: NodeJS.Signals): void {
  const sent = new Set<number>();
  for (let round = 0; round < 20; round++) {
    const fresh = processTree(pid).filter((p) => !sent.has(p));
    if (fresh.length === 0) return;
    for (const p of fresh) {
      sent.add(p);
      try {
        process.kill(p, signal);
      } catch {
        // gone
      }
    }
  }
}

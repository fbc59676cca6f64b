// bench:billing's measure of Postgres' work: the CPU time of the server this process started, read from /proc.
import { readdirSync, readFileSync } from "node:fs";

/** CPU seconds used so far by the Postgres server this process started (postmaster, live backends, reaped children). */
export function postgresCpuSeconds(): number {
  const stats = new Map<number, { ppid: number; comm: string; own: number; children: number }>();
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const raw = readFileSync(`/proc/${d}/stat`, "utf8");
      const comm = raw.slice(raw.indexOf("(") + 1, raw.lastIndexOf(")"));
      const f = raw.slice(raw.lastIndexOf(")") + 2).split(" ");
      stats.set(Number(d), { ppid: Number(f[1]), comm, own: Number(f[11]) + Number(f[12]), children: Number(f[13]) + Number(f[14]) });
    } catch {
      /* the process ended meanwhile */
    }
  }
  let ticks = 0;
  for (const [pid, s] of stats) {
    if (s.ppid !== process.pid || s.comm !== "postgres") continue;
    ticks += s.own + s.children;
    for (const c of stats.values()) if (c.ppid === pid) ticks += c.own;
  }
  return ticks / 100;
}

// bench:scale's measures: the host process's memory and fds (median of a few samples), the disk its VMs take, free space, the machine's state, and a slope.
import { readFileSync } from "node:fs";
import { statfs } from "node:fs/promises";
import { loadavg } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import { allocatedBytes } from "../density/measure.ts";
import { median, round } from "../figures.ts";
import { fdCount, qemuPids, rssKiB, type HostProcess } from "./host-process.ts";

export const MiB = 1024 * 1024;
export const r1 = (x: number) => round(x, 1);

export interface HostSample {
  rssKiB: number;
  /** The JS heap live after a full collection, KiB (the median sample's). */
  heapKiB: number;
  /** Memory outside the JS heap that JS objects hold (buffers, native handles), KiB. */
  externalKiB: number;
  /** The longest malloc trim among the samples (it follows each collection), ms. */
  trimMs: number;
  fds: number;
  /** QEMUs of this host: its awake agents' and the paused ones it keeps for hibernated agents. */
  qemus: number;
}

/**
 * The host's RSS and fds, each the median of `n` samples `everyMs` apart; each RSS sample a moment after a full garbage
 * collection of the host (system.ts: SIGUSR2), which otherwise moves it by 100 MB and more.
 */
export async function sampleHost(host: HostProcess, n = 5, everyMs = 1000): Promise<HostSample> {
  const rss: number[] = [];
  const fds: number[] = [];
  const heap: number[] = [];
  const external: number[] = [];
  let trimMs = 0;
  for (let i = 0; i < n; i++) {
    process.kill(host.pid, "SIGUSR2");
    await sleep(everyMs);
    rss.push(rssKiB(host.pid));
    fds.push(fdCount(host.pid));
    if (host.memory) {
      heap.push(host.memory.heapUsed / 1024);
      external.push(host.memory.external / 1024);
      trimMs = Math.max(trimMs, host.memory.trimMs);
    }
  }
  return {
    rssKiB: median(rss),
    heapKiB: heap.length ? median(heap) : NaN,
    externalKiB: external.length ? median(external) : NaN,
    trimMs,
    fds: median(fds),
    qemus: qemuPids(host.dataDir).length,
  };
}

/** A sample as the log says it (`vmsBytes`: the VMs' disk, when measured). */
export function describeHost(s: HostSample, vmsBytes?: number): string {
  const vms = vmsBytes === undefined ? "" : `; vms ${Math.round(vmsBytes / MiB)} MiB`;
  return `host RSS ${Math.round(s.rssKiB / 1024)} MiB, JS heap ${Math.round(s.heapKiB / 1024)} MiB, ${s.fds} fds, ${s.qemus} QEMUs${vms}`;
}

/** A sample as the RESULT line gives it. */
export function hostFigures(s: HostSample, vmsBytes: number) {
  return { rss_mib: r1(s.rssKiB / 1024), heap_mib: r1(s.heapKiB / 1024), trim_ms: s.trimMs, fds: s.fds, qemus: s.qemus, vms_mib: Math.round(vmsBytes / MiB) };
}

/** Allocated bytes under `dir` (du: stat blocks; a reflinked block counts in every file that has it). */
export function duBytes(dir: string): number {
  try {
    return allocatedBytes(dir);
  } catch {
    return 0;
  }
}

export async function freeBytes(dir: string): Promise<number> {
  const s = await statfs(dir);
  return s.bavail * s.bsize;
}

export async function usedBytes(dir: string): Promise<number> {
  const s = await statfs(dir);
  return (s.blocks - s.bfree) * s.bsize;
}

/** MemAvailable, MiB. */
export function availableMiB(): number {
  const m = /MemAvailable:\s+(\d+) kB/.exec(readFileSync("/proc/meminfo", "utf8"));
  return m ? Math.round(Number(m[1]) / 1024) : NaN;
}

export function machineState() {
  const [l1, l5, l15] = loadavg();
  return { load1: r1(l1!), load5: r1(l5!), load15: r1(l15!), available_mib: availableMiB() };
}

/** Least-squares slope of y over x. */
export function slope(points: { x: number; y: number }[]): number {
  const n = points.length;
  if (n < 2) return NaN;
  const mx = points.reduce((s, p) => s + p.x, 0) / n;
  const my = points.reduce((s, p) => s + p.y, 0) / n;
  let num = 0;
  let den = 0;
  for (const p of points) {
    num += (p.x - mx) * (p.y - my);
    den += (p.x - mx) ** 2;
  }
  return den === 0 ? NaN : num / den;
}

// bench:doze's CPU sampler: the host process's and the QEMUs' CPU (from /proc) over the moments every agent waits on its model, and every VM dozes.
import { readFileSync } from "node:fs";
import { loadavg } from "node:os";

/** What the sampler reads at each tick. */
export interface CpuProbe {
  /** CPU seconds of each agent's QEMU (0 for one that is not running). */
  qemuSeconds(): Promise<number>;
  /** How many model calls wait for their first byte now. */
  waitingCalls(): number;
  /** How many of the agents' VMs doze now. */
  dozingVms(): number;
}

/** CPU over the intervals where a condition held at both ends, as % of one core. */
export interface CpuShare {
  /** Seconds sampled. */
  seconds: number;
  /** Host process (gateway, host, egress proxy, database, the bench's client and model) and QEMUs together, % of one core. */
  pct: number | null;
  hostPct: number | null;
  qemuPct: number | null;
}

interface Tick {
  at: number;
  self: number;
  qemu: number;
  waiting: number;
  dozing: number;
}

/** The machine's available memory, MiB (MemAvailable). */
export function availableMiB(): number {
  const m = /MemAvailable:\s+(\d+) kB/.exec(readFileSync("/proc/meminfo", "utf8"));
  return m ? Math.round(Number(m[1]) / 1024) : NaN;
}

const selfSeconds = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
};

/** Samples every `everyMs` until stopped: CPU while all `agents` wait on their model, and while all `agents` doze. */
export class CpuSampler {
  private readonly ticks: Tick[] = [];
  private readonly loads: number[] = [];
  private readonly freeMiB: number[] = [];
  private stopped = false;
  private readonly done: Promise<void>;

  constructor(probe: CpuProbe, everyMs: number) {
    this.done = (async () => {
      while (!this.stopped) {
        const qemu = await probe.qemuSeconds();
        this.ticks.push({ at: performance.now(), self: selfSeconds(), qemu, waiting: probe.waitingCalls(), dozing: probe.dozingVms() });
        this.loads.push(loadavg()[0]!);
        this.freeMiB.push(availableMiB());
        await new Promise((r) => setTimeout(r, everyMs));
      }
    })();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await this.done;
  }

  /** CPU over the intervals where `held` was true at both ends. */
  share(held: (t: Tick) => boolean): CpuShare {
    let wall = 0;
    let self = 0;
    let qemu = 0;
    for (let i = 1; i < this.ticks.length; i++) {
      const a = this.ticks[i - 1]!;
      const b = this.ticks[i]!;
      if (!held(a) || !held(b)) continue;
      wall += (b.at - a.at) / 1000;
      self += b.self - a.self;
      qemu += b.qemu - a.qemu;
    }
    const pct = (x: number) => (wall > 0 ? Math.round((x / wall) * 1000) / 10 : null);
    return { seconds: Math.round(wall * 10) / 10, pct: pct(self + qemu), hostPct: pct(self), qemuPct: pct(qemu) };
  }

  /** While every one of `n` agents waited on its model's first byte. */
  allWaiting(n: number): CpuShare {
    return this.share((t) => t.waiting >= n);
  }

  /** While every one of `n` agents' VMs dozed. */
  allDozing(n: number): CpuShare {
    return this.share((t) => t.dozing >= n);
  }

  /** The most VMs seen dozing at once. */
  mostDozing(): number {
    return Math.max(0, ...this.ticks.map((t) => t.dozing));
  }

  /** The load average (1 min) at its highest, and the least available memory, while it sampled. */
  machine(): { load1Max: number; availableMiBMin: number } {
    return { load1Max: Math.round(Math.max(0, ...this.loads) * 10) / 10, availableMiBMin: Math.min(...this.freeMiB) };
  }
}

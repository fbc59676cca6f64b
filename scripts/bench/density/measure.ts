// bench:density's measures: disk allocated and in use, the QEMUs' memory (PSS) and CPU, calls to an agent and the trickle of them.
import { readdirSync, statSync } from "node:fs";
import { statfs } from "node:fs/promises";
import { loadavg } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { Agent, request } from "undici";
import { readCpuSeconds, readMemoryKiB } from "../../../fleet-agent/drivers/common/proc.ts";
import type { RunningVm } from "../../../fleet-agent/drivers/driver.ts";
import { AppError } from "../../../lib/errors.ts";
import { round } from "../figures.ts";

const MiB = 1024 * 1024;
export const r1 = (n: number) => round(n, 1);
export const mib = (bytes: number) => r1(bytes / MiB);

/** Allocated bytes (stat blocks × 512) of every file under `dir`: holes are not counted, reflinked blocks are (in full). */
export function allocatedBytes(dir: string): number {
  let total = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, entry.name);
    if (entry.isDirectory()) total += allocatedBytes(p);
    else if (entry.isFile()) total += statSync(p).blocks * 512;
  }
  return total;
}
/** Bytes in use on the filesystem of `dir` (statfs): exact for the bench's own loop image, noisy on a shared disk. */
export async function usedBytes(dir: string): Promise<number> {
  const s = await statfs(dir);
  return (s.blocks - s.bfree) * s.bsize;
}

export async function call(vm: RunningVm, path: string, method = "GET"): Promise<number> {
  // The VM's endpoint: a loopback port, or a QEMU's relayed unix socket (its network namespace's port, relayed).
  const { statusCode, body } = await request(`http://${vm.endpoint.host}:${vm.endpoint.port}${path}`, {
    method,
    signal: AbortSignal.timeout(30_000),
    ...(vm.endpoint.socketPath ? { dispatcher: socketAgent(vm.endpoint.socketPath) } : {}),
  });
  const text = await body.text();
  if (statusCode !== 200) throw new AppError("bad_gateway", `${path} answered ${statusCode}: ${text}`);
  return (JSON.parse(text) as { count: number }).count;
}

const socketAgents = new Map<string, Agent>();
function socketAgent(socketPath: string): Agent {
  let agent = socketAgents.get(socketPath);
  if (!agent) socketAgents.set(socketPath, (agent = new Agent({ connect: { socketPath } })));
  return agent;
}

/** Each awake clone's GET /counter every `trickleMs` (staggered): latencies and failures while it runs. */
export class Trickle {
  readonly latencies: number[] = [];
  failures = 0;
  lastError: string | undefined;
  private readonly timers = new Map<string, NodeJS.Timeout>();
  private readonly trickleMs: number;
  constructor(trickleMs: number) {
    this.trickleMs = trickleMs;
  }
  add(vm: RunningVm): void {
    const tick = async () => {
      const t0 = performance.now();
      try {
        await call(vm, "/counter");
        this.latencies.push(performance.now() - t0);
      } catch (err) {
        this.failures++;
        this.lastError = (err as Error).message;
      }
    };
    const timer = setTimeout(() => {
      void tick();
      this.timers.set(
        vm.spec.vmId,
        setInterval(() => void tick(), this.trickleMs),
      );
    }, Math.random() * this.trickleMs);
    this.timers.set(vm.spec.vmId, timer);
  }
  stop(): void {
    for (const t of this.timers.values()) clearTimeout(t);
    this.timers.clear();
  }
}

/** CPU the QEMUs used over `ms` (a share of the machine's cores), and the load average. */
export async function cpuOver(pids: number[], ms: number): Promise<{ cpuCores: number; load1: number }> {
  const sum = () => pids.reduce((a, p) => a + (readCpuSeconds(p) ?? 0), 0);
  const before = sum();
  await sleep(ms);
  return { cpuCores: r1((sum() - before) / (ms / 1000)), load1: r1(loadavg()[0]!) };
}

export function memorySum(vms: RunningVm[]): { pssKiB: number; rssKiB: number; counted: number } {
  let pssKiB = 0;
  let rssKiB = 0;
  let counted = 0;
  for (const vm of vms) {
    const m = vm.pid ? readMemoryKiB(vm.pid) : undefined;
    if (!m) continue;
    pssKiB += m.pss;
    rssKiB += m.rss;
    counted++;
  }
  return { pssKiB, rssKiB, counted };
}

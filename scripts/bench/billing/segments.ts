// bench:billing's meter segments: a month of wake-run-sleep activity per agent, generated deterministically, as hosts cut it.
import type { MeterSegment } from "../../../contracts/meter.ts";
import { zones, type BenchShape } from "./fixture.ts";

function lcg(seed: number): (n: number) => number {
  let s = seed;
  return (n) => {
    s = (s * 1103515245 + 12345) & 0x7fffffff;
    return s % n;
  };
}

/** Each agent wakes, runs a few minutes in 10 s heartbeat segments, sleeps, over the month: as meters cut it. */
export function generate(
  shape: Pick<BenchShape, "agents" | "hosts">,
  monthStart: number,
  monthEnd: number,
  count: number,
  seqBase: number,
): { byHost: MeterSegment[][]; expectedMs: number } {
  const { agents: agentCount, hosts: hostCount } = shape;
  const rnd = lcg(7);
  const byHost: MeterSegment[][] = Array.from({ length: hostCount }, () => []);
  const perAgent = Math.ceil(count / agentCount);
  const tag = new Date(monthStart + 86_400_000).toISOString().slice(2, 7).replace("-", "");
  const span = monthEnd - monthStart - 86_400_000; // the last day stays free: no segment runs past the month
  let expectedMs = 0;
  let made = 0;
  for (let a = 0; a < agentCount && made < count; a++) {
    const hostId = `host_${String(a % hostCount).padStart(4, "0")}`;
    const vmId = `vm_${String(a).padStart(6, "0")}`;
    const agentId = `agt_${String(a).padStart(6, "0")}`;
    const tenantId = `ten_${a % zones.length}`;
    // runs of 5–54 heartbeat segments, spread evenly over the month with a random start in each slot
    const lengths: number[] = [];
    for (let left = Math.min(perAgent, count - made); left > 0; ) {
      const n = Math.min(left, 5 + rnd(50));
      lengths.push(n);
      left -= n;
    }
    const slot = Math.floor(span / lengths.length);
    let seq = seqBase;
    lengths.forEach((n, run) => {
      let t = monthStart + run * slot + rnd(Math.max(1, slot - n * 10_000));
      const runId = `run_${agentId.slice(4)}_${tag}_${run}`;
      const wake = (["request", "webhook", "api"] as const)[rnd(3)]!;
      for (let i = 0; i < n; i++) {
        const dur = i === n - 1 ? 1 + rnd(10_000) : 10_000;
        byHost[a % hostCount]!.push({
          id: `${hostId}:${vmId}:${seq}`,
          hostId,
          vmId,
          seq: seq++,
          tenantId,
          agentId,
          runId,
          startedAt: new Date(t).toISOString(),
          endedAt: new Date(t + dur).toISOString(),
          vcpus: 1 + (a % 4),
          memMiB: 256 * (1 + (a % 8)),
          startReason: i === 0 ? wake : "heartbeat",
          endReason: i === n - 1 ? "idle" : "heartbeat",
        });
        expectedMs += dur;
        t += dur;
      }
      made += n;
    });
  }
  // a host ships its segments in the order it closed them
  for (const segs of byHost) segs.sort((x, y) => (x.endedAt < y.endedAt ? -1 : x.endedAt > y.endedAt ? 1 : 0));
  return { byHost, expectedMs };
}

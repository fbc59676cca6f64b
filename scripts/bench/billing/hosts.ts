// bench:billing's hosts (a worker thread started by hosts-protocol.ts): they generate and ship the segments, and ask for the month's reports as a client would.
import { parentPort, workerData } from "node:worker_threads";
import { componentKey, signComponentToken } from "../../../lib/host-token.ts";
import { month, secret, zones, type BenchShape } from "./fixture.ts";
import type { ClientCommand, ClientReply, HostsData, ReportRows } from "./hosts-protocol.ts";
import { generate } from "./segments.ts";

/** The hosts: generate and serialize every batch up front, then POST them with `concurrency` requests in flight. */
async function hosts(base: string, shape: BenchShape): Promise<void> {
  const { batch: batchSize, concurrency } = shape;
  const key = componentKey(secret);
  let batches: { hostId: string; body: string; n: number }[] = [];
  let expectedMs = 0;
  let next = 0;
  const tokens = new Map<string, { value: string; at: number }>();
  const token = async (hostId: string) => {
    const t = tokens.get(hostId);
    if (t && Date.now() - t.at < 30_000) return t.value;
    const value = await signComponentToken(key, { sub: hostId, aud: "billing" });
    tokens.set(hostId, { value, at: Date.now() });
    return value;
  };
  const reply = (r: Partial<ClientReply>) => parentPort!.postMessage({ segments: 0, expectedMs: 0, accepted: 0, sent: 0, cpuUs: 0, ...r });
  parentPort!.on("message", async (m: ClientCommand) => {
    if (m.type === "exit") {
      reply({});
      parentPort!.close();
      return;
    }
    if (m.type === "report") {
      try {
        const t = performance.now();
        const cpu0 = process.threadCpuUsage();
        const perTenant: number[] = [];
        const out: ReportRows = [];
        for (let i = 0; i < zones.length; i++) {
          const ti = performance.now();
          const res = await fetch(`${base}/v1/usage?from=${month}-01&to=2026-11-01&tz=${encodeURIComponent(zones[i]!)}&groupBy=agent,day`, {
            headers: { "x-bench-tenant": `ten_${i}` },
          });
          if (!res.ok) throw new Error(`usage ${res.status}: ${await res.text()}`);
          out.push((await res.json()) as ReportRows[number]);
          perTenant.push(performance.now() - ti);
        }
        const cpu = process.threadCpuUsage(cpu0);
        reply({ ms: performance.now() - t, perTenant, cpuUs: cpu.user + cpu.system, ...(m.withRows ? { out } : {}) });
      } catch (err) {
        reply({ error: String(err) });
      }
      return;
    }
    if (m.type === "prepare") {
      const g = generate(shape, m.start, m.end, m.count, m.seqBase);
      batches = [];
      next = 0;
      expectedMs = g.expectedMs;
      // batches in the order hosts send them, hosts interleaved
      const perHost = g.byHost.map((segs) => {
        const out: { hostId: string; body: string; n: number }[] = [];
        for (let i = 0; i < segs.length; i += batchSize) {
          const slice = segs.slice(i, i + batchSize);
          out.push({ hostId: slice[0]!.hostId, body: JSON.stringify({ segments: slice }), n: slice.length });
        }
        return out;
      });
      for (let i = 0; perHost.some((b) => i < b.length); i++) for (const b of perHost) if (b[i]) batches.push(b[i]!);
      reply({ segments: batches.reduce((t, b) => t + b.n, 0), expectedMs });
      return;
    }
    const until = Math.ceil((batches.length * m.quarter) / 4);
    const cpu0 = process.threadCpuUsage(); // this thread only (process.cpuUsage counts every thread)
    let accepted = 0;
    let sent = 0;
    try {
      await Promise.all(
        Array.from({ length: concurrency }, async () => {
          for (;;) {
            const i = next++;
            if (i >= until) return;
            const b = batches[i]!;
            const res = await fetch(`${base}/v1/meter-segments`, {
              method: "POST",
              headers: { "content-type": "application/json", authorization: `Bearer ${await token(b.hostId)}` },
              body: b.body,
            });
            const body = (await res.json()) as { accepted: string[]; rejected: unknown[] };
            if (!res.ok || body.rejected.length > 0) throw new Error(`ingest ${res.status}: ${JSON.stringify(body.rejected ?? body).slice(0, 500)}`);
            accepted += body.accepted.length;
            sent += b.n;
          }
        }),
      );
      next = until;
      const cpu = process.threadCpuUsage(cpu0);
      reply({ accepted, sent, cpuUs: cpu.user + cpu.system });
    } catch (err) {
      reply({ error: String(err) });
    }
  });
}

const data = workerData as HostsData;
await hosts(data.base, data.shape);

// Shipper rules with a manual clock: batching, exponential backoff with a cap, partial acks, rejections dropped and kept.
import { describe, expect, it } from "vitest";
import { ManualClock } from "../../lib/clock.ts";
import { Shipper, type SegmentSink, type ShipResult, type ShippableSpool } from "../../fleet-agent/meter/shipper.ts";
import type { MeterSegment } from "../../contracts/meter.ts";

class MemorySpool implements ShippableSpool {
  pending: MeterSegment[] = [];
  rejected: string[] = [];
  shippable(limit: number): MeterSegment[] {
    return this.pending.slice(0, limit);
  }
  async ack(ids: Iterable<string>): Promise<void> {
    const done = new Set(ids);
    this.pending = this.pending.filter((s) => !done.has(s.id));
  }
  async synced(): Promise<void> {}
  recordRejected(r: ShipResult["rejected"]): void {
    this.rejected.push(...r.map((x) => x.id));
  }
}

const seg = (i: number) => ({ id: `host_1:vm_1:${i}` }) as MeterSegment;
const settle = async () => {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
};

describe("Shipper", () => {
  it("retries a failing sink with doubling, capped delays, then ships everything once it recovers", async () => {
    const clock = new ManualClock();
    const spool = new MemorySpool();
    spool.pending = [seg(0), seg(1), seg(2)];
    const attempts: number[] = [];
    let down = true;
    const sink: SegmentSink = {
      async ship(batch) {
        attempts.push(clock.monotonic());
        if (down) throw new Error("connection refused");
        return { accepted: batch.map((s) => s.id), duplicates: [], rejected: [] };
      },
    };
    const shipper = new Shipper({ spool, sink, clock, batchSize: 2, minBackoffMs: 1000, maxBackoffMs: 8000, random: () => 0.999999 });
    shipper.start();
    clock.advance(0);
    await settle();
    for (let i = 0; i < 400; i++) {
      clock.advance(100); // small steps: each retry is scheduled only after the failed attempt settles
      await settle();
    }
    // 0, then +1 s, +2 s, +4 s, +8 s, +8 s (cap) …
    const gaps = attempts.slice(1).map((t, i) => t - (attempts[i] as number));
    expect(gaps.slice(0, 5)).toEqual([1000, 2000, 4000, 8000, 8000]);
    expect(shipper.stats.consecutiveFailures).toBeGreaterThan(4);
    shipper.notify(); // new segments during a backoff do not cut the wait short
    const before = attempts.length;
    clock.advance(10);
    await settle();
    expect(attempts.length).toBe(before);
    down = false;
    clock.advance(8000);
    await settle();
    expect(spool.pending).toEqual([]);
    expect(shipper.stats).toMatchObject({ accepted: 3, consecutiveFailures: 0 });
  });

  it("drops accepted, duplicate and rejected ids, keeps the rest for the next round, and records rejections", async () => {
    const clock = new ManualClock();
    const spool = new MemorySpool();
    spool.pending = [seg(0), seg(1), seg(2), seg(3)];
    let call = 0;
    const sink: SegmentSink = {
      async ship(batch) {
        call++;
        if (call === 1) return { accepted: [batch[0]!.id], duplicates: [batch[1]!.id], rejected: [{ id: batch[2]!.id, code: "too_long", message: "x" }] };
        return { accepted: batch.map((s) => s.id), duplicates: [], rejected: [] };
      },
    };
    const shipper = new Shipper({ spool, sink, clock, batchSize: 10, lingerMs: 500 });
    shipper.start();
    clock.advance(0);
    await settle();
    expect(spool.pending).toEqual([]);
    expect(call).toBe(2);
    expect(spool.rejected).toEqual([seg(2).id]);
    expect(shipper.stats).toMatchObject({ accepted: 2, duplicates: 1, rejected: 1 });
  });

  it("waits the linger delay after new segments, and flush ships immediately", async () => {
    const clock = new ManualClock();
    const spool = new MemorySpool();
    const shipped: string[] = [];
    const sink: SegmentSink = {
      async ship(batch) {
        shipped.push(...batch.map((s) => s.id));
        return { accepted: batch.map((s) => s.id), duplicates: [], rejected: [] };
      },
    };
    const shipper = new Shipper({ spool, sink, clock, lingerMs: 1000 });
    shipper.start();
    clock.advance(0);
    await settle();
    spool.pending.push(seg(7));
    shipper.notify();
    clock.advance(999);
    await settle();
    expect(shipped).toEqual([]);
    clock.advance(1);
    await settle();
    expect(shipped).toEqual([seg(7).id]);
    spool.pending.push(seg(8));
    expect(await shipper.flush()).toBe(true);
    expect(shipped).toEqual([seg(7).id, seg(8).id]);
    shipper.stop();
  });

  it("treats an answer that acknowledges nothing as a failure, so it backs off instead of spinning", async () => {
    const clock = new ManualClock();
    const spool = new MemorySpool();
    spool.pending = [seg(0)];
    let calls = 0;
    const sink: SegmentSink = {
      async ship() {
        calls++;
        return { accepted: ["someone-else"], duplicates: [], rejected: [] };
      },
    };
    const shipper = new Shipper({ spool, sink, clock, minBackoffMs: 1000, random: () => 0.999999 });
    shipper.start();
    clock.advance(0);
    await settle();
    expect(calls).toBe(1);
    expect(shipper.stats.consecutiveFailures).toBe(1);
    clock.advance(999);
    await settle();
    expect(calls).toBe(1);
    shipper.stop();
  });
});

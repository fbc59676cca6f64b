// The file spool on a real file system: durability across reopen, torn tails, atomic trimming, sequence continuity, locking.
import { afterEach, describe, expect, it } from "vitest";
import { appendFileSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SegmentSpool, meterDir } from "../../fleet-agent/meter/spool.ts";
import type { MeterSegment } from "../../contracts/meter.ts";

const dirs: string[] = [];
function tempDir(): string {
  const d = mkdtempSync(join(tmpdir(), "meter-spool-"));
  dirs.push(d);
  return meterDir(d, "host_1");
}
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

function seg(spool: SegmentSpool, vmId: string, startMs: number): MeterSegment {
  const seq = spool.nextSeq(vmId);
  return {
    id: `host_1:${vmId}:${seq}`,
    hostId: "host_1",
    vmId,
    seq,
    tenantId: "ten_1",
    agentId: "agt_1",
    runId: "run_1",
    startedAt: new Date(startMs).toISOString(),
    endedAt: new Date(startMs + 10_000).toISOString(),
    vcpus: 1,
    memMiB: 256,
    startReason: "heartbeat",
    endReason: "heartbeat",
  };
}

describe("SegmentSpool", () => {
  it("offers segments for shipping only once synced, and keeps them across a reopen", async () => {
    const dir = tempDir();
    const spool = SegmentSpool.open(dir);
    const a = seg(spool, "vm_1", 0);
    spool.append(a);
    expect(spool.shippable(10)).toEqual([]); // written, not yet fsynced
    await spool.synced();
    expect(spool.shippable(10)).toEqual([a]);
    await spool.close();
    const again = SegmentSpool.open(dir);
    expect(again.shippable(10)).toEqual([a]);
    expect(again.nextSeq("vm_1")).toBe(1);
    await again.close();
  });

  it("ignores a torn last line (a crash mid-append) and appends cleanly after it", async () => {
    const dir = tempDir();
    const spool = SegmentSpool.open(dir);
    const a = seg(spool, "vm_1", 0);
    spool.append(a);
    await spool.close();
    const torn = JSON.stringify(seg(spool, "vm_1", 10_000)).slice(0, 57);
    appendFileSync(join(dir, "segments.ndjson"), torn);
    const again = SegmentSpool.open(dir);
    expect(again.corruptLines).toBe(0);
    expect(again.shippable(10)).toEqual([a]);
    const b = seg(again, "vm_1", 10_000);
    expect(b.seq).toBe(1); // the torn segment never became durable, so its number is free
    again.append(b);
    await again.close();
    const third = SegmentSpool.open(dir);
    expect(third.shippable(10)).toEqual([a, b]);
    await third.close();
  });

  it("skips (and counts) an unreadable line in the middle without losing the others", async () => {
    const dir = tempDir();
    const spool = SegmentSpool.open(dir);
    const a = seg(spool, "vm_1", 0);
    spool.append(a);
    await spool.close();
    appendFileSync(join(dir, "segments.ndjson"), "{not json\n");
    const again = SegmentSpool.open(dir);
    const b = seg(again, "vm_1", 10_000);
    again.append(b);
    await again.close();
    const third = SegmentSpool.open(dir);
    expect(third.corruptLines).toBe(1);
    expect(third.shippable(10)).toEqual([a, b]);
    await third.close();
  });

  it("trims acknowledged segments by an atomic rewrite that keeps each VM's sequence number and last segment end", async () => {
    const dir = tempDir();
    const spool = SegmentSpool.open(dir, { compactAfter: 2 });
    const segs = [seg(spool, "vm_1", 0), seg(spool, "vm_1", 10_000), seg(spool, "vm_2", 0), seg(spool, "vm_1", 20_000)];
    for (const s of segs) spool.append(s);
    await spool.synced();
    await spool.ack([segs[0]!.id]); // one acked: below the threshold, the file is left alone
    expect(readFileSync(join(dir, "segments.ndjson"), "utf8").trim().split("\n")).toHaveLength(4);
    await spool.ack([segs[1]!.id, segs[2]!.id]);
    const lines = readFileSync(join(dir, "segments.ndjson"), "utf8").trim().split("\n");
    expect(lines).toHaveLength(2); // checkpoint + the one still pending
    const end = (s: MeterSegment) => ({ runId: s.runId, endedAt: s.endedAt });
    expect(JSON.parse(lines[0]!)).toEqual({ checkpoint: { seqs: { vm_1: 2, vm_2: 0 }, ends: { vm_1: end(segs[3]!), vm_2: end(segs[2]!) } } });
    expect(existsSync(join(dir, "segments.ndjson.tmp"))).toBe(false);
    await spool.ack([segs[3]!.id]);
    spool.forget("vm_2");
    await spool.close();
    const again = SegmentSpool.open(dir);
    expect(again.shippable(10)).toEqual([]);
    // shipped and trimmed, the last instant metered is still known (crash recovery closes runs there)
    expect(again.lastEnded("vm_1")).toEqual({ runId: "run_1", endedAt: Date.parse(segs[3]!.endedAt) });
    expect(again.nextSeq("vm_1")).toBe(3);
    await again.close();
  });

  it("drops a forgotten VM from the checkpoint at the next rewrite", async () => {
    const dir = tempDir();
    const spool = SegmentSpool.open(dir);
    const a = seg(spool, "vm_9", 0);
    spool.append(a);
    spool.forget("vm_9");
    await spool.synced();
    await spool.ack([a.id]);
    await spool.close();
    expect(JSON.parse(readFileSync(join(dir, "segments.ndjson"), "utf8").trim())).toEqual({ checkpoint: { seqs: {} } });
  });

  it("refuses a spool another live process holds, and takes over the lock of a dead one", async () => {
    const dir = tempDir();
    const first = SegmentSpool.open(dir);
    await first.close();
    writeFileSync(join(dir, "meter.lock"), "1\n"); // pid 1 is always alive
    expect(() => SegmentSpool.open(dir)).toThrow(/in use by process 1/);
    writeFileSync(join(dir, "meter.lock"), "999999999\n");
    const taken = SegmentSpool.open(dir);
    expect(readFileSync(join(dir, "meter.lock"), "utf8").trim()).toBe(String(process.pid));
    await taken.close();
    expect(existsSync(join(dir, "meter.lock"))).toBe(false);
  });

  it("keeps refused segments in rejected.ndjson", async () => {
    const dir = tempDir();
    const spool = SegmentSpool.open(dir);
    const a = seg(spool, "vm_1", 0);
    spool.recordRejected([{ id: a.id, code: "too_long", message: "x" }], [a]);
    await spool.close();
    const line = JSON.parse(readFileSync(join(dir, "rejected.ndjson"), "utf8"));
    expect(line).toMatchObject({ id: a.id, code: "too_long", segment: a });
  });
});

// Clipping a new segment by the time its agent was already billed: every arrival order bills exactly the union.
import { describe, expect, it } from "vitest";
import { billedSpansOf, clipAgainst, mergeCoverage, multirangeText, type BilledSpan, type CoverSpan, type NewSpan } from "../../billing/overlap.ts";

function lcg(seed: number): (n: number) => number {
  let s = seed;
  return (n) => {
    s = (s * 1103515245 + 12345) & 0x7fffffff;
    return s % n;
  };
}

function unionMs(spans: readonly BilledSpan[]): number {
  const sorted = [...spans].sort((a, b) => a.startMs - b.startMs);
  let total = 0;
  let reach = -Infinity;
  for (const s of sorted) {
    if (s.endMs <= reach) continue;
    total += s.endMs - Math.max(s.startMs, reach);
    reach = s.endMs;
  }
  return total;
}

/** Ms each of `incoming` bills: its clipped pieces, or all of it. */
function billedMs(clips: ReturnType<typeof clipAgainst>, s: NewSpan): number {
  const c = clips.get(s.id);
  return c ? c.pieces.reduce((n, [a, b]) => n + (b - a), 0) : s.endMs - s.startMs;
}

describe("clipAgainst", () => {
  it("bills the union of every span, whatever was billed before and in whatever order the rest arrives", () => {
    const rnd = lcg(11);
    for (let round = 0; round < 300; round++) {
      const spans: NewSpan[] = Array.from({ length: 1 + rnd(12) }, (_, i) => {
        const start = rnd(200);
        return { id: `s${i}`, hostId: `host_${rnd(3)}`, startMs: start, endMs: start + 1 + rnd(60) };
      });
      const cut = rnd(spans.length);
      const before = spans.slice(0, cut);
      const incoming = spans.slice(cut);
      for (const order of [incoming, [...incoming].reverse()]) {
        const clips = clipAgainst(before, order);
        const total = unionMs(before) + order.reduce((n, s) => n + billedMs(clips, s), 0);
        expect(total).toBe(unionMs(spans));
        for (const [id, c] of clips) {
          const s = order.find((x) => x.id === id)!;
          expect(c.overlapMs).toBe(s.endMs - s.startMs - billedMs(clips, s));
          expect(c.overlapMs).toBeGreaterThan(0);
          for (const [a, b] of c.pieces) expect(a >= s.startMs && b <= s.endMs && a < b).toBe(true);
        }
      }
    }
  });

  it("keeps an agent's coverage as merged rows over batches, so each batch bills only what no earlier one covered", () => {
    const rnd = lcg(5);
    for (let round = 0; round < 200; round++) {
      let rows: CoverSpan[] = [];
      const seen: NewSpan[] = [];
      let billedTotal = 0;
      for (let batch = 0; batch < 1 + rnd(6); batch++) {
        const spans: NewSpan[] = Array.from({ length: 1 + rnd(5) }, (_, i) => {
          const start = rnd(300);
          return { id: `b${batch}s${i}`, hostId: `host_${rnd(3)}`, startMs: start, endMs: start + 1 + rnd(40) };
        });
        const lo = Math.min(...spans.map((x) => x.startMs));
        const hi = Math.max(...spans.map((x) => x.endMs));
        // what the coverage query reads: the rows that overlap or touch [lo, hi]
        const read = rows.filter((r) => r.endMs >= lo && r.startMs <= hi);
        const clips = clipAgainst(billedSpansOf(read), spans);
        billedTotal += spans.reduce((n, x) => n + billedMs(clips, x), 0);
        const { upsert, removed } = mergeCoverage(read, spans);
        rows = rows.filter((r) => !removed.includes(r.startMs) && !upsert.some((u) => u.startMs === r.startMs));
        rows = [...rows, ...upsert].sort((a, b) => a.startMs - b.startMs);
        seen.push(...spans);
        expect(billedTotal).toBe(unionMs(seen));
        expect(rows.reduce((n, r) => n + r.endMs - r.startMs, 0)).toBe(unionMs(seen));
        for (let i = 1; i < rows.length; i++) expect(rows[i]!.startMs).toBeGreaterThan(rows[i - 1]!.endMs);
      }
    }
  });

  it("leaves touching and separate spans alone, and names the hosts that billed an overlap first", () => {
    const a = { id: "a", hostId: "host_a", startMs: 0, endMs: 10 };
    const b = { id: "b", hostId: "host_b", startMs: 10, endMs: 20 };
    expect(clipAgainst([a], [b]).size).toBe(0);
    expect(clipAgainst([], [a, b]).size).toBe(0);
    const c = { id: "c", hostId: "host_c", startMs: 5, endMs: 30 };
    expect(clipAgainst([a, b], [c]).get("c")).toEqual({ pieces: [[20, 30]], overlapMs: 15, coveredBy: ["host_a", "host_b"] });
    expect(clipAgainst([], [{ ...a, endMs: 40 }, c]).get("c")).toEqual({ pieces: [], overlapMs: 25, coveredBy: ["host_a"] });
    expect(multirangeText([])).toBe("{}");
    expect(
      multirangeText([
        [1, 2],
        [4, 9],
      ]),
    ).toBe("{[1,2),[4,9)}");
  });
});

// Clipping a new segment by the time its agent was already billed: every arrival order bills exactly the union.
import { describe, expect, it } from "vitest";
import { clipAgainst, multirangeText, type BilledSpan, type NewSpan } from "../../billing/overlap.ts";

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

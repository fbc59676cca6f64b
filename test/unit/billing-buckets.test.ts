// Splitting conserves milliseconds: segments → 15-minute buckets → local windows equals segments → windows, in every zone.
import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { alignedToBuckets, bucketMs, splitIntoBuckets, splitIntoWindows, windowIndex } from "../../billing/buckets.ts";
import { windowBoundaries } from "../../billing/zones.ts";

const zones = ["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kolkata"] as const;
const hour = 3_600_000;
const base = Date.UTC(2026, 0, 1);

/** Ranges around the 2026 DST changes of the four zones, so transitions fall inside often. */
const transitions = [
  Date.UTC(2026, 2, 8, 7),
  Date.UTC(2026, 10, 1, 6),
  Date.UTC(2026, 2, 29, 1),
  Date.UTC(2026, 9, 25, 1),
  Date.UTC(2026, 3, 4, 15),
  Date.UTC(2026, 9, 3, 15, 30),
];

const segmentArb = fc.record({ offset: fc.integer({ min: -2 * 24 * hour, max: 4 * 24 * hour }), duration: fc.integer({ min: 1, max: hour }) });

describe("splitting by overlap", () => {
  it("splits a segment into quarter-hour pieces that touch, stay inside their bucket, and sum to its length", () => {
    fc.assert(
      fc.property(fc.integer({ min: base, max: base + 365 * 24 * hour }), fc.integer({ min: 1, max: hour }), (start, duration) => {
        const pieces = splitIntoBuckets(start, start + duration);
        expect(pieces.reduce((t, p) => t + p.ms, 0)).toBe(duration);
        for (const p of pieces) expect(p.ms).toBeGreaterThan(0);
        for (let i = 1; i < pieces.length; i++) expect(pieces[i]!.index).toBe(pieces[i - 1]!.index + 1);
        expect(pieces[0]!.index).toBe(Math.floor(start / bucketMs));
      }),
      { numRuns: 1000 },
    );
  });

  it("conserves every millisecond across any windowing in any zone, DST included: rollups = raw split = overlap", () => {
    fc.assert(
      fc.property(
        fc.constantFrom(...zones),
        fc.constantFrom(...transitions),
        fc.integer({ min: -3 * 96, max: 96 }),
        fc.integer({ min: 1, max: 6 * 96 }),
        fc.constantFrom("hour" as const, "day" as const),
        fc.array(segmentArb, { minLength: 1, maxLength: 40 }),
        (zone, around, startQuarter, quarters, unit, segs) => {
          const from = Math.floor(around / bucketMs) * bucketMs + startQuarter * bucketMs;
          const to = from + quarters * bucketMs;
          const b = windowBoundaries(zone, from, to, unit);
          expect(alignedToBuckets(b)).toBe(true);
          const n = b.length - 1;
          const direct = new Array<number>(n).fill(0);
          const viaBuckets = new Array<number>(n).fill(0);
          let overlapTotal = 0;
          for (const { offset, duration } of segs) {
            const s = from + offset;
            const e = s + duration;
            overlapTotal += Math.max(0, Math.min(e, to) - Math.max(s, from));
            for (const p of splitIntoWindows(s, e, b)) direct[p.index]! += p.ms;
            for (const p of splitIntoBuckets(s, e)) {
              const w = windowIndex(b, p.index * bucketMs);
              if (w >= 0) viaBuckets[w]! += p.ms;
            }
          }
          expect(viaBuckets).toEqual(direct);
          expect(direct.reduce((t, x) => t + x, 0)).toBe(overlapTotal);
          // no window holds more than it is long times the number of segments (no overlap double counting)
          for (let i = 0; i < n; i++) expect(direct[i]).toBeLessThanOrEqual(((b[i + 1] as number) - (b[i] as number)) * segs.length);
        },
      ),
      { numRuns: 500 },
    );
  });

  it("finds the window of an instant, and nothing outside the range", () => {
    const b = [10, 20, 35, 40];
    expect([9, 10, 19, 20, 34, 35, 39, 40].map((t) => windowIndex(b, t))).toEqual([-1, 0, 0, 1, 1, 2, 2, -1]);
    expect(splitIntoWindows(5, 45, b)).toEqual([
      { index: 0, ms: 10 },
      { index: 1, ms: 15 },
      { index: 2, ms: 5 },
    ]);
    expect(splitIntoWindows(40, 50, b)).toEqual([]);
  });
});

// Local hour/day windows in IANA zones (DST, half-hour shifts, +5:30): contiguous, on true local boundaries, right lengths.
import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { formatInZone, localDateKey, localTime, monthRange, offsetMs, parseInstant, startOfLocalDay, windowBoundaries } from "../../billing/zones.ts";
import { alignedToBuckets } from "../../billing/buckets.ts";

const zones = ["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kolkata", "Asia/Kathmandu", "America/St_Johns", "UTC"] as const;
const hour = 3_600_000;
const day = 24 * hour;
const y2020 = Date.UTC(2020, 0, 1);
const y2030 = Date.UTC(2030, 0, 1);

const lengths = (b: number[]) => b.slice(1).map((t, i) => t - (b[i] as number));

describe("windowBoundaries", () => {
  it("cuts any range into contiguous local days that start exactly where a new local date starts", () => {
    fc.assert(
      fc.property(fc.constantFrom(...zones), fc.integer({ min: y2020, max: y2030 }), fc.integer({ min: 1, max: 40 * day }), (zone, from, span) => {
        const b = windowBoundaries(zone, from, from + span, "day");
        expect(b[0]).toBe(from);
        expect(b.at(-1)).toBe(from + span);
        for (const len of lengths(b)) expect(len).toBeGreaterThan(0);
        for (let i = 1; i < b.length - 1; i++) {
          const t = b[i] as number;
          expect(localDateKey(zone, t)).toBeGreaterThan(localDateKey(zone, t - 1)); // a new date starts here
          expect(localDateKey(zone, (b[i + 1] as number) - 1)).toBe(localDateKey(zone, t)); // and lasts the whole window
        }
        // whole days (not the cut first or last) are 23, 23.5, 24, 24.5 or 25 hours long
        for (const len of lengths(b).slice(1, -1)) expect([23, 23.5, 24, 24.5, 25].map((h) => h * hour)).toContain(len);
      }),
      { numRuns: 300 },
    );
  });

  it("cuts any range into local hours: each starts at minute 0 or at an offset change, none longer than an hour", () => {
    fc.assert(
      fc.property(fc.constantFrom(...zones), fc.integer({ min: y2020, max: y2030 }), fc.integer({ min: 1, max: 4 * day }), (zone, from, span) => {
        const b = windowBoundaries(zone, from, from + span, "hour");
        expect(b[0]).toBe(from);
        expect(b.at(-1)).toBe(from + span);
        for (const len of lengths(b)) {
          expect(len).toBeGreaterThan(0);
          expect(len).toBeLessThanOrEqual(hour);
        }
        for (let i = 1; i < b.length - 1; i++) {
          const t = b[i] as number;
          const l = localTime(zone, t);
          const onTheHour = l.minute === 0 && l.second === 0 && l.ms === 0;
          expect(onTheHour || offsetMs(zone, t) !== offsetMs(zone, t - 1)).toBe(true);
        }
      }),
      { numRuns: 300 },
    );
  });

  it("puts every boundary of these zones on a 15-minute UTC edge when the range's ends are on one", () => {
    fc.assert(
      fc.property(
        fc.constantFrom(...zones),
        fc.integer({ min: y2020 / 900_000, max: y2030 / 900_000 }),
        fc.integer({ min: 1, max: 3000 }),
        fc.constantFrom("hour" as const, "day" as const),
        (zone, q, quarters, unit) => {
          const from = q * 900_000;
          expect(alignedToBuckets(windowBoundaries(zone, from, from + quarters * 900_000, unit))).toBe(true);
        },
      ),
      { numRuns: 300 },
    );
  });

  it("knows the DST days: 23 and 25 hours in New York and Berlin, 23.5 and 24.5 on Lord Howe", () => {
    const dayLength = (zone: string, y: number, m: number, d: number) => {
      const next = new Date(Date.UTC(y, m - 1, d + 1));
      return (startOfLocalDay(zone, next.getUTCFullYear(), next.getUTCMonth() + 1, next.getUTCDate()) - startOfLocalDay(zone, y, m, d)) / hour;
    };
    expect(dayLength("America/New_York", 2026, 3, 8)).toBe(23);
    expect(dayLength("America/New_York", 2026, 11, 1)).toBe(25);
    expect(dayLength("America/New_York", 2026, 11, 2)).toBe(24);
    expect(dayLength("Europe/Berlin", 2026, 3, 29)).toBe(23);
    expect(dayLength("Europe/Berlin", 2026, 10, 25)).toBe(25);
    expect(dayLength("Australia/Lord_Howe", 2026, 4, 5)).toBe(24.5);
    expect(dayLength("Australia/Lord_Howe", 2026, 10, 4)).toBe(23.5);
    expect(dayLength("Asia/Kolkata", 2026, 3, 8)).toBe(24);
    expect(new Date(startOfLocalDay("Asia/Kolkata", 2026, 3, 8)).toISOString()).toBe("2026-03-07T18:30:00.000Z");
  });

  it("gives New York's fall-back day 25 hour windows, the two 1 a.m. hours apart", () => {
    const from = startOfLocalDay("America/New_York", 2026, 11, 1);
    const b = windowBoundaries("America/New_York", from, startOfLocalDay("America/New_York", 2026, 11, 2), "hour");
    expect(b.length - 1).toBe(25);
    expect(b.slice(0, 4).map((t) => formatInZone("America/New_York", t))).toEqual([
      "2026-11-01T00:00:00-04:00",
      "2026-11-01T01:00:00-04:00",
      "2026-11-01T01:00:00-05:00",
      "2026-11-01T02:00:00-05:00",
    ]);
    const springDay = windowBoundaries(
      "America/New_York",
      startOfLocalDay("America/New_York", 2026, 3, 8),
      startOfLocalDay("America/New_York", 2026, 3, 9),
      "hour",
    );
    expect(springDay.slice(1, 4).map((t) => formatInZone("America/New_York", t))).toEqual([
      "2026-03-08T01:00:00-05:00",
      "2026-03-08T03:00:00-04:00",
      "2026-03-08T04:00:00-04:00",
    ]);
  });

  it("starts a day whose midnight is skipped at the first instant of that date", () => {
    // Chile moves clocks from 24:00 to 01:00 in September: that Sunday has no midnight
    const zone = "America/Santiago";
    let found = 0;
    for (let d = 1; d <= 14; d++) {
      const start = startOfLocalDay(zone, 2026, 9, d);
      expect(localDateKey(zone, start)).toBe(20260900 + d);
      expect(localDateKey(zone, start - 1)).toBe(d === 1 ? 20260831 : 20260900 + d - 1);
      if (localTime(zone, start).hour === 1) found++;
    }
    expect(found).toBe(1);
  });

  it("gives calendar months in the zone and parses API instants", () => {
    const march = monthRange("America/New_York", "2026-03");
    expect([new Date(march.start).toISOString(), new Date(march.end).toISOString()]).toEqual(["2026-03-01T05:00:00.000Z", "2026-04-01T04:00:00.000Z"]);
    expect(() => monthRange("UTC", "2026-13")).toThrow(/YYYY-MM/);
    expect(parseInstant("2026-03-01", "Asia/Kolkata", "from")).toBe(Date.UTC(2026, 1, 28, 18, 30));
    expect(parseInstant("2026-03-01T10:00:00+05:30", "UTC", "from")).toBe(Date.UTC(2026, 2, 1, 4, 30));
    expect(() => parseInstant("2026-03-01 10:00", "UTC", "from")).toThrow(/ISO 8601/);
    expect(formatInZone("Asia/Kathmandu", Date.UTC(2026, 0, 1, 0, 0, 0, 5))).toBe("2026-01-01T05:45:00.005+05:45");
  });
});

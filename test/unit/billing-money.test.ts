// Money and storage arithmetic: exact integers, one half-up rounding per line, doze prices, hibernation intervals clipped to the period and cut into windows.
import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { defaultRates, formatCents, lineAmountCents, maxDozeGibSecondNanocents, priceOf, roundHalfUp } from "../../billing/money.ts";
import { hibernatedByteMs, hibernatedMsByWindow } from "../../billing/storage.ts";

describe("doze prices", () => {
  it("price dozing vCPUs per vCPU-second (0 by default) and dozing memory per GiB-month: the snapshot rate, or the card's GiB-second price × 2,628,000", () => {
    expect(priceOf(defaultRates, "doze_vcpu")).toBe(0);
    expect(priceOf(defaultRates, "doze_memory")).toBe(defaultRates.snapshotGibMonthNanocents);
    const card = { ...defaultRates, dozeVcpuSecondNanocents: 7, dozeGibSecondNanocents: 100_000 };
    expect(priceOf(card, "doze_vcpu")).toBe(7);
    expect(priceOf(card, "doze_memory")).toBe(100_000 * 2_628_000);
    // 1 GiB dozing for an hour: at 0.0001 ¢ per GiB-second that is 0.36 ¢, the same whether quoted per second or month
    const gibHour = 1024n * 3_600_000n;
    expect(lineAmountCents("doze_memory", 1000n * gibHour, priceOf(card, "doze_memory"))).toBe(lineAmountCents("memory", 1000n * gibHour, 100_000));
    // at the default snapshot rate, 730 GiB-hours of dozing cost what a GiB-month of snapshot does: 10 ¢
    expect(lineAmountCents("doze_memory", 730n * gibHour, priceOf(defaultRates, "doze_memory"))).toBe(10n);
    expect(Number.isSafeInteger(maxDozeGibSecondNanocents * 2_628_000)).toBe(true);
    expect(Number.isSafeInteger((maxDozeGibSecondNanocents + 1) * 2_628_000)).toBe(false);
  });
});

describe("hibernated time by window", () => {
  const ev = (at: number, toState: string) => ({ at, toState, snapshotBytes: undefined });
  it("cuts each hibernation into the windows it overlaps, from the event before the range on, sizes or not", () => {
    const events = [ev(-50, "hibernated"), ev(30, "restoring"), ev(35, "running"), ev(70, "hibernated"), ev(250, "restoring")];
    expect(Object.fromEntries(hibernatedMsByWindow(events, [0, 50, 100, 200]))).toEqual({ 0: 30, 1: 30, 2: 100 });
    // the last hibernation lasts to the end of the range
    expect(Object.fromEntries(hibernatedMsByWindow([ev(10, "hibernated")], [0, 5, 20, 40]))).toEqual({ 1: 10, 2: 20 });
    expect(hibernatedMsByWindow([ev(10, "hibernated"), ev(10, "restoring")], [0, 100]).size).toBe(0);
    expect(hibernatedMsByWindow([ev(500, "hibernated")], [0, 100]).size).toBe(0);
  });

  it("conserves every millisecond: the windows sum to the hibernation inside the range", () => {
    fc.assert(
      fc.property(
        fc.uniqueArray(fc.integer({ min: -1000, max: 3000 }), { minLength: 1, maxLength: 12 }),
        fc.uniqueArray(fc.integer({ min: 0, max: 2000 }), { minLength: 2, maxLength: 10 }),
        (times, cuts) => {
          const events = [...times].sort((a, b) => a - b).map((at, i) => ev(at, i % 2 === 0 ? "hibernated" : "running"));
          const b = [...cuts].sort((a, c) => a - c);
          const sum = [...hibernatedMsByWindow(events, b).values()].reduce((t, x) => t + x, 0);
          let want = 0;
          events.forEach((e, i) => {
            if (e.toState !== "hibernated") return;
            const end = Math.min(events[i + 1]?.at ?? (b.at(-1) as number), b.at(-1) as number);
            want += Math.max(0, end - Math.max(e.at, b[0] as number));
          });
          expect(sum).toBe(want);
        },
      ),
    );
  });
});

describe("money", () => {
  it("rounds half up, exactly, for any non-negative fraction", () => {
    expect([roundHalfUp(5n, 10n), roundHalfUp(4n, 10n), roundHalfUp(15n, 10n), roundHalfUp(14999n, 10000n), roundHalfUp(0n, 7n)]).toEqual([1n, 0n, 2n, 1n, 0n]);
    fc.assert(
      fc.property(fc.bigInt({ min: 0n, max: 10n ** 30n }), fc.bigInt({ min: 1n, max: 10n ** 20n }), (num, den) => {
        const r = roundHalfUp(num, den);
        // r is the nearest integer, ties going up: |num/den - r| ≤ 1/2, and exactly 1/2 only below
        expect(2n * num - 2n * r * den).toBeLessThan(den);
        expect(2n * num - 2n * r * den).toBeGreaterThanOrEqual(-den);
      }),
    );
  });

  it("prices each resource in its unit: vCPU-ms per vCPU-second, MiB-ms per GiB-second, byte-ms per 730-hour GiB-month", () => {
    // 3600 vCPU-seconds at 0.001 ¢ = 3.6 ¢ → 4 ¢
    expect(lineAmountCents("vcpu", 3_600_000n, defaultRates.vcpuSecondNanocents)).toBe(4n);
    // 1 GiB for an hour at 0.0001 ¢/GiB-s = 0.36 ¢ → 0 ¢
    expect(lineAmountCents("memory", 1024n * 3_600_000n, defaultRates.gibSecondNanocents)).toBe(0n);
    // 1 GiB for 730 hours at 10 ¢ = 10 ¢
    expect(lineAmountCents("snapshot_storage", 1024n ** 3n * 730n * 3_600_000n, defaultRates.snapshotGibMonthNanocents)).toBe(10n);
    // 500 vCPU-seconds at 0.001 ¢ is exactly half a cent: up; a millisecond less: down
    expect(lineAmountCents("vcpu", 500_000n, 1_000_000)).toBe(1n);
    expect(lineAmountCents("vcpu", 499_999n, 1_000_000)).toBe(0n);
    expect(formatCents(12345n)).toBe("123.45");
    expect(formatCents(5)).toBe("0.05");
  });
});

describe("hibernated storage", () => {
  const h = 3_600_000;
  it("holds each snapshot's bytes from its hibernation to the next transition, clipped to the period", () => {
    const events = [
      { at: -5 * h, toState: "hibernated", snapshotBytes: 100 }, // before the period: counts from its start
      { at: 2 * h, toState: "restoring", snapshotBytes: undefined },
      { at: 2 * h + 1000, toState: "running", snapshotBytes: undefined },
      { at: 3 * h, toState: "snapshotting", snapshotBytes: undefined },
      { at: 3 * h + 500, toState: "hibernated", snapshotBytes: 300 }, // until the period ends
    ];
    expect(hibernatedByteMs(events, 0, 10 * h)).toBe(100n * BigInt(2 * h) + 300n * BigInt(7 * h - 500));
    expect(hibernatedByteMs(events, 0, h)).toBe(100n * BigInt(h));
    expect(hibernatedByteMs([{ at: 0, toState: "hibernated", snapshotBytes: undefined }], 0, h)).toBe(0n);
    expect(hibernatedByteMs([{ at: 0, toState: "destroyed", snapshotBytes: 5 }], 0, h)).toBe(0n);
  });
});

describe("parseUtcInstant", () => {
  it("agrees with Date.parse on every valid UTC instant and refuses what is not one", async () => {
    const { parseUtcInstant } = await import("../../billing/validate.ts");
    fc.assert(
      fc.property(fc.integer({ min: Date.UTC(1970, 0, 1), max: Date.UTC(2200, 0, 1) }), fc.integer({ min: 0, max: 3 }), (t, digits) => {
        const iso = new Date(t).toISOString(); // …:SS.mmmZ
        const s = digits === 3 ? iso : digits === 0 ? `${iso.slice(0, 19)}Z` : `${iso.slice(0, 20 + digits)}Z`;
        expect(parseUtcInstant(s)).toBe(Date.parse(s));
      }),
      { numRuns: 2000 },
    );
    for (const bad of [
      "2026-02-29T00:00:00Z",
      "2026-04-31T00:00:00Z",
      "2026-01-01T24:00:00Z",
      "2026-01-01T00:60:00Z",
      "2026-01-01 00:00:00Z",
      "2026-01-01T00:00:00",
      "2026-01-01T00:00:00.Z",
      "2026-01-01T00:00:00.1234Z",
      "2026-01-01T00:00:00+00:00",
      "1969-12-31T23:59:59Z",
      "２026-01-01T00:00:00Z",
      17,
      null,
    ]) {
      expect(parseUtcInstant(bad), String(bad)).toBeUndefined();
    }
    expect(parseUtcInstant("2024-02-29T12:00:00.5Z")).toBe(Date.UTC(2024, 1, 29, 12, 0, 0, 500));
  });
});

// How much of a run desktop viewers covered (billing/runs.ts `coveredMs`): spans clipped to the run, overlaps counted once.
import { describe, expect, it } from "vitest";
import { coveredMs } from "../../billing/runs.ts";

describe("coveredMs", () => {
  it("clips spans to the run and counts overlapping viewers once", () => {
    expect(coveredMs([], 0, 100)).toBe(0);
    expect(coveredMs([{ from: 10, until: 20 }], 0, 100)).toBe(10);
    expect(coveredMs([{ from: -50, until: 30 }], 0, 100)).toBe(30); // opened before the run woke
    expect(coveredMs([{ from: 90, until: 500 }], 0, 100)).toBe(10); // still open when it slept
    expect(
      coveredMs(
        [
          { from: 10, until: 40 },
          { from: 20, until: 30 },
          { from: 35, until: 60 },
        ],
        0,
        100,
      ),
    ).toBe(50); // two viewers at once: 10..60 once
    expect(
      coveredMs(
        [
          { from: 70, until: 80 },
          { from: 10, until: 20 },
        ],
        0,
        100,
      ),
    ).toBe(20); // in any order
    expect(coveredMs([{ from: 200, until: 300 }], 0, 100)).toBe(0);
  });
});

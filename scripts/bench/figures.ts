// What the benchmarks share to report their figures: nearest-rank percentiles, the middle value, rounding, the RESULT line.

/** The nearest-rank percentile `p` (in (0, 100]) of `xs`, in any order; NaN when there is none. */
export function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return NaN;
  const sorted = [...xs].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

/** The value at half the length of the sorted values: the middle one, or the upper of the two middle ones (bench:billing's median). */
export const median = (xs: readonly number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

/** `x` rounded to `digits` decimals. */
export const round = (x: number, digits: number) => Math.round(x * 10 ** digits) / 10 ** digits;

/** The line every benchmark ends with: `RESULT {json}`, on stdout. */
export function printResult(result: object): void {
  console.log(`RESULT ${JSON.stringify(result)}`);
}

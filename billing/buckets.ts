// Pure splitting of metered intervals by overlap: into 15-minute UTC buckets (rollups) and into report windows.

/** Rollup granularity. Every IANA offset in use today is a multiple of 15 minutes, so local hours and days are unions of buckets. */
export const bucketMs = 15 * 60_000;

export interface Interval {
  start: number;
  end: number;
}

export interface Piece {
  /** Index of the bucket (start / bucketMs) or window the piece falls in. */
  index: number;
  ms: number;
}

/** The overlap of `[start, end)` with every 15-minute UTC bucket it touches; the pieces sum to `end - start`. */
export function splitIntoBuckets(start: number, end: number): Piece[] {
  const out: Piece[] = [];
  if (end <= start) return out;
  for (let b = Math.floor(start / bucketMs); b * bucketMs < end; b++) {
    const ms = Math.min(end, (b + 1) * bucketMs) - Math.max(start, b * bucketMs);
    if (ms > 0) out.push({ index: b, ms });
  }
  return out;
}

/** Index `i` of the window `[boundaries[i], boundaries[i+1])` that contains `t`, or -1 when outside. */
export function windowIndex(boundaries: readonly number[], t: number): number {
  let lo = 0;
  let hi = boundaries.length - 1;
  if (hi < 1 || t < (boundaries[0] as number) || t >= (boundaries[hi] as number)) return -1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if ((boundaries[mid] as number) <= t) lo = mid;
    else hi = mid;
  }
  return lo;
}

/** The overlap of `[start, end)` with each window of `boundaries` (contiguous, ascending); outside parts are dropped. */
export function splitIntoWindows(start: number, end: number, boundaries: readonly number[]): Piece[] {
  const out: Piece[] = [];
  const first = boundaries[0];
  const last = boundaries[boundaries.length - 1];
  if (first === undefined || last === undefined || end <= first || start >= last || end <= start) return out;
  let i = windowIndex(boundaries, Math.max(start, first));
  for (; i >= 0 && i < boundaries.length - 1; i++) {
    const ws = boundaries[i] as number;
    const we = boundaries[i + 1] as number;
    if (ws >= end) break;
    const ms = Math.min(end, we) - Math.max(start, ws);
    if (ms > 0) out.push({ index: i, ms });
  }
  return out;
}

/** True when every boundary lies on a 15-minute UTC bucket edge, so bucket rollups answer the windows exactly. */
export function alignedToBuckets(boundaries: readonly number[]): boolean {
  return boundaries.every((b) => b % bucketMs === 0);
}

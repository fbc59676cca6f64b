// Time billed once per agent: the part of a new segment that segments received earlier (any host) already billed is clipped off.

/** A half-open `[start, end)` in epoch ms. */
export type Span = readonly [number, number];

/** A stored segment of the agent that already billed its time. */
export interface BilledSpan {
  hostId: string;
  startMs: number;
  endMs: number;
}

/** A segment being written now. */
export interface NewSpan extends BilledSpan {
  id: string;
}

/** What a new segment bills when part of it was covered: `pieces` (possibly none) and the ms left out. */
export interface Clip {
  pieces: Span[];
  overlapMs: number;
  /** Hosts whose segments had billed the overlapping time (the segment's own host too, for a host that reported twice). */
  coveredBy: string[];
}

/**
 * For one agent: clips each of `incoming` (in arrival order) by the union of `billed` and the ones before it in
 * `incoming`, so the whole bills exactly the union of every span. Returns the clipped segments only, by id; an empty
 * map (the common case: nothing overlaps, checked by one sort) means every segment bills all of its span.
 */
export function clipAgainst(billed: readonly BilledSpan[], incoming: readonly NewSpan[]): Map<string, Clip> {
  const out = new Map<string, Clip>();
  if (!overlapsAny(billed, incoming)) return out;
  const covered = union(billed.map((b) => [b.startMs, b.endMs] as const));
  const seen: BilledSpan[] = [...billed];
  for (const s of incoming) {
    const pieces = uncovered(covered, s.startMs, s.endMs);
    const billedMs = pieces.reduce((n, [a, b]) => n + (b - a), 0);
    const overlapMs = s.endMs - s.startMs - billedMs;
    if (overlapMs > 0) {
      const hosts = new Set(seen.filter((b) => b.startMs < s.endMs && b.endMs > s.startMs).map((b) => b.hostId));
      out.set(s.id, { pieces, overlapMs, coveredBy: [...hosts].sort() });
    }
    add(covered, s.startMs, s.endMs);
    seen.push(s);
  }
  return out;
}

/** True when any two of the spans overlap (touching ends do not). */
function overlapsAny(billed: readonly BilledSpan[], incoming: readonly NewSpan[]): boolean {
  if (billed.length + incoming.length < 2) return false;
  const all: BilledSpan[] = billed.length === 0 ? [...incoming] : [...billed, ...incoming];
  all.sort((a, b) => a.startMs - b.startMs);
  let reach = -Infinity;
  for (const s of all) {
    if (s.startMs < reach) return true;
    reach = Math.max(reach, s.endMs);
  }
  return false;
}

/** Sorted, disjoint, non-touching spans covering exactly the union of `spans`. */
function union(spans: Span[]): [number, number][] {
  const sorted = [...spans].sort((a, b) => a[0] - b[0]);
  const out: [number, number][] = [];
  for (const [a, b] of sorted) {
    const last = out[out.length - 1];
    if (last && a <= last[1]) last[1] = Math.max(last[1], b);
    else out.push([a, b]);
  }
  return out;
}

/** Index of the first span of `covered` that ends after `t`. */
function firstEndingAfter(covered: readonly [number, number][], t: number): number {
  let lo = 0;
  let hi = covered.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if ((covered[mid] as [number, number])[1] <= t) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** The parts of `[start, end)` no span of `covered` holds, in order. */
function uncovered(covered: readonly [number, number][], start: number, end: number): Span[] {
  const out: Span[] = [];
  let at = start;
  for (let i = firstEndingAfter(covered, start); i < covered.length && at < end; i++) {
    const [a, b] = covered[i] as [number, number];
    if (a >= end) break;
    if (a > at) out.push([at, a]);
    at = Math.max(at, b);
  }
  if (at < end) out.push([at, end]);
  return out;
}

/** Adds `[start, end)` to `covered`, merging the spans it touches. */
function add(covered: [number, number][], start: number, end: number): void {
  const i = firstEndingAfter(covered, start - 1); // a span ending exactly at `start` touches: merge it too
  let j = i;
  let a = start;
  let b = end;
  while (j < covered.length && (covered[j] as [number, number])[0] <= end) {
    const span = covered[j] as [number, number];
    a = Math.min(a, span[0]);
    b = Math.max(b, span[1]);
    j++;
  }
  covered.splice(i, j - i, [a, b]);
}

/** Postgres' text form of an `int8multirange` (`{}` when nothing is billed). */
export function multirangeText(pieces: readonly Span[]): string {
  return `{${pieces.map(([a, b]) => `[${a},${b})`).join(",")}}`;
}

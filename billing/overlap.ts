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

/** A row of `meter_coverage`: a merged span of an agent's stored segments and the hosts that reported it. */
export interface CoverSpan {
  startMs: number;
  endMs: number;
  hostIds: string[];
}

/** The coverage rows as spans `clipAgainst` takes: one per host, so a warning can name every host that billed a span. */
export function billedSpansOf(cover: readonly CoverSpan[]): BilledSpan[] {
  return cover.flatMap((c) => c.hostIds.map((hostId) => ({ hostId, startMs: c.startMs, endMs: c.endMs })));
}

/**
 * One agent's coverage after `written` joins the rows `read` (every row that overlaps or touches the batch's span):
 * the merged rows, and of them the ones to write (new, or changed) and the starts of the read rows merged away.
 */
export function mergeCoverage(read: readonly CoverSpan[], written: readonly BilledSpan[]): { upsert: CoverSpan[]; removed: number[] } {
  const all: CoverSpan[] = [...read, ...written.map((w) => ({ startMs: w.startMs, endMs: w.endMs, hostIds: [w.hostId] }))];
  all.sort((a, b) => a.startMs - b.startMs);
  const merged: { startMs: number; endMs: number; hosts: Set<string> }[] = [];
  for (const c of all) {
    const last = merged[merged.length - 1];
    if (last && c.startMs <= last.endMs) {
      last.endMs = Math.max(last.endMs, c.endMs);
      for (const h of c.hostIds) last.hosts.add(h);
    } else merged.push({ startMs: c.startMs, endMs: c.endMs, hosts: new Set(c.hostIds) });
  }
  const before = new Map(read.map((r) => [r.startMs, r]));
  const upsert: CoverSpan[] = [];
  for (const m of merged) {
    const hostIds = [...m.hosts].sort();
    const old = before.get(m.startMs);
    if (!old || old.endMs !== m.endMs || old.hostIds.length !== hostIds.length || old.hostIds.some((h) => !m.hosts.has(h)))
      upsert.push({ startMs: m.startMs, endMs: m.endMs, hostIds });
  }
  const starts = new Set(merged.map((m) => m.startMs));
  return { upsert, removed: read.filter((r) => !starts.has(r.startMs)).map((r) => r.startMs) };
}

/** Postgres' text form of an `int8multirange` (`{}` when nothing is billed). */
export function multirangeText(pieces: readonly Span[]): string {
  return `{${pieces.map(([a, b]) => `[${a},${b})`).join(",")}}`;
}

// The plots' geometry, without drawing: a value axis rounded up to 1, 2 or 5 × 10ⁿ, time windows as bars, time labels.

/** A usage window and its value (active seconds, or cost in micro-units). */
export interface PlotPoint {
  /** `[start, end)`, ms since the epoch. */
  start: number;
  end: number;
  value: number;
}

export interface ValueScale {
  /** The top of the axis: ≥ the largest value, a multiple of `step`. */
  top: number;
  step: number;
  ticks: number[];
}

/** The smallest 1, 2 or 5 × 10ⁿ at or above `x` (x > 0). */
export function niceStep(x: number): number {
  const exp = Math.floor(Math.log10(x));
  const base = 10 ** exp;
  for (const m of [1, 2, 5, 10]) {
    // a little slack: 0.3 / 0.1 is 2.9999999999999996
    if (m * base >= x * (1 - 1e-9)) return m * base;
  }
  return 10 * base;
}

/**
 * The value axis for a largest value `max`: about `count` steps of a nice size from 0; with `integer`, steps of at
 * least 1 (values counted in whole units). An empty or all-zero plot gets the axis 0…1.
 */
export function valueScale(max: number, count = 4, opts: { integer?: boolean } = {}): ValueScale {
  const target = Number.isFinite(max) && max > 0 ? max : 1;
  let step = niceStep(target / count);
  if (opts.integer) step = Math.max(1, Math.round(step));
  const steps = Math.max(1, Math.ceil(target / step - 1e-9));
  const top = step * steps;
  const ticks = Array.from({ length: steps + 1 }, (_, i) => Number((i * step).toPrecision(12)));
  return { top, step, ticks };
}

export interface Bar {
  x: number;
  y: number;
  width: number;
  height: number;
  point: PlotPoint;
}

/**
 * One bar per point inside `[from, to)` on a plot `width` × `height` (y grows downwards, 0 at the bottom): x from the
 * window's start, width from its length less a 1-px gap (at least 1 px), height `value / top` of the plot.
 */
export function bars(points: readonly PlotPoint[], domain: { from: number; to: number }, size: { width: number; height: number }, top: number): Bar[] {
  const span = domain.to - domain.from;
  if (!(span > 0) || !(top > 0)) return [];
  const x = (t: number) => ((Math.min(Math.max(t, domain.from), domain.to) - domain.from) / span) * size.width;
  const out: Bar[] = [];
  for (const p of points) {
    if (p.end <= domain.from || p.start >= domain.to) continue;
    const x0 = x(p.start);
    const x1 = x(p.end);
    const height = (Math.min(Math.max(p.value, 0), top) / top) * size.height;
    out.push({ x: x0, y: size.height - height, width: Math.max(1, x1 - x0 - 1), height, point: p });
  }
  return out;
}

/** A label on the time axis: where (px) and what. */
export interface TimeTick {
  x: number;
  label: string;
}

const hourMs = 3_600_000;

/**
 * Labels for the time axis of `[from, to)` on `width` px: local hours (`14:00`) in steps of 1, 3, 6 or 12 hours for
 * hourly plots, local dates (`07-07`) every 1, 2, 5, 7 or 14 days for daily ones — the smallest step that gives at
 * most `maxLabels`. Instants are cut in the zone the `local` function reads them in (the browser's by default).
 */
export function timeTicks(
  domain: { from: number; to: number },
  width: number,
  unit: "hour" | "day",
  maxLabels = 8,
  local: (t: number) => { hour: number; month: number; day: number } = (t) => {
    const d = new Date(t);
    return { hour: d.getHours(), month: d.getMonth() + 1, day: d.getDate() };
  },
): TimeTick[] {
  const span = domain.to - domain.from;
  if (!(span > 0)) return [];
  const pad = (n: number) => String(n).padStart(2, "0");
  const candidates: { t: number; label: string; hour: number; day: number }[] = [];
  // every local hour (or midnight) boundary in the range: found by stepping through UTC hours (zones shift by whole or half hours at most a few times)
  for (let t = Math.ceil(domain.from / (hourMs / 4)) * (hourMs / 4); t < domain.to; t += hourMs / 4) {
    const l = local(t);
    const prev = local(t - hourMs / 4);
    const hourEdge = l.hour !== prev.hour;
    const dayEdge = l.day !== prev.day;
    if (unit === "hour" ? hourEdge : dayEdge)
      candidates.push({ t, label: unit === "hour" ? `${pad(l.hour)}:00` : `${pad(l.month)}-${pad(l.day)}`, hour: l.hour, day: l.day });
  }
  const steps = unit === "hour" ? [1, 3, 6, 12, 24] : [1, 2, 5, 7, 14, 28];
  for (const step of steps) {
    const picked = candidates.filter((c, i) => (unit === "hour" ? c.hour % step === 0 : i % step === 0));
    if (picked.length <= maxLabels || step === steps[steps.length - 1]) {
      return picked.map((c) => ({ x: ((c.t - domain.from) / span) * width, label: c.label }));
    }
  }
  return [];
}

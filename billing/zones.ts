// IANA time-zone arithmetic without a library: offsets, local dates, and hour/day window boundaries (DST included).
import { AppError } from "../lib/errors.ts";

const hourMs = 3_600_000;
const dayMs = 86_400_000;

const formatters = new Map<string, Intl.DateTimeFormat>();

function formatter(zone: string): Intl.DateTimeFormat {
  let f = formatters.get(zone);
  if (!f) {
    f = new Intl.DateTimeFormat("en-US", {
      timeZone: zone,
      hourCycle: "h23",
      year: "numeric",
      month: "numeric",
      day: "numeric",
      hour: "numeric",
      minute: "numeric",
      second: "numeric",
      era: "short",
    });
    formatters.set(zone, f);
  }
  return f;
}

/** Throws `bad_request` unless `zone` is an IANA zone name this runtime knows. */
export function assertZone(zone: string): string {
  if (typeof zone !== "string" || zone.length === 0 || zone.length > 64)
    throw new AppError("bad_request", "time zone must be an IANA zone name, e.g. Europe/Berlin");
  try {
    formatter(zone);
  } catch {
    throw new AppError("bad_request", `unknown time zone "${zone}"`);
  }
  return zone;
}

export interface LocalTime {
  year: number;
  month: number;
  day: number;
  hour: number;
  minute: number;
  second: number;
  ms: number;
}

/** Wall-clock fields of instant `t` (ms since epoch) in `zone`. */
export function localTime(zone: string, t: number): LocalTime {
  const parts = formatter(zone).formatToParts(new Date(t));
  let year = 0;
  let month = 0;
  let day = 0;
  let hour = 0;
  let minute = 0;
  let second = 0;
  let bc = false;
  for (const p of parts) {
    if (p.type === "year") year = Number(p.value);
    else if (p.type === "month") month = Number(p.value);
    else if (p.type === "day") day = Number(p.value);
    else if (p.type === "hour") hour = Number(p.value);
    else if (p.type === "minute") minute = Number(p.value);
    else if (p.type === "second") second = Number(p.value);
    else if (p.type === "era") bc = p.value.startsWith("B");
  }
  return { year: bc ? 1 - year : year, month, day, hour, minute, second, ms: ((t % 1000) + 1000) % 1000 };
}

/** The local wall time of `t` written as if it were UTC (ms): handy for arithmetic on local fields. */
function localAsUtc(zone: string, t: number): number {
  const l = localTime(zone, t);
  const d = new Date(0);
  d.setUTCFullYear(l.year, l.month - 1, l.day);
  d.setUTCHours(l.hour, l.minute, l.second, l.ms);
  return d.getTime();
}

/** UTC offset of `zone` at instant `t`, in ms (local = UTC + offset). */
export function offsetMs(zone: string, t: number): number {
  return localAsUtc(zone, t) - t;
}

/**
 * The first instant after `t` and at or before `limit` at which the zone's offset changes, if any.
 * Samples every 6 hours (no zone changes its offset twice within 6 hours) and bisects to the millisecond.
 */
export function nextTransition(zone: string, t: number, limit: number): number | undefined {
  const step = 6 * hourMs;
  let lo = t;
  let loOff = offsetMs(zone, lo);
  while (lo < limit) {
    const hi = Math.min(lo + step, limit);
    const hiOff = offsetMs(zone, hi);
    if (hiOff !== loOff) {
      // offset(a) = loOff, offset(b) ≠ loOff: bisect for the first instant with a different offset
      let a = lo;
      let b = hi;
      while (b - a > 1) {
        const m = Math.floor((a + b) / 2);
        if (offsetMs(zone, m) === loOff) a = m;
        else b = m;
      }
      return b;
    }
    lo = hi;
    loOff = hiOff;
  }
  return undefined;
}

/** Local calendar date of `t` in `zone` as a sortable number yyyymmdd. */
export function localDateKey(zone: string, t: number): number {
  const l = localTime(zone, t);
  return l.year * 10_000 + l.month * 100 + l.day;
}

/** `[from, to)` cut where the zone's offset changes, each piece with its constant offset. */
export function offsetPieces(zone: string, from: number, to: number): { start: number; end: number; off: number }[] {
  const pieces: { start: number; end: number; off: number }[] = [];
  let t = from;
  while (t < to) {
    const off = offsetMs(zone, t);
    const transition = nextTransition(zone, t, to);
    const end = transition ?? to;
    pieces.push({ start: t, end, off });
    t = end;
  }
  return pieces;
}

/** yyyymmdd of the UTC date of `t` (with an offset added: the local date). */
function dateKey(t: number): number {
  const d = new Date(t);
  return d.getUTCFullYear() * 10_000 + (d.getUTCMonth() + 1) * 100 + d.getUTCDate();
}

/**
 * Boundaries of the local days (or hours) of `zone` that cut `[from, to)`: `[from, b1, …, to]`.
 * A day starts at the first instant its local date is reached, so a day is 23, 24 or 25 hours long
 * (23.5/24.5 on Lord Howe), and a fall-back at midnight lengthens the day instead of repeating a date.
 * An hour starts when the local hour or the offset changes, so the two 1 a.m. hours of a fall-back are
 * two windows, and an hour cut short by a spring-forward is a shorter window. Within a stretch of constant
 * offset the boundaries are plain arithmetic; the zone database is asked only where the offset changes.
 */
export function windowBoundaries(zone: string, from: number, to: number, unit: "hour" | "day"): number[] {
  if (to <= from) return [from];
  const size = unit === "hour" ? hourMs : dayMs;
  const out = [from];
  let maxDate: number | undefined;
  for (const p of offsetPieces(zone, from, to)) {
    if (maxDate === undefined) maxDate = dateKey(from + p.off);
    else if (unit === "hour")
      out.push(p.start); // the offset changed: a new local hour starts here
    else {
      const date = dateKey(p.start + p.off);
      if (date > maxDate) {
        out.push(p.start);
        maxDate = date;
      }
    }
    const intoUnit = (((p.start + p.off) % size) + size) % size;
    for (let b = p.start + (size - intoUnit); b < p.end; b += size) {
      if (unit === "hour") out.push(b);
      else {
        const date = dateKey(b + p.off);
        if (date > maxDate) {
          out.push(b);
          maxDate = date;
        }
      }
    }
  }
  out.push(to);
  return out;
}

/** The first instant of local date `year-month-day` in `zone` (local midnight, or later when midnight was skipped). */
export function startOfLocalDay(zone: string, year: number, month: number, day: number): number {
  const d = new Date(0);
  d.setUTCFullYear(year, month - 1, day);
  const localMidnight = d.getTime();
  const target = year * 10_000 + month * 100 + day;
  // every instant whose local time is that midnight satisfies t = localMidnight - offset(t)
  const candidates = new Set<number>();
  for (const probe of [localMidnight - dayMs, localMidnight, localMidnight + dayMs]) candidates.add(localMidnight - offsetMs(zone, probe));
  let best: number | undefined;
  for (const c of candidates) if (localAsUtc(zone, c) === localMidnight && (best === undefined || c < best)) best = c;
  if (best !== undefined) {
    // an earlier instant can also belong to that date when a fall-back at midnight repeats it: take the first
    const prevDay = best - 1;
    if (localDateKey(zone, prevDay) < target) return best;
  }
  // midnight did not exist (spring-forward at 00:00) or is repeated: the day starts at the first instant of the date
  let lo = localMidnight - 15 * hourMs - dayMs;
  let hi = localMidnight + 15 * hourMs;
  while (localDateKey(zone, lo) >= target) lo -= dayMs;
  while (localDateKey(zone, hi) < target) hi += dayMs;
  while (hi - lo > 1) {
    const m = Math.floor((lo + hi) / 2);
    if (localDateKey(zone, m) >= target) hi = m;
    else lo = m;
  }
  return hi;
}

/** `[start, end)` of calendar month `YYYY-MM` in `zone`. */
export function monthRange(zone: string, month: string): { start: number; end: number } {
  const m = /^(\d{4})-(\d{2})$/.exec(month);
  const year = Number(m?.[1]);
  const mon = Number(m?.[2]);
  if (!m || mon < 1 || mon > 12 || year < 1970 || year > 9999) throw new AppError("bad_request", `month must be YYYY-MM, got "${month}"`);
  const next = mon === 12 ? { y: year + 1, m: 1 } : { y: year, m: mon + 1 };
  return { start: startOfLocalDay(zone, year, mon, 1), end: startOfLocalDay(zone, next.y, next.m, 1) };
}

/** The `YYYY-MM` month that contains instant `t` in `zone`. */
export function monthOf(zone: string, t: number): string {
  const l = localTime(zone, t);
  return `${String(l.year).padStart(4, "0")}-${String(l.month).padStart(2, "0")}`;
}

const pad = (n: number, w = 2) => String(Math.abs(n)).padStart(w, "0");

/** ISO 8601 with the zone's offset, e.g. `2026-03-08T03:00:00-04:00` (milliseconds only when not zero). */
export function formatInZone(zone: string, t: number): string {
  const l = localTime(zone, t);
  const off = Math.round(offsetMs(zone, t) / 1000);
  const sign = off < 0 ? "-" : "+";
  const offH = Math.floor(Math.abs(off) / 3600);
  const offM = Math.floor((Math.abs(off) % 3600) / 60);
  const ms = l.ms ? `.${pad(l.ms, 3)}` : "";
  return `${pad(l.year, 4)}-${pad(l.month)}-${pad(l.day)}T${pad(l.hour)}:${pad(l.minute)}:${pad(l.second)}${ms}${sign}${pad(offH)}:${pad(offM)}`;
}

/** The years an API instant may be written in: zone arithmetic, Postgres timestamps and ISO output all hold there. */
export const instantYears = { first: 1970, last: 9999 } as const;

const instantPattern = /^(\d{4})-(\d{2})-(\d{2})(?:T(\d{2}):(\d{2})(?::(\d{2})(\.\d{1,3})?)?(Z|[+-](\d{2}):(\d{2})))?$/;

function daysInMonth(year: number, month: number): number {
  return month === 2 ? (year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0) ? 29 : 28) : [4, 6, 9, 11].includes(month) ? 30 : 31;
}

/** An API instant as written: a local date (its day starts in the caller's zone) or an absolute time (ms). */
export type WrittenInstant = { date: { year: number; month: number; day: number } } | { at: number };

/**
 * Reads an API instant field by field, or says what is wrong with it: an ISO 8601 timestamp with `Z` or an offset, or a
 * bare date `YYYY-MM-DD`; years 1970 to 9999, dates the calendar has, hours 00–23 (Date.parse would roll `02-30`
 * into March and take `24:00`).
 */
export function readInstant(value: string): WrittenInstant | { problem: string } {
  const m = instantPattern.exec(value);
  const form = `an ISO 8601 instant with Z or an offset, or a date YYYY-MM-DD; got "${value.slice(0, 40)}"`;
  if (!m) return { problem: `must be ${form}` };
  const [year, month, day] = [Number(m[1]), Number(m[2]), Number(m[3])];
  if (year < instantYears.first || year > instantYears.last)
    return { problem: `must be in the years ${instantYears.first} to ${instantYears.last}; got "${value.slice(0, 40)}"` };
  if (month < 1 || month > 12 || day < 1 || day > daysInMonth(year, month))
    return { problem: `names a day the calendar does not have: "${value.slice(0, 40)}"` };
  if (m[4] === undefined) return { date: { year, month, day } };
  if (Number(m[4]) > 23 || Number(m[5]) > 59 || Number(m[6] ?? 0) > 59 || Number(m[9] ?? 0) > 23 || Number(m[10] ?? 0) > 59)
    return { problem: `has a time out of range: "${value.slice(0, 40)}"` };
  return { at: Date.parse(value) };
}

/**
 * Parses an API instant (see `readInstant`): a bare date `YYYY-MM-DD` means the start of that local day in `zone`.
 * Throws `bad_request` naming `name` for anything else.
 */
export function parseInstant(value: string, zone: string, name: string): number {
  const read = readInstant(value);
  if ("problem" in read) throw new AppError("bad_request", `${name} ${read.problem}`);
  return "at" in read ? read.at : startOfLocalDay(zone, read.date.year, read.date.month, read.date.day);
}

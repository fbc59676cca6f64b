// How the dashboard writes times and durations (`now` is passed in, so the same input always reads the same).

/** `340 ms`, `4.2 s`, `3 min 5 s`, `2 h 10 min`. */
export function formatMs(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(ms < 10_000 ? 1 : 0)} s`;
  const s = Math.round(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  const m = Math.floor(s / 60);
  if (m < 48 * 60) return `${Math.floor(m / 60)} h ${m % 60} min`;
  return `${Math.floor(m / 1440)} d ${Math.floor((m % 1440) / 60)} h`;
}

/** How long ago an ISO instant was: `12 s ago`, `never` for null. */
export function ago(iso: string | null, now: number): string {
  if (iso === null) return "never";
  const t = Date.parse(iso);
  if (!Number.isFinite(t)) return iso;
  const d = now - t;
  return d < 1000 ? "just now" : `${formatMs(d)} ago`;
}

/** An instant in the browser's zone: `2026-07-07 17:47:03`. */
export function localTime(iso: string): string {
  const t = new Date(iso);
  if (!Number.isFinite(t.getTime())) return iso;
  const p = (n: number) => String(n).padStart(2, "0");
  return `${t.getFullYear()}-${p(t.getMonth() + 1)}-${p(t.getDate())} ${p(t.getHours())}:${p(t.getMinutes())}:${p(t.getSeconds())}`;
}

/** The browser's IANA zone, which the usage plots are cut in. */
export function browserZone(): string {
  return Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
}

/** `YYYY-MM-DD` of a local date. */
export function localDate(d: Date): string {
  const p = (n: number) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}`;
}

/** `YYYY-MM` of the month `now` is in, locally. */
export function localMonth(now: number): string {
  return localDate(new Date(now)).slice(0, 7);
}

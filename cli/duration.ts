// Durations on the command line (`30s`, `5m`, `1h30m`, `250ms`; a bare number is seconds) and durations printed.
import { usageError } from "./exit.ts";

const unitMs: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** Milliseconds of `30s`, `5m`, `1h30m`, `250ms`, `2d` or `45` (seconds); a usage error (exit 2) names `what` otherwise. */
export function parseDuration(raw: string, what: string): number {
  const text = raw.trim();
  if (/^\d+(\.\d+)?$/.test(text)) return Math.round(Number(text) * 1000);
  const parts = [...text.matchAll(/(\d+(?:\.\d+)?)(ms|s|m|h|d)/g)];
  if (parts.length === 0 || parts.map((p) => p[0]).join("") !== text) throw usageError(`${what}: "${raw}" is no duration (like 30s, 5m, 1h30m, 250ms)`);
  return Math.round(parts.reduce((sum, p) => sum + Number(p[1]) * unitMs[p[2]!]!, 0));
}

/** `850 ms`, `3.4 s`, `2 min 5 s`, `1 h 3 min`. */
export function formatDuration(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  const s = Math.round(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min${s % 60 ? ` ${s % 60} s` : ""}`;
  const m = Math.round(s / 60);
  return `${Math.floor(m / 60)} h${m % 60 ? ` ${m % 60} min` : ""}`;
}

// Durations as the event log, the runs and server-timing carry them: ms rounded to two decimals.
export function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}

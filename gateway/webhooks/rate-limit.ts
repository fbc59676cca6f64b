// Per-endpoint rate limit as a GCRA (a token bucket kept as one timestamp): `ratePerMinute` sustained, bursts up to a minute's worth.

export interface RateDecision {
  allowed: boolean;
  /** The state to store when allowed (unchanged when refused). */
  tatMs: number;
  /** When refused: seconds until one more request would be allowed. */
  retryAfterS: number;
}

/**
 * Generic cell rate algorithm: each request pushes the "theoretical arrival time" (TAT) one emission interval
 * later; a request is refused when that would put the TAT more than the burst allowance ahead of now.
 */
export function decideRate(storedTatMs: number | undefined, nowMs: number, ratePerMinute: number): RateDecision {
  const intervalMs = Math.max(1, Math.round(60_000 / ratePerMinute));
  const burstMs = intervalMs * Math.max(0, ratePerMinute - 1);
  const tat = Math.max(storedTatMs ?? nowMs, nowMs);
  const aheadMs = tat - nowMs;
  if (aheadMs > burstMs) {
    return { allowed: false, tatMs: tat, retryAfterS: Math.max(1, Math.ceil((aheadMs - burstMs) / 1000)) };
  }
  return { allowed: true, tatMs: tat + intervalMs, retryAfterS: 0 };
}

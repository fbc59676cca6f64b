// When to try a failed attempt again (a webhook delivery, an async upstream call): exponential backoff with jitter, stretched to what the far side asked for.

export interface Backoff {
  /** The first retry's step, ms (doubling after each failure). */
  backoffBaseMs: number;
  /** No delay is longer, ms. */
  backoffMaxMs: number;
}

/**
 * Delay before the next attempt after `attemptsDone` failed attempts of this round (1 = the first failed).
 * The exponential step is jittered to 50–100 % of itself ("equal jitter": spread out, yet never close to zero),
 * then raised to the far side's `Retry-After` hint, and capped at `backoffMaxMs`.
 */
export function retryDelayMs(attemptsDone: number, config: Backoff, random: number, retryAfterHintMs?: number): number {
  const exponent = Math.min(Math.max(0, attemptsDone - 1), 40);
  const step = Math.min(config.backoffMaxMs, config.backoffBaseMs * 2 ** exponent);
  const jittered = step / 2 + (Math.min(Math.max(random, 0), 1) * step) / 2;
  return Math.round(Math.min(config.backoffMaxMs, Math.max(jittered, retryAfterHintMs ?? 0)));
}

/** A `Retry-After` header (seconds or an HTTP date) in milliseconds from `nowMs`; undefined when absent or unreadable. */
export function parseRetryAfterMs(value: string | null, nowMs: number): number | undefined {
  if (!value) return undefined;
  if (/^\d+$/.test(value.trim())) return Number(value.trim()) * 1000;
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, at - nowMs);
}

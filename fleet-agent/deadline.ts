// Bounding a wait by the injected clock, so tests move time by hand and nothing sleeps for real.
import type { Clock } from "../lib/clock.ts";

/**
 * Settles like `work`, unless `ms` pass on `clock` first: then it settles with `late()` (which may throw to
 * reject). `work` itself is not cancelled; it goes on and its outcome is dropped.
 */
export function withDeadline<T>(clock: Clock, ms: number, work: Promise<T>, late: () => T): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = clock.setTimeout(() => {
      try {
        resolve(late());
      } catch (err) {
        reject(err);
      }
    }, ms);
    work.then(
      (v) => {
        timer.cancel();
        resolve(v);
      },
      (e) => {
        timer.cancel();
        reject(e);
      },
    );
  });
}

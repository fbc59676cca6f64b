// A periodic sweep that runs only while there is something to sweep: an idle process is not woken ten times a second for nothing.

export interface Sweeper {
  /** Something a sweep looks after was added: sweeps run (again) until one answers that nothing is left. */
  wake(): void;
  stop(): void;
}

/**
 * Calls `sweep(now)` (`performance.now()`) every `everyMs` while it answers true; after it answers false, the next
 * `wake` starts it again. The timer never keeps the process alive.
 */
export function lazySweeper(everyMs: number, sweep: (now: number) => boolean): Sweeper {
  let timer: ReturnType<typeof setInterval> | undefined;
  const stop = () => {
    if (timer === undefined) return;
    clearInterval(timer);
    timer = undefined;
  };
  return {
    wake() {
      if (timer !== undefined) return;
      timer = setInterval(() => {
        if (!sweep(performance.now())) stop();
      }, everyMs);
      timer.unref();
    },
    stop,
  };
}

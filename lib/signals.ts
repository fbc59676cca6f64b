// Node daemons stop the same way: the first SIGINT/SIGTERM runs their stop(), then the process exits (1 if stop failed).
import type { Logger } from "./log.ts";

export function stopOnSignals(stop: () => Promise<void>, log: Logger, announce?: (signal: string) => void): void {
  let stopping = false;
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    process.on(signal, () => {
      if (stopping) return;
      stopping = true;
      announce?.(signal);
      // The clock's timers do not hold the process open; this does, until stop() is over (a drain may wait on nothing else).
      const keepAlive = setInterval(() => undefined, 1000);
      stop()
        .finally(() => clearInterval(keepAlive))
        .then(
          () => process.exit(0),
          (err: unknown) => {
            log.error("shutdown failed", { err: err instanceof Error ? err.message : String(err) });
            process.exit(1);
          },
        );
    });
  }
}

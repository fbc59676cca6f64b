// bench:density's cleanup: what to undo (VMs, loop mount, temp dirs), run at the end of a filesystem, on errors and on Ctrl-C.
import { AppError } from "../../../lib/errors.ts";

export class Cleanups {
  private readonly steps: (() => Promise<unknown>)[] = [];
  private cleaning: Promise<void> | undefined;
  private interrupted = false;

  push(step: () => Promise<unknown>): void {
    this.steps.push(step);
  }

  /** Runs (newest first) every cleanup registered so far; one run at a time, a later call runs what came since. */
  runAll(): Promise<void> {
    const run = async () => {
      for (const step of this.steps.splice(0).reverse()) {
        try {
          await step();
        } catch (err) {
          console.error(`bench:density cleanup: ${(err as Error).message}`);
        }
      }
    };
    this.cleaning = (this.cleaning ?? Promise.resolve()).then(run);
    return this.cleaning;
  }

  /** On Ctrl-C: says so, runs every cleanup and exits 130; the bench stops at its next `checkInterrupted`. */
  exitOnInterrupt(say: (line: string) => void): void {
    process.once("SIGINT", () => {
      this.interrupted = true;
      say("interrupted: cleaning up (VMs, loop mount, temp dirs)");
      void this.runAll().finally(() => process.exit(130));
    });
  }

  checkInterrupted(): void {
    if (this.interrupted) throw new AppError("internal", "interrupted");
  }

  /** Whether Ctrl-C came (for loops that stop on their own rather than throw). */
  get wasInterrupted(): boolean {
    return this.interrupted;
  }
}

// Phase timings of one hibernation or wake (ms per named step, in order), for the driver's log lines and bench:wake.
export class Phases {
  readonly ms: Record<string, number> = {};
  private last: number;

  constructor(start = performance.now()) {
    this.last = start;
  }

  /** Closes the step that ran since the previous mark (or the start) under `name`; a repeated name adds up. */
  mark(name: string): void {
    const now = performance.now();
    this.ms[name] = Math.round(((this.ms[name] ?? 0) + now - this.last) * 10) / 10;
    this.last = now;
  }

  /** Records a duration measured elsewhere (a step that ran alongside others), leaving the running step open. */
  set(name: string, ms: number): void {
    this.ms[name] = Math.round(ms * 10) / 10;
  }
}

// Guest CPU as a rate: what the idle reaper compares with the busy threshold.

/** Guest CPU between the last two samples, as a fraction of one core. A VM's window starts over on each wake. */
export class CpuWindow {
  private last: { at: number; seconds: number } | undefined;
  /** Undefined until two samples with time between them: one sample says nothing about a rate. */
  fraction: number | undefined;

  /** `seconds` is the guest's CPU time so far, taken at monotonic ms `at`. */
  sample(at: number, seconds: number): void {
    const prev = this.last;
    this.last = { at, seconds };
    // Two samples at the same instant would divide by zero: keep the last fraction instead.
    if (prev && at > prev.at) this.fraction = (seconds - prev.seconds) / ((at - prev.at) / 1000);
  }

  reset(): void {
    this.last = undefined;
    this.fraction = undefined;
  }
}

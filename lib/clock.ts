// Injected time: wall clock for timestamps, monotonic clock for durations, timers for schedules.

export interface Clock {
  /** Wall-clock milliseconds since the epoch (timestamps). */
  now(): number;
  /** Monotonic milliseconds (durations); never jumps when the wall clock is set. */
  monotonic(): number;
  setTimeout(fn: () => void, ms: number): { cancel(): void };
}

export const systemClock: Clock = {
  now: () => Date.now(),
  monotonic: () => performance.now(),
  setTimeout(fn, ms) {
    const t = setTimeout(fn, ms);
    t.unref?.();
    return { cancel: () => clearTimeout(t) };
  },
};

/** A clock that moves only when told to: for tests of deadlines and idle rules without sleeping. */
export class ManualClock implements Clock {
  private wall: number;
  private mono = 0;
  private timers: { at: number; fn: () => void; id: number }[] = [];
  private nextId = 0;

  constructor(startWallMs = Date.UTC(2026, 0, 1)) {
    this.wall = startWallMs;
  }

  now(): number {
    return this.wall;
  }

  monotonic(): number {
    return this.mono;
  }

  setTimeout(fn: () => void, ms: number): { cancel(): void } {
    const id = this.nextId++;
    this.timers.push({ at: this.mono + Math.max(0, ms), fn, id });
    return { cancel: () => void (this.timers = this.timers.filter((t) => t.id !== id)) };
  }

  /** Moves both clocks forward, firing due timers in order. */
  advance(ms: number): void {
    const target = this.mono + ms;
    for (;;) {
      this.timers.sort((a, b) => a.at - b.at || a.id - b.id);
      const next = this.timers[0];
      if (!next || next.at > target) break;
      this.timers.shift();
      this.wall += next.at - this.mono;
      this.mono = next.at;
      next.fn();
    }
    this.wall += target - this.mono;
    this.mono = target;
  }
}

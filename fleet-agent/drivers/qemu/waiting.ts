// The QEMUs kept for hibernated VMs (pre-started in `-incoming defer`, or kept stopped after their hibernation), bounded
// in time and in number: a wake soon after a hibernation takes one, a VM that sleeps on costs the host nothing.

/** How long a kept QEMU waits for its VM's wake, and how many are kept at once (the oldest goes first). */
export interface WaitingLimits {
  /** ms after it was kept; 0 or Infinity: until the wake. */
  keepMs: number;
  /** The most kept at once; Infinity: no bound. */
  max: number;
  /** The most bytes kept at once, each weighed when kept (`weigh`); absent or Infinity: no bound. */
  maxBytes?: number;
}

/** Why a kept one left the pool without a wake taking it. */
export type EvictReason = "expired" | "over_max" | "over_memory";

/** Timers, injected so the bounds are tested without waiting. */
export interface WaitingTimers {
  set(fn: () => void, ms: number): unknown;
  clear(handle: unknown): void;
}

const realTimers: WaitingTimers = {
  set: (fn, ms) => setTimeout(fn, ms).unref(),
  clear: (h) => clearTimeout(h as NodeJS.Timeout),
};

/**
 * One kept QEMU per VM id, in the order they were kept. A kept one that outlives `keepMs`, or is the oldest when one
 * more would pass `max`, leaves the pool and goes to `evict` (which ends it); its VM's next wake restores from its files.
 */
export class WaitingPool<T> {
  private readonly entries = new Map<string, { value: T; timer: unknown; bytes: number }>();
  private readonly limits: WaitingLimits;
  private readonly evict: (id: string, value: T, why: EvictReason) => void;
  private readonly timers: WaitingTimers;
  private readonly weigh: (value: T) => number;
  private keptBytes = 0;

  /** `weigh`: a kept one's bytes when it is kept (for `maxBytes`). */
  constructor(
    limits: WaitingLimits,
    evict: (id: string, value: T, why: EvictReason) => void,
    opts: { timers?: WaitingTimers; weigh?: (value: T) => number } = {},
  ) {
    if (!(limits.max >= 1)) throw new Error(`the most QEMUs kept waiting must be at least 1, not ${limits.max}`);
    this.limits = limits;
    this.evict = evict;
    this.timers = opts.timers ?? realTimers;
    this.weigh = opts.weigh ?? (() => 0);
  }

  /**
   * Keeps `value` for `id` (replacing, without evicting, what was kept for it), then enforces `max` and `maxBytes`,
   * oldest first (this one too, when it alone is over the bytes).
   */
  set(id: string, value: T): void {
    this.delete(id);
    const { keepMs } = this.limits;
    const timer = keepMs > 0 && Number.isFinite(keepMs) ? this.timers.set(() => this.drop(id, value, "expired"), keepMs) : undefined;
    const bytes = this.weigh(value);
    this.entries.set(id, { value, timer, bytes });
    this.keptBytes += bytes;
    const maxBytes = this.limits.maxBytes ?? Number.POSITIVE_INFINITY;
    for (const [oldId, old] of this.entries) {
      if (this.entries.size > this.limits.max) this.drop(oldId, old.value, "over_max");
      else if (this.keptBytes > maxBytes) this.drop(oldId, old.value, "over_memory");
      else break;
    }
  }

  /** The bytes of what is kept, as weighed when each was kept. */
  get bytes(): number {
    return this.keptBytes;
  }

  get(id: string): T | undefined {
    return this.entries.get(id)?.value;
  }

  has(id: string): boolean {
    return this.entries.has(id);
  }

  /** Forgets what is kept for `id` (the caller ends it or uses it); true if something was. */
  delete(id: string): boolean {
    const e = this.entries.get(id);
    if (!e) return false;
    if (e.timer !== undefined) this.timers.clear(e.timer);
    this.keptBytes -= e.bytes;
    return this.entries.delete(id);
  }

  keys(): string[] {
    return [...this.entries.keys()];
  }

  get size(): number {
    return this.entries.size;
  }

  private drop(id: string, value: T, why: EvictReason): void {
    if (this.entries.get(id)?.value !== value) return; // taken by a wake, or replaced, meanwhile
    this.delete(id);
    this.evict(id, value, why);
  }
}

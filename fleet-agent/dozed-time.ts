// How long a VM has dozed so far (fleet-agent/host/doze.ts keeps it): the gateway's timeouts leave that time out.

/**
 * One per VM, for its whole life on this host. `totalMs` only grows; `since` is set while it dozes. A call's hold reads
 * `msAt` at two instants: the difference is the time the VM dozed between them, on the host's monotonic clock.
 */
export class DozedTime {
  totalMs = 0;
  /** Monotonic ms the current doze began; undefined while the VM runs. */
  since: number | undefined = undefined;
  /** While dozing: runs the VM again when a byte of an open inbound call arrives (a WebSocket frame, more body). */
  touched: (() => void) | undefined = undefined;

  /** Dozed ms up to monotonic `now`, the current doze included. */
  msAt(now: number): number {
    return this.since === undefined ? this.totalMs : this.totalMs + Math.max(0, now - this.since);
  }

  begin(now: number, touched: () => void): void {
    this.since = now;
    this.touched = touched;
  }

  /** The doze is over: answers how long it lasted (0 when none was under way). */
  end(now: number): number {
    if (this.since === undefined) return 0;
    const ms = Math.max(0, now - this.since);
    this.totalMs += ms;
    this.since = undefined;
    this.touched = undefined;
    return ms;
  }
}

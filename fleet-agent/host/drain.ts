// Draining: an operator's drain of this host (its VMs sleep as soon as no request is open) and shutdown's wait for the requests in flight.
import type { Clock } from "../../lib/clock.ts";
import type { Logger } from "../../lib/log.ts";
import { withDeadline } from "../deadline.ts";

export interface DrainDeps {
  clock: Clock;
  log: Logger;
  /** How long shutdown waits for in-flight requests before hibernating anyway. */
  drainTimeoutMs: number;
  /** Requests in flight on this host (open tickets). */
  inFlight(): number;
}

/** Why a host drains: its row says so (an operator), or its own clock is off past the bound (a heartbeat found it). */
export type DrainReason = "operator" | "clock_skew";

export class Drain {
  private readonly deps: DrainDeps;
  /** An operator drains this host (`POST /v1/hosts/{id}/drain`): its VMs sleep as soon as no request is open, and gateways move them. */
  private draining = false;
  /** Set while stop() waits for in-flight requests: called when the last ticket is released. */
  private drained: (() => void) | undefined;

  constructor(deps: DrainDeps) {
    this.deps = deps;
  }

  get isDraining(): boolean {
    return this.draining;
  }

  /**
   * Drain on or off, as the host's row says at each heartbeat. While draining, each reaper pass hibernates every
   * running VM with no request open (leases and idle timeouts aside); gateways place none of its agents here again
   * once they sleep, and no new agents (gateway/placement.ts).
   */
  set(on: boolean, why: DrainReason = "operator"): void {
    if (on === this.draining) return;
    this.draining = on;
    const cause = why === "clock_skew" ? " (this host's clock is off: gateways' calls are refused here)" : "";
    this.deps.log.warn(
      on ? `draining${cause}: agents hibernate as soon as no request is open, and wake on other hosts` : "drain ended: this host takes agents again",
      { reason: why },
    );
  }

  /**
   * Resolves when the last open ticket is released, or at the drain timeout on the injected clock, whichever
   * comes first; tickets opened meanwhile by wakes already under way count as well.
   */
  waitForRequests(): Promise<void> {
    const ms = this.deps.drainTimeoutMs;
    // A zero timeout means "do not wait" (a 0 ms timer on a hand-driven clock would only fire when time moves).
    if (this.deps.inFlight() === 0 || ms <= 0) return Promise.resolve();
    const drained = new Promise<void>((resolve) => (this.drained = resolve));
    return withDeadline(this.deps.clock, ms, drained, () => undefined).finally(() => (this.drained = undefined));
  }

  /** A ticket was released: the wait ends with the last one. */
  released(): void {
    if (this.drained && this.deps.inFlight() === 0) this.drained();
  }
}

// The idle rule: when a running VM may be hibernated. Pure: every input is a number taken by the caller.

export interface OpenTicket {
  /** waiting = the agent has not answered yet (always counts as work); streaming = the response is flowing. */
  phase: "waiting" | "streaming";
  /** Monotonic ms when bytes last moved either way. */
  lastByteAt: number;
}

export interface IdleInputs {
  /** Monotonic now, ms. */
  now: number;
  /** Monotonic ms of the last sign of work: a request ended, CPU was busy, a lease was held. */
  lastActivityAt: number;
  idleTimeoutMs: number;
  streamIdleMs: number;
  tickets: readonly OpenTicket[];
  /** Keep-awake leases taken through the API that have not expired. */
  apiLeases: number;
  /** Keep-awake leases the guest holds. */
  guestLeases: number;
  /** Guest CPU over the last sample window, as a fraction of one core; undefined before the first window. */
  cpuFraction: number | undefined;
  cpuBusyThreshold: number;
}

export type IdleVerdict =
  | { hibernate: true; staleStreams: number }
  | { hibernate: false; why: "in-flight" | "stream-active" | "lease" | "guest-lease" | "cpu-busy" | "recent-activity"; busy: boolean };

/**
 * `busy` says whether the VM showed work right now, so the caller refreshes its last-activity time:
 * the idle timeout then counts from the end of the work, not from the last request.
 */
export function idleVerdict(i: IdleInputs): IdleVerdict {
  let staleStreams = 0;
  for (const t of i.tickets) {
    if (t.phase === "waiting") return { hibernate: false, why: "in-flight", busy: true };
    if (i.now - t.lastByteAt < i.streamIdleMs) return { hibernate: false, why: "stream-active", busy: true };
    staleStreams++;
  }
  if (i.apiLeases > 0) return { hibernate: false, why: "lease", busy: true };
  if (i.guestLeases > 0) return { hibernate: false, why: "guest-lease", busy: true };
  if (i.cpuFraction !== undefined && i.cpuFraction >= i.cpuBusyThreshold) return { hibernate: false, why: "cpu-busy", busy: true };
  if (i.now - i.lastActivityAt < i.idleTimeoutMs) return { hibernate: false, why: "recent-activity", busy: false };
  return { hibernate: true, staleStreams };
}

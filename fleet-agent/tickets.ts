// One request's hold on an awake VM (a ticket): what keeps the VM awake, and the list a VM keeps them in.
import type { WakeInfo } from "../contracts/agent.ts";
import type { Clock } from "../lib/clock.ts";
import type { VmEndpoint } from "./drivers/driver.ts";
import type { DozedTime } from "./dozed-time.ts";
import type { OpenTicket } from "./idle.ts";

/** One request's hold on an awake VM: it keeps the VM awake until released. */
export interface Ticket {
  readonly endpoint: VmEndpoint;
  readonly wake: WakeInfo;
  /** Bytes moved either way: keeps a long stream counting as work (and runs a dozing VM again: a byte is for it). */
  touch(): void;
  /**
   * How long the VM has dozed so far, ms on the host's monotonic clock (only grows): a call's timeouts subtract what
   * it grew by while they ran (the VM waited on an outbound call, not on its caller).
   */
  dozedMs(): number;
  /** The agent answered: from now on the ticket counts only while bytes move within the stream idle window. */
  streaming(): void;
  /** The first response byte reached the client (recorded on the run that this request woke). */
  firstByte(): void;
  /** The request is over, however it ended. Idempotent. */
  release(): void;
  /** What to do if the host hibernates under this (idle) stream: close it with 1001, abort it. */
  onHibernate(fn: () => void): void;
}

export class TicketImpl implements Ticket, OpenTicket {
  phase: "waiting" | "streaming" = "waiting";
  /** Index in its entry's ticket array while open; -1 once released. */
  slot = -1;
  lastByteAt: number;
  private released = false;
  private hibernateListeners: (() => void)[] = [];
  readonly endpoint: VmEndpoint;
  readonly wake: WakeInfo;
  private readonly clock: Clock;
  private readonly done: (t: TicketImpl) => void;
  private readonly onFirstByte: () => void;
  /** The VM's (one per entry, shared by its tickets: nothing allocated per call). */
  private readonly dozed: DozedTime;

  constructor(endpoint: VmEndpoint, wake: WakeInfo, clock: Clock, done: (t: TicketImpl) => void, onFirstByte: () => void, dozed: DozedTime) {
    this.endpoint = endpoint;
    this.wake = wake;
    this.clock = clock;
    this.done = done;
    this.onFirstByte = onFirstByte;
    this.dozed = dozed;
    this.lastByteAt = clock.monotonic();
  }

  touch(): void {
    this.lastByteAt = this.clock.monotonic();
    this.dozed.touched?.();
  }

  dozedMs(): number {
    return this.dozed.msAt(this.clock.monotonic());
  }

  streaming(): void {
    this.phase = "streaming";
    this.touch();
  }

  firstByte(): void {
    this.onFirstByte();
  }

  release(): void {
    if (this.released) return;
    this.released = true;
    this.done(this);
  }

  onHibernate(fn: () => void): void {
    this.hibernateListeners.push(fn);
  }

  hibernating(): void {
    for (const fn of this.hibernateListeners.splice(0)) {
      try {
        fn();
      } catch {
        /* a closing stream must not stop the hibernation */
      }
    }
  }
}

/** Takes a released ticket out of its VM's list in O(1) (swap-remove). */
export function removeTicket(tickets: TicketImpl[], t: TicketImpl): void {
  if (t.slot < 0) return;
  const last = tickets.pop()!;
  if (last !== t) {
    tickets[t.slot] = last;
    last.slot = t.slot;
  }
  t.slot = -1;
}

// The host's event-log writer: records reach the HostStore in the order they happened, off the request path.
import type { Logger } from "../lib/log.ts";
import type { WakeTimings } from "../contracts/agent.ts";
import type { HostStore, RunStart, TransitionRecord } from "./store.ts";

/**
 * Each write is queued behind the previous one, so a run's end never lands before its start and the log
 * reads in transition order. Callers never wait for the database: a slow or failed write must not hold up
 * or fail the request that caused it, so a failure is logged and the queue moves on. A host's store is
 * spooled (fleet-agent/store-spool.ts): while Postgres is unavailable a write lands on the host's disk and
 * resolves, and reaches the database later in the same order; what still fails here is a write the database
 * refused for another reason.
 */
export class EventLog {
  private readonly store: HostStore;
  private readonly log: Logger;
  private tail: Promise<void> = Promise.resolve();

  constructor(store: HostStore, log: Logger) {
    this.store = store;
    this.log = log;
  }

  transition(record: TransitionRecord): void {
    this.enqueue(() => this.store.transition(record));
  }

  runStarted(run: RunStart): void {
    this.enqueue(() => this.store.runStarted(run));
  }

  runTimings(runId: string, timings: WakeTimings): void {
    this.enqueue(() => this.store.runTimings(runId, timings));
  }

  runEnded(runId: string, sleptAt: Date, reason: string): void {
    this.enqueue(() => this.store.runEnded(runId, sleptAt, reason));
  }

  /** Waits until every write queued so far is stored (or has failed and been logged). */
  flush(): Promise<void> {
    return this.tail;
  }

  private enqueue(write: () => Promise<void>): void {
    this.tail = this.tail.then(write).catch((err) => this.log.error("event log write failed", { err }));
  }
}

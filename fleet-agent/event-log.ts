// The host's event-log writer: records reach the HostStore in the order they happened, off the request path.
import type { Logger } from "../lib/log.ts";
import type { WakeTimings } from "../contracts/agent.ts";
import type { HostStore, RunStart, TransitionRecord } from "./store.ts";

/** The longest a hold keeps writes back, ms: a normal hibernation or restore answers in tens of ms. */
export const HOLD_MAX_MS = 1000;

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
  /** Transitions queued and not yet begun, by agent, in order (`overtake` takes them out of turn). */
  private readonly queued = new Map<string, TransitionRecord[]>();
  /** The transition being written in turn (at most one: the queue is serial), and whose. */
  private writing: { agentId: string; done: Promise<void> } | undefined;
  /** Agents whose queued transitions are being written out of turn (`overtake`). */
  private readonly overtaking = new Map<string, Promise<void>>();

  /** A write the database refused (a spooled store takes outages itself): logged, and the log moves on. */
  private readonly failed = (err: unknown): void => this.log.error("event log write failed", { err });

  constructor(store: HostStore, log: Logger) {
    this.store = store;
    this.log = log;
  }

  transition(record: TransitionRecord): void {
    const id = record.agentId;
    const mine = this.queued.get(id);
    if (mine) mine.push(record);
    else this.queued.set(id, [record]);
    this.enqueue(() => {
      const list = this.queued.get(id);
      const i = list ? list.indexOf(record) : -1;
      if (i < 0) return Promise.resolve(); // written out of turn already (`overtake`)
      list!.splice(i, 1);
      if (list!.length === 0) this.queued.delete(id);
      const write = this.store.transition(record);
      const done = write.then(
        () => undefined,
        () => undefined,
      );
      this.writing = { agentId: id, done };
      void done.then(() => {
        if (this.writing?.done === done) this.writing = undefined;
      });
      return write;
    });
  }

  /**
   * Writes the agent's queued transitions now, in their order, ahead of the rest of the queue (after the one being
   * written, if it is the agent's). Before the host writes the agent's row past the queue (`HostStore.claimWake`
   * before a wake, `markAsleep` when a draining host hands it off): a host waking an agent again before its log caught
   * up (writes queue behind holds; under load seconds behind) would otherwise have the row say `hibernated` after the
   * claim said `restoring`, and a drain's move take the agent while it wakes here; and the log would have the old
   * host's last transitions after the move. Waits only for the agent's own writes, never for a hold.
   */
  overtake(agentId: string): Promise<void> {
    const under = this.overtaking.get(agentId);
    const run = (async () => {
      await under;
      // Every write of the agent's already begun in turn, also one the queue began while this waited for the last (the
      // queue is serial: one at a time), whatever order the promises settle in.
      while (this.writing?.agentId === agentId) await this.writing.done;
      const mine = this.queued.get(agentId) ?? [];
      this.queued.delete(agentId);
      for (const r of mine) await this.store.transition(r).catch(this.failed);
    })();
    this.overtaking.set(agentId, run);
    void run.then(() => {
      if (this.overtaking.get(agentId) === run) this.overtaking.delete(agentId);
    });
    return run;
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

  /**
   * Writes queued from now on wait until the returned release is called. For a VM's pause and wake: with an embedded
   * database (PGlite runs on this thread) a write's CPU time would land inside the driver's steps (between `stop` and
   * the snapshot's commit; before QEMU starts, during the clock fix). Each record keeps the time it was made at; only
   * its write waits, and at most `maxMs` (the log is the host's, every VM's writes queue behind the hold: a driver
   * stuck in a slow migration or a cold boot must not keep them all back).
   */
  hold(maxMs = HOLD_MAX_MS): () => void {
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const timer = setTimeout(release, maxMs);
    this.tail = this.tail.then(() => released);
    return () => {
      clearTimeout(timer);
      release();
    };
  }

  /** Waits until every write queued so far is stored (or has failed and been logged). */
  flush(): Promise<void> {
    return this.tail;
  }

  private enqueue(write: () => Promise<void>): void {
    this.tail = this.tail.then(write).catch(this.failed);
  }
}

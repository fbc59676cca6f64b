// A HostStore that outlives the database: writes go through, are spooled on this host's disk when Postgres is unavailable, and are replayed in order once it is back.
import { appendFileSync, closeSync, existsSync, fdatasyncSync, ftruncateSync, mkdirSync, openSync, readFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { systemClock, type Clock } from "../lib/clock.ts";
import { silentLogger, type Logger } from "../lib/log.ts";
import { isDatabaseUnavailable, isUniqueViolation } from "../schema/db-errors.ts";
import type { HostStore } from "./store.ts";

/** Where a host keeps its event-log spool: `<dataDir>/hosts/<hostId>/events/`. */
export function eventSpoolDir(dataDir: string, hostId: string): string {
  return join(dataDir, "hosts", hostId, "events");
}

/**
 * The writes that are spooled: the event log (transitions, runs), which the host issues and never reads back.
 * Every other method of the store (reads, and writes whose caller handles failure itself, such as crash recovery)
 * passes through unchanged, after the spooled writes before it have been replayed where the database allows.
 */
export const spooledMethods = ["transition", "runStarted", "runTimings", "runEnded"] as const satisfies readonly (keyof HostStore)[];
type SpooledMethod = (typeof spooledMethods)[number];
const isSpooled = (name: PropertyKey): name is SpooledMethod => (spooledMethods as readonly PropertyKey[]).includes(name);

export interface StoreSpoolOptions {
  /** The spool's directory (`eventSpoolDir`). */
  dir: string;
  log?: Logger;
  clock?: Clock;
  /** First wait before replaying again after the database refused, doubled per failure up to `maxBackoffMs`. Defaults 100 ms and 2 s. */
  minBackoffMs?: number;
  maxBackoffMs?: number;
  /** Jitter source in [0, 1): a wait is scaled by 0.5–1.0. */
  random?: () => number;
}

export interface StoreSpoolControl {
  /** Writes waiting in the spool for the database. */
  readonly backlog: number;
  /** Lines of the file that could not be read when it was opened (a torn last line is not counted: it is expected). */
  readonly corruptLines: number;
  /** Replays the spool now: true when it is empty afterwards, false when the database still refuses. */
  replay(): Promise<boolean>;
  /** Stops the replay timer (what is spooled stays on disk for the next start). */
  close(): void;
}

interface Pending {
  n: number;
  method: SpooledMethod;
  args: unknown[];
}

/** Dates survive the file as `{"$date": iso}` (JSON would turn them into strings the store does not take). */
function encode(value: unknown): string {
  return JSON.stringify(value, function (this: Record<string, unknown>, key, v: unknown) {
    const raw = this[key];
    return raw instanceof Date ? { $date: raw.toISOString() } : v;
  });
}

function decode(text: string): unknown {
  return JSON.parse(text, (_key, v: unknown) => {
    if (typeof v === "object" && v !== null && !Array.isArray(v)) {
      const keys = Object.keys(v);
      if (keys.length === 1 && keys[0] === "$date" && typeof (v as { $date: unknown }).$date === "string") return new Date((v as { $date: string }).$date);
    }
    return v;
  });
}

/**
 * Layout: `store.ndjson` holds one line per spooled write (`{"n", "m": method, "a": args}`) and one per write that
 * reached the database since (`{"done": n}`); it is emptied once everything in it is done. Each line is written and
 * fdatasync'ed before the call returns, so a killed process loses no spooled write. Replays run oldest first, one at a
 * time; a write issued while older ones wait is spooled behind them, so the database sees the host's order.
 * Delivery is at least once: a write whose answer was lost with its connection is replayed (an insert that already
 * landed is recognised by its unique key and counted as done). A write the database refuses for another reason is
 * moved to `rejected.ndjson` with the error, for an operator, and the replay goes on.
 */
class StoreSpool {
  private readonly path: string;
  private readonly log: Logger;
  private readonly clock: Clock;
  private readonly minBackoffMs: number;
  private readonly maxBackoffMs: number;
  private readonly random: () => number;
  private readonly pending: Pending[] = [];
  private fd: number;
  private nextN = 1;
  private failures = 0;
  private timer: { cancel(): void } | undefined;
  private replaying: Promise<boolean> | undefined;
  private tail: Promise<unknown> = Promise.resolve();
  private closed = false;
  readonly corruptLines: number;
  private readonly inner: HostStore;
  private readonly opts: StoreSpoolOptions;

  constructor(inner: HostStore, opts: StoreSpoolOptions) {
    this.inner = inner;
    this.opts = opts;
    this.path = join(opts.dir, "store.ndjson");
    this.log = opts.log ?? silentLogger;
    this.clock = opts.clock ?? systemClock;
    this.minBackoffMs = opts.minBackoffMs ?? 100;
    this.maxBackoffMs = opts.maxBackoffMs ?? 2000;
    this.random = opts.random ?? Math.random;
    mkdirSync(opts.dir, { recursive: true });
    this.corruptLines = this.load();
    this.fd = openSync(this.path, "a");
    if (this.pending.length === 0) ftruncateSync(this.fd, 0);
    else {
      this.log.warn("event log: replaying writes spooled by an earlier run", { writes: this.pending.length });
      this.schedule(0);
    }
  }

  get backlog(): number {
    return this.pending.length;
  }

  /** Reads what an earlier process left: drops a torn last line, skips unreadable ones, keeps the writes not done. */
  private load(): number {
    if (!existsSync(this.path)) return 0;
    const text = readFileSync(this.path, "utf8");
    const complete = text.slice(0, text.lastIndexOf("\n") + 1);
    const written = new Map<number, Pending>();
    let corrupt = 0;
    for (const line of complete.split("\n")) {
      if (line === "") continue;
      try {
        const v = decode(line) as { n?: unknown; m?: unknown; a?: unknown; done?: unknown };
        if (typeof v.done === "number") written.delete(v.done);
        else if (typeof v.n === "number" && isSpooled(v.m as string) && Array.isArray(v.a))
          written.set(v.n, { n: v.n, method: v.m as SpooledMethod, args: v.a });
        else corrupt++;
        this.nextN = Math.max(this.nextN, (typeof v.n === "number" ? v.n : 0) + 1);
      } catch {
        corrupt++;
      }
    }
    if (corrupt > 0) this.log.error("event log spool: unreadable lines skipped", { path: this.path, lines: corrupt });
    this.pending.push(...[...written.values()].sort((a, b) => a.n - b.n));
    if (complete.length < text.length) {
      // Rewritten below (emptied, or appended after): the torn bytes must not glue onto the next line.
      const fd = openSync(this.path, "r+");
      ftruncateSync(fd, Buffer.byteLength(complete));
      closeSync(fd);
    }
    return corrupt;
  }

  private append(line: string): void {
    writeSync(this.fd, `${line}\n`);
    fdatasyncSync(this.fd);
  }

  /** One write of the event log: through to the database, or into the spool (behind what already waits there). */
  write(method: SpooledMethod, args: unknown[]): Promise<void> {
    const run = this.tail.then(async () => {
      if (this.pending.length === 0 && !this.replaying) {
        try {
          await (this.inner[method] as (...a: unknown[]) => Promise<void>).apply(this.inner, args);
          return;
        } catch (err) {
          if (!isDatabaseUnavailable(err)) throw err;
          this.log.warn("event log: database unavailable, spooling writes on disk", { method, err: err instanceof Error ? err.message : String(err) });
        }
      }
      this.spool(method, args);
    });
    this.tail = run.catch(() => undefined);
    return run;
  }

  private spool(method: SpooledMethod, args: unknown[]): void {
    const entry = { n: this.nextN++, method, args };
    this.append(encode({ n: entry.n, m: method, a: args }));
    this.pending.push(entry);
    if (!this.replaying && !this.timer) this.schedule(this.delay());
  }

  /** Waits for a replay (a running one, or one now) before another method reaches the store, so it sees the host's order. */
  async beforePassThrough(): Promise<void> {
    if (this.pending.length > 0) await this.replay();
  }

  replay(): Promise<boolean> {
    this.timer?.cancel();
    this.timer = undefined;
    this.replaying ??= this.drain().finally(() => {
      this.replaying = undefined;
      if (this.pending.length > 0 && !this.closed && !this.timer) this.schedule(this.delay());
    });
    return this.replaying;
  }

  private async drain(): Promise<boolean> {
    const before = this.pending.length;
    while (this.pending.length > 0) {
      const next = this.pending[0]!;
      try {
        await (this.inner[next.method] as (...a: unknown[]) => Promise<void>).apply(this.inner, next.args);
      } catch (err) {
        if (isDatabaseUnavailable(err)) {
          this.failures++;
          return false;
        }
        if (!isUniqueViolation(err)) {
          this.log.error("event log: the database refused a spooled write; kept in rejected.ndjson", {
            method: next.method,
            err: err instanceof Error ? err.message : String(err),
          });
          appendFileSync(
            join(this.opts.dir, "rejected.ndjson"),
            `${encode({ at: new Date(this.clock.now()), method: next.method, args: next.args, error: err instanceof Error ? err.message : String(err) })}\n`,
          );
        }
      }
      this.pending.shift();
      this.append(encode({ done: next.n }));
    }
    if (before > 0) this.log.info("event log: spooled writes replayed", { writes: before, afterFailures: this.failures });
    this.failures = 0;
    ftruncateSync(this.fd, 0);
    fdatasyncSync(this.fd);
    return true;
  }

  private delay(): number {
    const base = Math.min(this.maxBackoffMs, this.minBackoffMs * 2 ** Math.max(0, this.failures - 1));
    return Math.round(base * (0.5 + this.random() / 2));
  }

  private schedule(ms: number): void {
    if (this.closed) return;
    this.timer = this.clock.setTimeout(() => {
      this.timer = undefined;
      void this.replay();
    }, ms);
  }

  close(): void {
    this.closed = true;
    this.timer?.cancel();
    this.timer = undefined;
  }
}

/**
 * `inner` with its event-log writes (`spooledMethods`) spooled on disk while the database is unavailable and replayed
 * in order when it is back (with backoff); any other method of `inner`, today's or one added later, passes through.
 */
export function createSpooledHostStore<S extends HostStore>(inner: S, opts: StoreSpoolOptions): S & StoreSpoolControl {
  const spool = new StoreSpool(inner, opts);
  const control: StoreSpoolControl = {
    get backlog() {
      return spool.backlog;
    },
    corruptLines: spool.corruptLines,
    replay: () => spool.replay(),
    close: () => spool.close(),
  };
  return new Proxy(inner, {
    get(target, name, receiver) {
      if (isSpooled(name)) return (...args: unknown[]) => spool.write(name, args);
      if (name in control) return Reflect.get(control, name);
      const value: unknown = Reflect.get(target, name, receiver);
      if (typeof value !== "function") return value;
      return async (...args: unknown[]) => {
        await spool.beforePassThrough();
        return (value as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  }) as S & StoreSpoolControl;
}

// The shared artifact store's garbage collector: removes the blobs nothing references (no live agent's commit, no image
// row, no kept upstream body) once they are older than a grace period; a daemon runs it on every host that has a store.
import type { Clock } from "../../lib/clock.ts";
import type { Logger } from "../../lib/log.ts";
import type { StoredBlob } from "./store.ts";

/** What the collector needs of the store (dir-store.ts). */
export interface CollectableStore {
  list(): AsyncIterable<StoredBlob>;
  mtimeOf(digest: string): Promise<number | undefined>;
  remove(digest: string): Promise<number>;
}

export interface CollectOptions {
  store: CollectableStore;
  /** Every digest some row references now (references.ts). Read after the listing. */
  referenced(): Promise<Set<string>>;
  /**
   * A blob put (or put again) this recently is spared whatever the rows say: a writer puts its blobs first and writes the
   * row that references them after, and a put of bytes already there touches the blob (dir-store.ts).
   */
  graceMs: number;
  /** Wall clock, ms (blob times are the filesystem's wall clock). */
  now(): number;
  /** Count what would go, remove nothing. */
  dryRun?: boolean;
}

export interface CollectResult {
  blobs: number;
  /** Referenced: kept. */
  kept: number;
  /** Within the grace period: kept, whatever the rows say. */
  young: number;
  removed: number;
  removedBytes: number;
}

/**
 * One pass. The blobs are listed before the references are read, so a blob whose row was written meanwhile is in the
 * references; each candidate's time is read again just before it goes, so a blob put again since the listing (its row on
 * the way) is spared.
 */
export async function collectGarbage(o: CollectOptions): Promise<CollectResult> {
  const result: CollectResult = { blobs: 0, kept: 0, young: 0, removed: 0, removedBytes: 0 };
  const candidates: StoredBlob[] = [];
  for await (const blob of o.store.list()) {
    result.blobs++;
    if (o.now() - blob.mtimeMs < o.graceMs) result.young++;
    else candidates.push(blob);
  }
  if (candidates.length === 0) return result;
  const referenced = await o.referenced();
  for (const blob of candidates) {
    if (referenced.has(blob.digest)) {
      result.kept++;
      continue;
    }
    const mtimeMs = await o.store.mtimeOf(blob.digest);
    if (mtimeMs === undefined) continue; // another host's collector took it
    if (o.now() - mtimeMs < o.graceMs) {
      result.young++;
      continue;
    }
    result.removed++;
    result.removedBytes += o.dryRun ? blob.bytes : await o.store.remove(blob.digest);
  }
  return result;
}

export interface StoreCollectorOptions extends Omit<CollectOptions, "now" | "dryRun"> {
  intervalMs: number;
  clock: Clock;
  log: Logger;
}

/**
 * Runs `collectGarbage` every `intervalMs` (the first pass a random fraction of it after start, so hosts started
 * together do not list the store together). Every host with a store runs one: passes on several hosts at once are
 * safe (a removal is idempotent), only redundant.
 * Stop order: the timer first, then the pass under way is awaited.
 */
export class StoreCollector {
  private readonly o: StoreCollectorOptions;
  private timer: { cancel(): void } | undefined;
  private running: Promise<void> | undefined;
  private stopped = false;

  constructor(o: StoreCollectorOptions) {
    this.o = o;
  }

  start(): void {
    this.schedule(Math.round(this.o.intervalMs * Math.random()));
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.timer?.cancel();
    await this.running;
  }

  /** One pass now (also what the timer runs); logs what it removed. */
  async pass(): Promise<CollectResult> {
    const started = this.o.clock.monotonic();
    const r = await collectGarbage({ ...this.o, now: () => this.o.clock.now() });
    this.o.log.info("artifact store collected", { ...r, ms: Math.round(this.o.clock.monotonic() - started) });
    return r;
  }

  private schedule(delayMs: number): void {
    if (this.stopped) return;
    this.timer = this.o.clock.setTimeout(() => {
      this.running = this.pass()
        .then(() => undefined)
        .catch((err: unknown) => this.o.log.warn("artifact store collection failed", { err: err instanceof Error ? err.message : String(err) }))
        .finally(() => {
          this.running = undefined;
          this.schedule(this.o.intervalMs);
        });
    }, delayMs);
  }
}

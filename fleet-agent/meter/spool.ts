// Durable local spool of closed meter segments (NDJSON, fsynced before shipping, trimmed by atomic rewrite after billing's ack).
import {
  closeSync,
  existsSync,
  fdatasync,
  fsyncSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  truncateSync,
  writeFileSync,
  writeSync,
  appendFileSync,
} from "node:fs";
import { join } from "node:path";
import { silentLogger, type Logger } from "../../lib/log.ts";
import type { MeterSegment } from "../../contracts/meter.ts";
import { pidAlive } from "../../lib/node-lock.ts";

/** Where a host keeps its meter spool: `<dataDir>/hosts/<hostId>/meter/`. */
export function meterDir(dataDir: string, hostId: string): string {
  return join(dataDir, "hosts", hostId, "meter");
}

/** What a Meter needs from a spool (a fake in unit tests, `SegmentSpool` for real). */
export interface SegmentLog {
  /** The next sequence number for `vmId`, never handed out before, across restarts. */
  nextSeq(vmId: string): number;
  /** Records a closed segment; it survives a crash of this process as soon as this returns. */
  append(segment: MeterSegment): void;
  /** The VM is gone for good: its sequence number need not be remembered any more. */
  forget?(vmId: string): void;
  /** The end of the last segment recorded for `vmId` (kept across restarts, after shipping too): the last instant the meter knew it awake. */
  lastEnded?(vmId: string): LastEnded | undefined;
}

/** Where a VM's metering stopped last: the run of its last segment and that segment's end (ms since the epoch). */
export interface LastEnded {
  runId: string;
  endedAt: number;
}

interface Entry {
  segment: MeterSegment;
  line: string;
  /** Order of the write; synced once `syncedUpTo` reaches it. */
  writeNo: number;
}

interface Checkpoint {
  /** `ends`: the last segment's run and end per VM, so they outlive the segments' shipping (absent when empty). */
  checkpoint: { seqs: Record<string, number>; ends?: Record<string, { runId: string; endedAt: string }> };
}

export interface SpoolOptions {
  log?: Logger;
  /** Rewrite the file once this many acked segments sit in it (and at least as many as are still pending). Default 1000. */
  compactAfter?: number;
}

/**
 * Layout: `segments.ndjson` holds a checkpoint line (the highest seq per VM, and where each VM's last segment ended)
 * then one segment per line; `meter.lock` holds the owning pid; `rejected.ndjson` keeps what billing refused, for an operator.
 * Appends are written synchronously (a killed process loses nothing it appended) and fdatasync'ed in groups;
 * only synced segments are offered for shipping. Acked segments leave by rewriting the file to a temporary
 * name and renaming it over the old one, so a crash at any point leaves either the old or the new file.
 */
export class SegmentSpool implements SegmentLog {
  readonly dir: string;
  private readonly path: string;
  private readonly lockPath: string;
  private readonly log: Logger;
  private readonly compactAfter: number;
  private fd: number;
  private readonly pending = new Map<string, Entry>();
  private readonly seqs = new Map<string, number>();
  private readonly ends = new Map<string, LastEnded>();
  private readonly forgotten = new Set<string>();
  private written = 0;
  private syncedUpTo = 0;
  private syncing: Promise<void> | undefined;
  private syncAgain = false;
  private ackedInFile = 0;
  private closed = false;
  /** Called whenever more segments became durable (the shipper's cue). */
  onSynced: (() => void) | undefined;
  /** Lines of the file that could not be parsed when it was opened (a torn tail is not counted: it is expected). */
  readonly corruptLines: number;

  private constructor(dir: string, log: Logger, compactAfter: number) {
    this.dir = dir;
    this.path = join(dir, "segments.ndjson");
    this.lockPath = join(dir, "meter.lock");
    this.log = log;
    this.compactAfter = compactAfter;
    this.fd = -1;
    this.corruptLines = 0;
  }

  static open(dir: string, opts: SpoolOptions = {}): SegmentSpool {
    const spool = new SegmentSpool(dir, opts.log ?? silentLogger, opts.compactAfter ?? 1000);
    mkdirSync(dir, { recursive: true });
    spool.takeLock();
    rmSync(`${spool.path}.tmp`, { force: true });
    (spool as { corruptLines: number }).corruptLines = spool.load();
    spool.fd = openSync(spool.path, "a");
    fsyncSync(spool.fd); // what a killed predecessor wrote may still sit in the page cache only
    spool.syncedUpTo = spool.written;
    return spool;
  }

  private takeLock(): void {
    if (existsSync(this.lockPath)) {
      const pid = Number(readFileSync(this.lockPath, "utf8").trim());
      if (Number.isInteger(pid) && pid > 0 && pid !== process.pid && pidAlive(pid)) throw new Error(`meter spool ${this.dir} is in use by process ${pid}`);
    }
    writeFileSync(this.lockPath, `${process.pid}\n`);
  }

  /** Reads the file, drops a torn last line (a crash mid-append), and returns how many other lines were unreadable. */
  private load(): number {
    if (!existsSync(this.path)) return 0;
    const text = readFileSync(this.path, "utf8");
    const lastNewline = text.lastIndexOf("\n");
    const complete = text.slice(0, lastNewline + 1);
    if (complete.length < text.length) {
      truncateSync(this.path, Buffer.byteLength(complete));
      this.log.warn("meter spool: dropped a torn last line", { dir: this.dir, bytes: text.length - complete.length });
    }
    let corrupt = 0;
    for (const line of complete.split("\n")) {
      if (line === "") continue;
      let value: unknown;
      try {
        value = JSON.parse(line);
      } catch {
        corrupt++;
        continue;
      }
      if (typeof value !== "object" || value === null) {
        corrupt++;
        continue;
      }
      if ("checkpoint" in value) {
        const { seqs, ends } = (value as Checkpoint).checkpoint;
        for (const [vm, seq] of Object.entries(seqs ?? {})) this.bumpSeq(vm, seq);
        for (const [vm, end] of Object.entries(ends ?? {})) this.bumpEnd(vm, end.runId, end.endedAt);
        continue;
      }
      const s = value as MeterSegment;
      if (typeof s.id !== "string" || typeof s.vmId !== "string" || typeof s.seq !== "number") {
        corrupt++;
        continue;
      }
      this.bumpSeq(s.vmId, s.seq);
      this.bumpEnd(s.vmId, s.runId, s.endedAt);
      this.pending.set(s.id, { segment: s, line: `${line}\n`, writeNo: ++this.written });
    }
    if (corrupt > 0) this.log.error("meter spool: unreadable lines skipped", { dir: this.dir, lines: corrupt });
    return corrupt;
  }

  private bumpSeq(vmId: string, seq: number): void {
    if (seq > (this.seqs.get(vmId) ?? -1)) this.seqs.set(vmId, seq);
  }

  private bumpEnd(vmId: string, runId: string, endedAt: string): void {
    const at = Date.parse(endedAt);
    if (Number.isFinite(at) && at >= (this.ends.get(vmId)?.endedAt ?? -Infinity)) this.ends.set(vmId, { runId, endedAt: at });
  }

  lastEnded(vmId: string): LastEnded | undefined {
    return this.ends.get(vmId);
  }

  nextSeq(vmId: string): number {
    const next = (this.seqs.get(vmId) ?? -1) + 1;
    this.seqs.set(vmId, next);
    return next;
  }

  forget(vmId: string): void {
    this.forgotten.add(vmId);
  }

  append(segment: MeterSegment): void {
    if (this.closed) throw new Error("meter spool is closed");
    const line = `${JSON.stringify(segment)}\n`;
    writeSync(this.fd, line);
    this.bumpSeq(segment.vmId, segment.seq);
    this.bumpEnd(segment.vmId, segment.runId, segment.endedAt);
    this.pending.set(segment.id, { segment, line, writeNo: ++this.written });
    this.requestSync();
  }

  /** Group commit: one fdatasync covers every append made before it started. */
  private requestSync(): void {
    if (this.syncing) {
      this.syncAgain = true;
      return;
    }
    const upTo = this.written;
    const fd = this.fd;
    this.syncing = new Promise<void>((resolve) => {
      fdatasync(fd, (err) => {
        this.syncing = undefined;
        if (err) this.log.error("meter spool: fdatasync failed; will retry", { dir: this.dir, err });
        else if (upTo > this.syncedUpTo) this.syncedUpTo = upTo;
        resolve();
        if (this.syncAgain || err) {
          this.syncAgain = false;
          if (!this.closed) this.requestSync();
        }
        if (!err) this.onSynced?.();
      });
    });
  }

  /** Resolves once everything appended so far is on disk. */
  async synced(): Promise<void> {
    while (this.syncedUpTo < this.written) {
      if (!this.syncing) this.requestSync();
      await this.syncing;
    }
  }

  /** Segments on disk and not yet acknowledged, oldest first. */
  shippable(limit: number): MeterSegment[] {
    const out: MeterSegment[] = [];
    for (const e of this.pending.values()) {
      if (e.writeNo > this.syncedUpTo || out.length >= limit) break;
      out.push(e.segment);
    }
    return out;
  }

  get pendingCount(): number {
    return this.pending.size;
  }

  /** The end of the oldest segment not yet acknowledged (ms since the epoch), undefined when none waits: how far shipping lags. */
  oldestPendingEndedAt(): number | undefined {
    for (const e of this.pending.values()) return Date.parse(e.segment.endedAt);
    return undefined;
  }

  /** Billing has these (counted, duplicate or refused for good): drop them, rewriting the file when it pays off. */
  async ack(ids: Iterable<string>): Promise<void> {
    for (const id of ids) if (this.pending.delete(id)) this.ackedInFile++;
    if (this.ackedInFile > 0 && (this.pending.size === 0 || this.ackedInFile >= Math.max(this.compactAfter, this.pending.size))) await this.compact();
  }

  /** Keeps what billing refused next to the spool, so it is not lost silently. */
  recordRejected(rejections: readonly { id: string; code: string; message: string }[], batch: readonly MeterSegment[]): void {
    if (rejections.length === 0) return;
    const byId = new Map(batch.map((s) => [s.id, s]));
    const at = new Date().toISOString();
    appendFileSync(join(this.dir, "rejected.ndjson"), rejections.map((r) => `${JSON.stringify({ at, ...r, segment: byId.get(r.id) })}\n`).join(""));
  }

  /** Rewrites the file as checkpoint + pending segments, atomically (temporary file, fsync, rename, fsync dir). */
  async compact(): Promise<void> {
    while (this.syncing) await this.syncing;
    // from here on synchronous: no append or fdatasync can interleave
    if (this.closed) return;
    const seqs: Record<string, number> = {};
    for (const [vm, seq] of this.seqs) if (!this.forgotten.has(vm)) seqs[vm] = seq;
    const ends: NonNullable<Checkpoint["checkpoint"]["ends"]> = {};
    for (const [vm, end] of this.ends) if (!this.forgotten.has(vm)) ends[vm] = { runId: end.runId, endedAt: new Date(end.endedAt).toISOString() };
    const checkpoint: Checkpoint = { checkpoint: Object.keys(ends).length > 0 ? { seqs, ends } : { seqs } };
    let text = `${JSON.stringify(checkpoint)}\n`;
    for (const e of this.pending.values()) text += e.line;
    const tmp = `${this.path}.tmp`;
    const tfd = openSync(tmp, "w");
    try {
      writeSync(tfd, text);
      fsyncSync(tfd);
    } finally {
      closeSync(tfd);
    }
    renameSync(tmp, this.path);
    syncDir(this.dir);
    closeSync(this.fd);
    this.fd = openSync(this.path, "a");
    for (const vm of this.forgotten) {
      this.seqs.delete(vm);
      this.ends.delete(vm);
    }
    this.forgotten.clear();
    this.syncedUpTo = this.written;
    this.ackedInFile = 0;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    await this.synced();
    if (this.ackedInFile > 0) await this.compact();
    while (this.syncing) await this.syncing;
    this.closed = true;
    closeSync(this.fd);
    rmSync(this.lockPath, { force: true });
  }
}

function syncDir(dir: string): void {
  const fd = openSync(dir, "r");
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

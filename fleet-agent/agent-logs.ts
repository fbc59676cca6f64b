// An agent's log on its host: kept bounded by rotation (one older generation, `<log>.1`), read as a tail across both files, and followed as it grows.
//
// The writers (QEMU's console, a workload's stdout/stderr) hold the log open in append mode and know nothing of this:
// rotation copies the log aside and truncates it in place (drivers/common/vm-process.ts `rotateLog`), and a follow
// notices a rotation by `<log>.1` being a new file, and a truncation by the log being shorter than what it read.
import { closeSync, openSync, readSync, statSync, type Stats } from "node:fs";
import type { LogReadOptions } from "../contracts/fleet.ts";
import { systemClock, type Clock } from "../lib/clock.ts";
import type { Logger } from "../lib/log.ts";
import { LOG_MAX_BYTES, rotatedLogPath, rotateLog } from "./drivers/common/vm-process.ts";

export interface LogLimits {
  /** A log past this size is rotated, bytes. */
  maxBytes: number;
  /** How often the host looks at the logs of its awake agents, ms (a log may pass `maxBytes` by what is written meanwhile). */
  rotateIntervalMs: number;
}

export const defaultLogLimits: LogLimits = { maxBytes: LOG_MAX_BYTES, rotateIntervalMs: 2000 };

/** What the rotation rule needs of the filesystem: a port, so the rule is tested without a disk. */
export interface LogFs {
  /** The file's size, undefined when it does not exist. */
  size(path: string): number | undefined;
  /** Copies the log aside to `<log>.1` and truncates it in place. */
  rotate(path: string): "rotated" | "truncated";
}

export const nodeLogFs: LogFs = {
  size: (path) => statSync(path, { throwIfNoEntry: false })?.size,
  rotate: rotateLog,
};

/** The rule: a log past `maxBytes` is rotated. Answers what was done to it, or undefined when it was left as it is. */
export function rotateIfPast(fs: LogFs, path: string, maxBytes: number): "rotated" | "truncated" | undefined {
  const size = fs.size(path);
  if (size === undefined || size <= maxBytes) return undefined;
  return fs.rotate(path);
}

export interface LogRotatorDeps {
  clock: Clock;
  log: Logger;
  limits: LogLimits;
  /** The logs to look at on each pass (those of awake agents: nothing else writes). */
  paths(): Iterable<string>;
  fs?: LogFs;
}

/** Every `rotateIntervalMs`, one pass over the awake agents' logs that rotates those past the limit; `check` does it for one log on read. */
export class LogRotator {
  private readonly deps: LogRotatorDeps;
  private readonly fs: LogFs;
  private timer: { cancel(): void } | undefined;
  private stopped = false;

  constructor(deps: LogRotatorDeps) {
    this.deps = deps;
    this.fs = deps.fs ?? nodeLogFs;
  }

  start(): void {
    if (this.stopped) return;
    this.timer = this.deps.clock.setTimeout(() => {
      this.pass();
      this.start();
    }, this.deps.limits.rotateIntervalMs);
  }

  stop(): void {
    this.stopped = true;
    this.timer?.cancel();
  }

  /** One pass; answers the logs it rotated. A log that cannot be rotated is told about and left for the next pass. */
  pass(): string[] {
    const rotated: string[] = [];
    for (const path of this.deps.paths()) if (this.check(path)) rotated.push(path);
    return rotated;
  }

  /** Rotates `path` if it is past the limit; true when it did. */
  check(path: string): boolean {
    try {
      const done = rotateIfPast(this.fs, path, this.deps.limits.maxBytes);
      if (done === "truncated") this.deps.log.warn("agent log truncated without keeping it: the copy aside could not be written", { path });
      return done !== undefined;
    } catch (err) {
      this.deps.log.warn("agent log rotation failed", { path, err: err instanceof Error ? err.message : String(err) });
      return false;
    }
  }
}

export interface LogStreamOptions extends LogReadOptions {
  /** How often a follow looks for new bytes, ms. */
  pollMs?: number;
  /** Largest chunk the stream yields, bytes. */
  chunkBytes?: number;
  clock?: Clock;
  /** Asked while a follow waits: true once the agent is gone (deleted), which ends the follow. */
  gone?: () => boolean;
}

/** How far back the start of a tail looks for the end of the line it cut, bytes: a longer line is shown from where it was cut. */
const LINE_SEARCH_BYTES = 64 << 10;

/** A stretch of one of the two files: `old` is `<log>.1`; an open end (`to` undefined) is the follow, on the current file. */
interface Range {
  gen: "cur" | "old";
  from: number;
  to: number | undefined;
}

/**
 * The log at `path` as a stream: its last `tailBytes` (across `<log>.1` and `<log>`, from the start of a line), then,
 * with `follow`, the bytes appended to it as they come: through rotations (what had not been read yet is read from
 * `<log>.1`), truncations (read again from the start) and the file not existing yet (waited for). A follow ends when
 * the consumer cancels, `signal` aborts, or `gone()` says the agent was deleted; a hibernated agent's log just waits.
 *
 * Files are read synchronously, a chunk per pull: in this process nothing rotates a log between looking at its
 * files and reading them, and a chunk is small.
 */
export function openLogStream(path: string, opts: LogStreamOptions): ReadableStream<Uint8Array> {
  const oldPath = rotatedLogPath(path);
  const pollMs = opts.pollMs ?? 250;
  const chunkBytes = opts.chunkBytes ?? 64 << 10;
  const clock = opts.clock ?? systemClock;
  const fileOf = (r: Range) => (r.gen === "old" ? oldPath : path);

  const cur = stat(path);
  const old = stat(oldPath);
  const curSize = cur?.size ?? 0;
  const oldSize = old?.size ?? 0;
  const want = Math.max(0, Math.min(Math.floor(opts.tailBytes), curSize + oldSize));
  let ranges: Range[] = [];
  if (want > curSize) ranges.push({ gen: "old", from: oldSize - (want - curSize), to: oldSize });
  if (want > 0 && curSize > 0) ranges.push({ gen: "cur", from: Math.max(0, curSize - want), to: curSize });
  if (want > 0 && want < curSize + oldSize) toLineStart(ranges, fileOf, oldSize);
  if (opts.follow) ranges.push({ gen: "cur", from: curSize, to: undefined });
  let oldId = identity(old);
  let curIno = cur?.ino;

  let done = opts.signal?.aborted ?? false;
  let cancelled = false;
  let wake: (() => void) | undefined;
  const finish = () => {
    done = true;
    wake?.();
  };
  opts.signal?.addEventListener("abort", finish, { once: true });

  /** Notices a rotation (a new `<log>.1`), a truncation or a replaced file since the last look, and moves the ranges along. */
  function refresh(): void {
    const old = stat(oldPath);
    const id = identity(old);
    if (id !== oldId) {
      oldId = id;
      if (old) {
        // A rotation: what the log held is now `<log>.1`, at the same offsets; the `<log>.1` before it is gone.
        const next: Range[] = [];
        for (const r of ranges) {
          if (r.gen === "old") continue;
          const to = Math.min(r.to ?? old.size, old.size);
          if (r.from < to) next.push({ gen: "old", from: r.from, to });
          if (r.to === undefined) next.push({ gen: "cur", from: 0, to: undefined });
        }
        ranges = next;
      } else {
        ranges = ranges.filter((r) => r.gen !== "old"); // removed: what was left of it is gone
      }
    }
    const cur = stat(path);
    const follow = ranges.at(-1)?.to === undefined ? ranges.at(-1) : undefined;
    if (!cur) {
      curIno = undefined;
      if (follow) follow.from = 0; // not there (yet, or any more): read it from its start once it is
      return;
    }
    if (follow && ((curIno !== undefined && cur.ino !== curIno) || cur.size < follow.from)) follow.from = 0; // replaced, or truncated in place
    curIno = cur.ino;
  }

  /** The next chunk, or undefined when there is nothing (yet). */
  function readChunk(): Uint8Array | undefined {
    while (ranges.length > 0) {
      const r = ranges[0]!;
      const limit = r.to === undefined ? chunkBytes : Math.min(chunkBytes, r.to - r.from);
      if (limit <= 0) {
        ranges.shift();
        continue;
      }
      const bytes = readAt(fileOf(r), r.from, limit);
      if (bytes.length > 0) {
        r.from += bytes.length;
        if (r.to !== undefined && r.from >= r.to) ranges.shift();
        return bytes;
      }
      if (r.to === undefined) return undefined; // the follow: nothing new yet
      ranges.shift(); // shorter than it was (truncated meanwhile): the rest of this stretch is gone
    }
    return undefined;
  }

  function sleep(): Promise<void> {
    return new Promise((resolve) => {
      const timer = clock.setTimeout(() => {
        wake = undefined;
        resolve();
      }, pollMs);
      wake = () => {
        timer.cancel();
        wake = undefined;
        resolve();
      };
    });
  }

  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        for (;;) {
          if (cancelled) return;
          if (done) return controller.close();
          refresh();
          const chunk = readChunk();
          if (chunk) return controller.enqueue(chunk);
          if (ranges.length === 0 || opts.gone?.()) {
            finish();
            return controller.close();
          }
          await sleep();
        }
      },
      cancel() {
        cancelled = true;
        finish();
        opts.signal?.removeEventListener("abort", finish);
      },
    },
    { highWaterMark: 0 },
  );
}

/** Moves the start of `ranges` past the end of the line a tail cut (unless it cut right after one), when it ends within LINE_SEARCH_BYTES. */
function toLineStart(ranges: Range[], fileOf: (r: Range) => string, oldSize: number): void {
  const first = ranges[0];
  if (!first) return;
  const before = first.from > 0 ? readAt(fileOf(first), first.from - 1, 1) : readAt(fileOf({ ...first, gen: "old" }), oldSize - 1, 1);
  if (before[0] === 0x0a) return;
  let skip = 0;
  let found = false;
  for (const r of ranges) {
    const bytes = readAt(fileOf(r), r.from, Math.min(LINE_SEARCH_BYTES - skip, (r.to ?? r.from) - r.from));
    const nl = bytes.indexOf(0x0a);
    if (nl >= 0) {
      skip += nl + 1;
      found = true;
      break;
    }
    skip += bytes.length;
    if (skip >= LINE_SEARCH_BYTES) break;
  }
  if (!found) return;
  while (skip > 0 && ranges.length > 0) {
    const r = ranges[0]!;
    const take = Math.min(skip, r.to! - r.from);
    r.from += take;
    skip -= take;
    if (r.from >= r.to!) ranges.shift();
  }
}

function stat(path: string): Stats | undefined {
  try {
    return statSync(path, { throwIfNoEntry: false });
  } catch {
    return undefined;
  }
}

/**
 * A generation of `<log>.1`: each rotation renames a new file onto it (a new inode, a new ctime), and nothing else
 * writes it. The ctime and size tell a new file from an old one that got a reused inode number.
 */
function identity(st: Stats | undefined): string | undefined {
  return st ? `${st.dev}:${st.ino}:${st.ctimeMs}:${st.size}` : undefined;
}

/** Up to `length` bytes of `path` from `position`; none when it is shorter or missing. */
function readAt(path: string, position: number, length: number): Uint8Array {
  if (length <= 0 || position < 0) return new Uint8Array(0);
  let fd: number | undefined;
  try {
    fd = openSync(path, "r");
    const buf = Buffer.alloc(length);
    const n = readSync(fd, buf, 0, length, position);
    return new Uint8Array(buf.buffer, buf.byteOffset, n);
  } catch {
    return new Uint8Array(0);
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

// Room for a snapshot: every driver that writes one checks the free space of the VM's state directory first and
// refuses early, with the bytes needed and free, instead of filling the disk and failing halfway; a write that still
// runs out of space (something else filled the disk meanwhile) is reported the same way.
import { statfsSync } from "node:fs";

const MiB = 1024 * 1024;

/** Device state, the manifest and the filesystem's own rounding on top of guest memory. */
export const SNAPSHOT_MARGIN_BYTES = 32 * MiB;

/** The snapshot did not fit (or would not): the host keeps the VM running and retries later. */
export class SnapshotNoSpace extends Error {
  override name = "SnapshotNoSpace";
  readonly code = "ENOSPC";
  readonly dir: string;
  readonly neededBytes: number;
  /** Free bytes on the state directory's filesystem when the snapshot began. */
  readonly freeBytes: number;
  /** Set when the write had begun: how far it got before the disk was full. */
  readonly writtenBytes: number | undefined;

  constructor(f: { dir: string; neededBytes: number; freeBytes: number; writtenBytes?: number; said?: string }, opts?: ErrorOptions) {
    const what =
      f.writtenBytes === undefined
        ? `it needs up to ${mib(f.neededBytes)}, ${mib(f.freeBytes)} free; not written`
        : `the disk filled after ${mib(f.writtenBytes)} written, ${mib(f.freeBytes)} free when it began (it needs up to ${mib(f.neededBytes)})`;
    super(`no space for the snapshot in ${f.dir}: ${what}${f.said ? ` (${f.said})` : ""}`, opts);
    this.dir = f.dir;
    this.neededBytes = f.neededBytes;
    this.freeBytes = f.freeBytes;
    this.writtenBytes = f.writtenBytes;
  }
}

/** What the host records of a failed snapshot: the message, and for a full disk its code and byte figures. */
export function snapshotFailureDetail(err: unknown): {
  error: string;
  code?: string;
  neededBytes?: number;
  freeBytes?: number;
  writtenBytes?: number;
  dir?: string;
} {
  const error = err instanceof Error ? err.message : String(err);
  if (!(err instanceof SnapshotNoSpace)) return { error };
  return {
    error,
    code: err.code,
    neededBytes: err.neededBytes,
    freeBytes: err.freeBytes,
    dir: err.dir,
    ...(err.writtenBytes !== undefined ? { writtenBytes: err.writtenBytes } : {}),
  };
}

/** Upper bound of a full snapshot of a guest with `memMiB` of memory: all of it, plus the margin. */
export function snapshotBytesNeeded(memMiB: number): number {
  return memMiB * MiB + SNAPSHOT_MARGIN_BYTES;
}

/**
 * Bytes an unprivileged writer may still use on the filesystem of `dir`; undefined when it cannot be asked. A
 * synchronous statfs (microseconds on a local disk), where a trip through the thread pool cost a hibernation ~3 ms.
 */
export async function freeBytes(dir: string): Promise<number | undefined> {
  try {
    const s = statfsSync(dir);
    return s.bavail * s.bsize;
  } catch {
    return undefined;
  }
}

/**
 * Throws SnapshotNoSpace when `dir`'s filesystem has less than `neededBytes` free; answers the free bytes (undefined
 * when statfs could not tell: the snapshot is then tried, and a full disk is still caught while it is written).
 */
export async function ensureSnapshotSpace(dir: string, neededBytes: number): Promise<number | undefined> {
  const free = await freeBytes(dir);
  if (free !== undefined && free < neededBytes) throw new SnapshotNoSpace({ dir, neededBytes, freeBytes: free });
  return free;
}

/** Whether a hypervisor's words (an error, its log) say the disk was full. */
export function saysNoSpace(text: string): boolean {
  return /No space left on device|ENOSPC|os error 28|Disk quota exceeded|EDQUOT/i.test(text);
}

function mib(bytes: number): string {
  return `${(bytes / MiB).toFixed(1)} MiB (${bytes} bytes)`;
}

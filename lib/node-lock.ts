// A lock file between processes on one machine: written whole under a temporary name and linked into place, holding
// its owner's pid; a dead owner's lock is taken over. `tryLock` asks once, `takeLock` waits for a live owner.
import { closeSync, fsyncSync, linkSync, openSync, readFileSync, renameSync, rmSync, writeSync } from "node:fs";
import { randomBytes } from "node:crypto";

/** Whether a process of this machine runs (EPERM: it runs, as another user). */
export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Lock files this process holds: one naming our pid that is not among them was left by an earlier process that had our pid (a container's pid 1). */
const heldHere = new Set<string>();

/**
 * Takes the lock at `path` if no live process holds it: its release, or the pid of the live holder. The pid is
 * written to a temporary file that is then linked into place, so no reader ever sees an empty lock; a lock of a dead
 * process (or an empty one an older version left) is moved aside by rename, so of two processes taking it over one wins.
 */
export function tryLock(path: string): { release: () => void } | { holder: number } {
  for (let attempt = 0; attempt < 5; attempt++) {
    const tmp = `${path}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
    const fd = openSync(tmp, "wx", 0o600);
    try {
      writeSync(fd, String(process.pid));
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    try {
      linkSync(tmp, path);
      heldHere.add(path);
      let released = false;
      return {
        release: () => {
          if (released) return;
          released = true;
          heldHere.delete(path);
          rmSync(path, { force: true });
        },
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    } finally {
      rmSync(tmp, { force: true });
    }
    const holder = readPid(path);
    if (holder === undefined) continue; // released between our link and our read
    const live = Number.isInteger(holder) && holder > 0 && (holder === process.pid ? heldHere.has(path) : pidAlive(holder));
    if (live) return { holder };
    takeOverStale(path, holder);
  }
  // Others kept taking it between our attempts: as good as held.
  return { holder: readPid(path) ?? 0 };
}

/**
 * Takes the lock at `path`, waiting while a live process holds it (the guest image's build, a Debian base's);
 * answers its release. `onWait` is told once who holds it. An abort stops the wait.
 */
export async function takeLock(path: string, opts: { onWait?: (holder: number) => void; signal?: AbortSignal; pollMs?: number } = {}): Promise<() => void> {
  let announced = false;
  for (;;) {
    opts.signal?.throwIfAborted();
    const got = tryLock(path);
    if ("release" in got) return got.release;
    if (got.holder > 0 && !announced) opts.onWait?.(got.holder);
    announced ||= got.holder > 0;
    await new Promise((r) => setTimeout(r, opts.pollMs ?? 250));
  }
}

function readPid(path: string): number | undefined {
  try {
    return Number(readFileSync(path, "utf8").trim() || "0");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw err;
  }
}

/** Moves a dead holder's lock aside; when what was moved is no longer that holder's (taken over meanwhile), it is linked back for its owner. */
function takeOverStale(path: string, deadPid: number): void {
  const aside = `${path}.stale-${process.pid}-${randomBytes(4).toString("hex")}`;
  try {
    renameSync(path, aside);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return;
    throw err;
  }
  if (readPid(aside) !== deadPid) {
    try {
      linkSync(aside, path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    }
  }
  rmSync(aside, { force: true });
}

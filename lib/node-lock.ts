// A lock file between processes on one machine: created exclusively, holding its owner's pid; a dead owner's lock is taken over.
import { closeSync, openSync, readFileSync, rmSync, statSync, writeSync } from "node:fs";

/** Whether a process of this machine runs (EPERM: it runs, as another user). */
export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * Takes the lock at `path`, waiting while a live process holds it (the guest image's build, a Debian base's);
 * answers its release. `onWait` is told once who holds it. An abort stops the wait.
 */
export async function takeLock(path: string, opts: { onWait?: (holder: number) => void; signal?: AbortSignal; pollMs?: number; now?: () => number } = {}): Promise<() => void> {
  const now = opts.now ?? Date.now;
  let announced = false;
  for (;;) {
    opts.signal?.throwIfAborted();
    try {
      const fd = openSync(path, "wx");
      writeSync(fd, String(process.pid));
      closeSync(fd);
      return () => rmSync(path, { force: true });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    }
    let holder = 0;
    let ageMs = 0;
    try {
      holder = Number(readFileSync(path, "utf8").trim() || "0");
      ageMs = now() - statSync(path).mtimeMs;
    } catch {
      continue; // released between our open and our read
    }
    // An empty file is a lock being written this instant (open, then write), unless it has been empty for long.
    if ((holder && !pidAlive(holder)) || (!holder && ageMs > 10_000)) {
      rmSync(path, { force: true }); // left by a build that died
      continue;
    }
    if (holder && !announced) opts.onWait?.(holder);
    announced ||= holder > 0;
    await new Promise((r) => setTimeout(r, opts.pollMs ?? 250));
  }
}

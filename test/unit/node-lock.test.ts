// The lock file between processes (lib/node-lock.ts): one holder at a time, a dead or empty lock taken over, a live one waited for or refused.
import { afterEach, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { takeLock, tryLock } from "../../lib/node-lock.ts";

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});
const lockIn = () => {
  const dir = mkdtempSync(join(tmpdir(), "node-lock-"));
  dirs.push(dir);
  return join(dir, "x.lock");
};
/** A pid no process has now: one that ran and exited. */
const deadPid = () => spawnSync(process.execPath, ["-e", "0"]).pid!;

describe("lock files", () => {
  it("one holder at a time; the holder's pid is in the file; released, it can be taken again; no temporary files stay", () => {
    const path = lockIn();
    const first = tryLock(path);
    expect("release" in first).toBe(true);
    expect(readFileSync(path, "utf8")).toBe(String(process.pid));
    expect(tryLock(path)).toEqual({ holder: process.pid });
    (first as { release: () => void }).release();
    const again = tryLock(path);
    expect("release" in again).toBe(true);
    (again as { release: () => void }).release();
    expect(readdirSync(join(path, ".."))).toEqual([]);
  });

  it("takes over the lock of a dead process, an empty one, and one naming this pid that this process never took", () => {
    for (const stale of [String(deadPid()), "", String(process.pid)]) {
      const path = lockIn();
      writeFileSync(path, stale);
      const got = tryLock(path);
      expect("release" in got, `stale lock "${stale}"`).toBe(true);
      expect(readFileSync(path, "utf8")).toBe(String(process.pid));
      (got as { release: () => void }).release();
    }
  });

  it("takeLock waits while the holder is alive and takes it once released, telling who held it", async () => {
    const path = lockIn();
    const held = tryLock(path) as { release: () => void };
    const told: number[] = [];
    let got = false;
    const waiting = takeLock(path, { pollMs: 10, onWait: (h) => told.push(h) }).then((release) => {
      got = true;
      return release;
    });
    await new Promise((r) => setTimeout(r, 60));
    expect(got).toBe(false);
    held.release();
    const release = await waiting;
    expect(told).toEqual([process.pid]);
    release();
  });
});

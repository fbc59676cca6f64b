// What the host reads from disk: the VM directories an earlier host process left, whether one agent's exists, a log's tail.
import { closeSync, existsSync, fstatSync, openSync, readdirSync, readSync } from "node:fs";

/**
 * A port so the host's rules can be tested without a disk. Synchronous on purpose: both questions are asked
 * once per agent (at start, and when the host first hears of an agent) and answer from the directory cache.
 */
export interface HostFs {
  /** Names of the directories directly under `vmsDir` (one per agent); none when `vmsDir` does not exist. */
  vmDirs(vmsDir: string): string[];
  /** Whether an agent's state directory exists: it may hold a snapshot to restore from. */
  hasStateDir(stateDir: string): boolean;
  /** The last `maxBytes` of a file as text ("" when it does not exist): the console tail an operator's event shows. */
  tail(path: string, maxBytes: number): string;
}

export const nodeHostFs: HostFs = {
  vmDirs(vmsDir) {
    if (!existsSync(vmsDir)) return [];
    return readdirSync(vmsDir, { withFileTypes: true })
      .filter((d) => d.isDirectory())
      .map((d) => d.name);
  },
  hasStateDir(stateDir) {
    return existsSync(stateDir);
  },
  tail(path, maxBytes) {
    let fd: number | undefined;
    try {
      fd = openSync(path, "r");
      const size = fstatSync(fd).size;
      const length = Math.min(size, maxBytes);
      const buf = Buffer.alloc(length);
      readSync(fd, buf, 0, length, size - length);
      return buf.toString("utf8");
    } catch {
      return "";
    } finally {
      if (fd !== undefined) closeSync(fd);
    }
  },
};

// What the host reads from disk: the VM directories an earlier host process left, and whether one agent's exists.
import { existsSync, readdirSync } from "node:fs";

/**
 * A port so the host's rules can be tested without a disk. Synchronous on purpose: both questions are asked
 * once per agent (at start, and when the host first hears of an agent) and answer from the directory cache.
 */
export interface HostFs {
  /** Names of the directories directly under `vmsDir` (one per agent); none when `vmsDir` does not exist. */
  vmDirs(vmsDir: string): string[];
  /** Whether an agent's state directory exists: it may hold a snapshot to restore from. */
  hasStateDir(stateDir: string): boolean;
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
};

// Where an agent's state directory is under a system's data directory (`…/vms/<agentId>` at some depth): for figures of its files (snapshot, RAM file).
import { readdirSync } from "node:fs";
import { join } from "node:path";

/** The first directory named `agentId` at most `depth + 1` levels below `dataDir`; undefined when there is none. */
export function agentStateDir(dataDir: string, agentId: string, depth = 4): string | undefined {
  for (const n of readdirSync(dataDir, { withFileTypes: true })) {
    if (!n.isDirectory()) continue;
    if (n.name === agentId) return join(dataDir, n.name);
    const hit = depth > 0 ? agentStateDir(join(dataDir, n.name), agentId, depth - 1) : undefined;
    if (hit) return hit;
  }
  return undefined;
}

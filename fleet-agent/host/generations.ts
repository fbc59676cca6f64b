// Disk generations: the lease generation this host last ran each agent under, kept beside the VMs' directories so a restart knows it.
import { mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";

/** One file per agent, `<vmsDir>/../leases/<agentId>`, holding the generation (written whole by rename). */
export class DiskGenerations {
  private readonly dir: string;

  constructor(vmsDir: string) {
    this.dir = join(dirname(vmsDir), "leases");
  }

  private path(agentId: string): string {
    return join(this.dir, agentId);
  }

  /** The lease generation this host last ran the agent under (0 when it never was moved here). */
  read(agentId: string): number {
    try {
      const n = Number(readFileSync(this.path(agentId), "utf8").trim());
      return Number.isSafeInteger(n) && n >= 0 ? n : 0;
    } catch {
      return 0;
    }
  }

  write(agentId: string, generation: number): void {
    const path = this.path(agentId);
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(`${path}.tmp`, `${generation}\n`);
    renameSync(`${path}.tmp`, path);
  }

  /** The agent's state here is gone: so is the generation it ran under. */
  forget(agentId: string): void {
    rmSync(this.path(agentId), { force: true });
  }
}

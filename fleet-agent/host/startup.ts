// Recovery at the host's start: what an earlier process of it left on disk (VM processes, half-written checkpoints).
import { existsSync, readdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "../../lib/log.ts";
import { isId } from "../../lib/ids.ts";
import type { VmDriver } from "../drivers/driver.ts";
import type { HostFs } from "../host-fs.ts";
import { checkpointDir, type CheckpointStore } from "../checkpoints.ts";
import type { VmTable } from "./vms.ts";

export interface StartupDeps {
  /** Root of this host's VM state directories (`<dir>/<agentId>`). */
  vmsDir: string;
  /** Where checkpoints' files go (`<dir>/<ckp_id>`). */
  checkpointsDir: string;
  fs: HostFs;
  driver: Pick<VmDriver, "reap">;
  log: Logger;
  vms: Pick<VmTable, "bareSpec">;
  /** The checkpoints' rows; none: this host takes none, and sweeps none. */
  checkpoints?: Pick<CheckpointStore, "liveOf">;
}

export class Startup {
  private readonly deps: StartupDeps;

  constructor(deps: StartupDeps) {
    this.deps = deps;
  }

  /** Cleans up VM processes an earlier host process left behind (their snapshots stay), and the checkpoints a crash left half-written or without a row. */
  async cleanUp(): Promise<void> {
    const { vmsDir, checkpointsDir } = this.deps;
    for (const agentId of this.deps.fs.vmDirs(vmsDir)) {
      await this.deps.driver.reap(this.deps.vms.bareSpec(agentId)).catch((err) => this.deps.log.warn("reaping a leftover VM failed", { agentId, err }));
    }
    // A checkpoint is written under `<id>.tmp-…` and renamed into place: what a crash left half-written is no checkpoint.
    const kept: string[] = [];
    for (const name of existsSync(checkpointsDir) ? readdirSync(checkpointsDir) : []) {
      if (name.includes(".tmp-")) rmSync(join(checkpointsDir, name), { recursive: true, force: true });
      else if (isId("checkpoint", name)) kept.push(name);
    }
    await this.sweepCheckpoints(kept);
  }

  /**
   * Removes checkpoint directories without a live row: a crash between a checkpoint's rename and its row, or an agent
   * (with its checkpoints' rows) deleted while this host was not live. Skipped, and said, when the rows cannot be read.
   */
  private async sweepCheckpoints(ids: string[]): Promise<void> {
    const store = this.deps.checkpoints;
    if (!store || ids.length === 0) return;
    let live: Set<string>;
    try {
      live = await store.liveOf(ids);
    } catch (err) {
      this.deps.log.warn("checkpoint directories not swept: their rows cannot be read now", { err: err instanceof Error ? err.message : String(err) });
      return;
    }
    for (const id of ids) {
      if (live.has(id)) continue;
      rmSync(checkpointDir(this.deps.checkpointsDir, id), { recursive: true, force: true });
      this.deps.log.info("removed a checkpoint directory without a live row", { checkpointId: id });
    }
  }
}

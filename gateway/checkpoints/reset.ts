// An agent's reset: rolled back to the checkpoint it was forked from (`agents.forked_from`), as one RL episode ends and the next starts.
import { AppError } from "../../lib/errors.ts";
import type { Fleet } from "../../contracts/fleet.ts";
import type { VmState } from "../../contracts/agent.ts";
import { agentSpec, type AgentRow } from "../agents/repo.ts";
import type { CheckpointRepo } from "./repo.ts";

export interface ResetResult {
  state: VmState;
  checkpointId: string;
  /** How long the roll-back took, ms (the agent stopped if awake, its snapshot and disk replaced by the checkpoint's). */
  resetMs: number;
}

/**
 * Rolls `row` back to its `forkedFrom` checkpoint through `Fleet.restoreCheckpoint`: it is left hibernated on the
 * checkpoint, and its next call (or wake) restores it. 409 conflict for an agent that was not forked, or whose
 * checkpoint was deleted since; 501 when the fleet keeps no checkpoints.
 */
export async function resetToFork(fleet: Fleet, checkpoints: CheckpointRepo | undefined, row: AgentRow, requestId?: string): Promise<ResetResult> {
  if (row.forkedFrom === null) throw new AppError("conflict", `agent ${row.id} was not forked from a checkpoint: it has nothing to reset to`);
  const restore = fleet.restoreCheckpoint;
  if (!restore || !checkpoints) throw new AppError("checkpoints_unsupported", "this gateway's fleet keeps no checkpoints");
  const ckp = await checkpoints.get(row.forkedFrom);
  if (!ckp || ckp.tenantId !== row.tenantId)
    throw new AppError("conflict", `agent ${row.id}'s checkpoint ${row.forkedFrom} was deleted: it has nothing to reset to`);
  const started = Date.now();
  const state = await restore.call(fleet, agentSpec(row), ckp.id, requestId);
  return { state, checkpointId: ckp.id, resetMs: Date.now() - started };
}

// The VM lifecycle of DESIGN.md as a transition table; the host refuses any move not listed here.
import type { VmState } from "../contracts/agent.ts";

// `hibernated` from creating (a fork), stopped, failed and hibernated itself (a restore to a checkpoint): the driver
// made the state directory a snapshot to wake from.
const allowed: Record<VmState, readonly VmState[]> = {
  creating: ["booting", "hibernated", "destroyed"],
  booting: ["running", "failed", "destroyed"],
  running: ["snapshotting", "stopped", "failed", "destroyed"],
  snapshotting: ["hibernated", "running", "failed", "destroyed"],
  hibernated: ["restoring", "destroyed", "stopped", "hibernated"],
  restoring: ["running", "booting", "failed", "destroyed"],
  stopped: ["booting", "restoring", "hibernated", "destroyed"],
  failed: ["booting", "restoring", "hibernated", "destroyed"],
  destroyed: [],
};

export function canTransition(from: VmState, to: VmState): boolean {
  return allowed[from].includes(to);
}

export class IllegalTransition extends Error {
  override name = "IllegalTransition";
  constructor(from: VmState, to: VmState) {
    super(`illegal VM transition ${from} → ${to}`);
  }
}

/** States in which the VM's process holds host resources and can serve. */
export function isAwake(state: VmState): boolean {
  return state === "running";
}

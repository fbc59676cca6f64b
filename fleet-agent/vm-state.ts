// The VM lifecycle of DESIGN.md as a transition table; the host refuses any move not listed here.
import type { VmState } from "../contracts/agent.ts";

const allowed: Record<VmState, readonly VmState[]> = {
  creating: ["booting", "destroyed"],
  booting: ["running", "failed", "destroyed"],
  running: ["snapshotting", "stopped", "failed", "destroyed"],
  snapshotting: ["hibernated", "running", "failed", "destroyed"],
  hibernated: ["restoring", "destroyed", "stopped"],
  restoring: ["running", "booting", "failed", "destroyed"],
  stopped: ["booting", "restoring", "destroyed"],
  failed: ["booting", "restoring", "destroyed"],
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

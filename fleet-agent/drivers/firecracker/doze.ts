// A doze on the firecracker driver (VmDriver.pause/resume): `PATCH /vm Paused` stops the vCPUs and keeps the process,
// guest memory, the tap (so every TCP connection of the guest) and the vsock channel; `Resumed` runs them again and
// the guest clock, which stood still with them, is set through the guest agent as after a wake.
//
// What the rest of the driver makes of a dozing VM (`Live.dozing`): a hibernation or checkpoint ends the doze first
// (`endDozeFor`: the host resumes before either, this only keeps the driver honest if it did not); a stop resumes it so
// that the guest can take Ctrl-Alt-Del (supervisor.ts); `cpuSeconds` reads the process as ever; the guest agent's
// questions are answered without it (its leases as it last said, no checkpoint requests: a stopped guest changes
// neither).
import type { Logger } from "../../../lib/log.ts";
import { fixGuestClock } from "../common/guest-agent.ts";
import { askAgent } from "./guest.ts";
import type { Live } from "./supervisor.ts";

/** How long the resumed guest's first answer to the clock fix may take (asked again every 500 ms meanwhile). */
const FIRST_ANSWER_WITHIN_MS = 10_000;

export interface DozeDeps {
  log: Logger;
  agentPort: number;
  clockTargetMs: number;
}

/** `PATCH /vm Paused` (answered once the vCPUs are stopped), confirmed by the instance's state. A dozing VM is left as it is. */
export async function pauseVm(live: Live): Promise<void> {
  if (live.dozing) return;
  await live.api.pause();
  live.dozing = true;
  const { state } = await live.api.describeInstance();
  if (state !== "Paused") throw new Error(`VM ${live.vm.spec.vmId} is ${state} after PATCH /vm Paused`);
}

/**
 * `PATCH /vm Resumed`, then the clock fix of a wake over the guest agent's vsock channel (kept through the pause).
 * A guest that does not answer it runs on with its clock behind by the doze, logged: the VM is running, and failing
 * the resume would not fix the clock. Rejects only when Firecracker refuses to resume.
 */
export async function resumeVm(live: Live, deps: DozeDeps): Promise<{ clockFixMs: number }> {
  const started = performance.now();
  if (!live.dozing) return { clockFixMs: 0 };
  await live.api.resume();
  live.dozing = false;
  try {
    // The same process on the same tap: the guest skips its neighbour check.
    const fix = { targetMs: deps.clockTargetMs, sameNetwork: true, firstAnswerWithinMs: FIRST_ANSWER_WITHIN_MS };
    const clock = await askAgent(live, deps.agentPort, (agent) => fixGuestClock(agent, fix));
    if (Math.abs(clock.skewAfterMs) >= deps.clockTargetMs) deps.log.warn("guest clock still off after a doze", { vmId: live.vm.spec.vmId, ...clock });
    return { clockFixMs: clock.clockFixMs };
  } catch (err) {
    deps.log.error("guest clock not fixed after a doze: it is behind by the doze", { vmId: live.vm.spec.vmId, err });
    return { clockFixMs: performance.now() - started };
  }
}

/** Before a hibernation or checkpoint: a dozing VM runs again (clock fixed) and goes the running VM's way. */
export async function endDozeFor(live: Live, deps: DozeDeps, what: string): Promise<void> {
  if (!live.dozing) return;
  deps.log.warn(`${what} of a dozing VM: resumed first`, { vmId: live.vm.spec.vmId });
  await resumeVm(live, deps);
}

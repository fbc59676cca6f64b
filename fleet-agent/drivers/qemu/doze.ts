// A doze on the qemu driver (VmDriver.pause/resume): QMP `stop` keeps the QEMU process, guest RAM and the user
// network's state (every TCP connection of the guest, held by slirp) and only stops the vCPUs; `cont` runs them again
// and the guest clock, which stood still with them, is set through the guest agent as after a wake.
//
// What the rest of the driver makes of a dozing VM (`QemuVm.dozing`): a hibernation or checkpoint ends the doze
// first (`endDozeFor`: the host resumes before either, this only keeps the driver honest if it did not); a stop lets
// a built image's guest run for its flush (supervisor.ts `quitRunning`); a destroy just quits; `cpuSeconds` reads the
// process as ever; the guest agent's questions are answered without it (its leases as it last said, no checkpoint
// requests: a stopped guest changes neither). A QEMU kept after a hibernation (`pausedAt`) is a different thing:
// never a running VM, never dozing.
import type { Logger } from "../../../lib/log.ts";
import { fixGuestClock } from "../common/guest-agent.ts";
import { contAfterMigration } from "./qmp.ts";
import type { QemuVm } from "./vm.ts";

/** How long the resumed guest's first answer to the clock fix may take (asked again every 500 ms meanwhile). */
const FIRST_ANSWER_WITHIN_MS = 10_000;

/**
 * QMP `stop`, answered once the vCPUs are stopped; `query-status` then confirms it (one more local round trip). A
 * dozing VM is left as it is.
 */
export async function pauseVm(vp: QemuVm): Promise<void> {
  if (vp.dozing) return;
  const qmp = vp.qmp!;
  await qmp.execute("stop");
  vp.dozing = true;
  const status = await qmp.execute("query-status");
  if (status.running) throw new Error(`VM ${vp.spec.vmId} still runs after QMP stop (status ${status.status})`);
}

/**
 * `cont` (retried while a checkpoint's migration still holds the VM), then the clock fix of a wake: set from the
 * host's clock until the skew left is under `clockTargetMs`/2 (common/guest-agent.ts `fixGuestClock`). A guest that
 * does not answer it runs on with its clock behind by the doze, logged: the VM is running, and failing the resume
 * would not fix the clock. Rejects only when QEMU refuses `cont` (then the VM's state is unknown).
 */
export async function resumeVm(vp: QemuVm, log: Logger, clockTargetMs = 50): Promise<{ clockFixMs: number }> {
  const started = performance.now();
  if (!vp.dozing) return { clockFixMs: 0 };
  await contAfterMigration(vp.qmp!);
  vp.dozing = false;
  try {
    // Same QEMU, same forwarded addresses: the guest skips its neighbour check.
    const clock = await fixGuestClock(vp.agent!, { targetMs: clockTargetMs, sameNetwork: true, firstAnswerWithinMs: FIRST_ANSWER_WITHIN_MS });
    if (Math.abs(clock.skewAfterMs) >= clockTargetMs) log.warn("guest clock still off after a doze", { vmId: vp.spec.vmId, ...clock });
    return { clockFixMs: clock.clockFixMs };
  } catch (err) {
    log.error("guest clock not fixed after a doze: it is behind by the doze", { vmId: vp.spec.vmId, err });
    return { clockFixMs: performance.now() - started };
  }
}

/** Before a hibernation or checkpoint: a dozing VM runs again (clock fixed) and goes the running VM's way. */
export async function endDozeFor(vp: QemuVm, log: Logger, what: string): Promise<void> {
  if (!vp.dozing) return;
  log.warn(`${what} of a dozing VM: resumed first`, { vmId: vp.spec.vmId });
  await resumeVm(vp, log);
}

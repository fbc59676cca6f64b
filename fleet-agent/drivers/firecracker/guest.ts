// The guest agent of a running Firecracker VM over vsock: one request (the channel reopened once when it failed), the
// SYNC before a snapshot of a built image's VM, and the clock set again after a pause.
import type { Logger } from "../../../lib/log.ts";
import { fixGuestClock, type GuestAgentClient } from "../common/guest-agent.ts";
import type { FirecrackerDriverOptions } from "./options.ts";
import type { Live } from "./supervisor.ts";
import { waitForGuestAgent } from "./vsock.ts";

const SYNC_TIMEOUT_MS = 10_000;

/** What the guest's requests need: the agent's vsock port, the log, and the options of the request made. */
export interface GuestDeps<K extends keyof FirecrackerDriverOptions> {
  opts: Pick<FirecrackerDriverOptions, K>;
  log: Logger;
  agentPort: number;
}

type GuestOf = Pick<Live, "agent" | "paths" | "proc" | "vm">;

/** One request to the guest agent over its (re)opened vsock channel; a failed channel is reopened and asked once more. */
export async function askAgent<T>(live: GuestOf, agentPort: number, ask: (agent: GuestAgentClient) => Promise<T>): Promise<T> {
  for (let attempt = 0; ; attempt++) {
    try {
      live.agent ??= await waitForGuestAgent(live.paths.vsock, agentPort, { deadlineMs: 2000, gaveUp: () => live.proc.exitedWhy("firecracker") });
      return await ask(live.agent);
    } catch (err) {
      live.agent?.close();
      live.agent = undefined;
      if (attempt >= 1) throw err;
    }
  }
}

/** Asks the guest to flush its disks (SYNC); a failure is logged, not fatal: the snapshot still pairs memory and disk. */
export async function syncGuest(live: GuestOf, deps: GuestDeps<"syncTimeoutMs">): Promise<void> {
  const t0 = performance.now();
  try {
    live.agent ??= await waitForGuestAgent(live.paths.vsock, deps.agentPort, { deadlineMs: 2000, gaveUp: () => live.proc.exitedWhy("firecracker") });
    await live.agent.sync(deps.opts.syncTimeoutMs ?? SYNC_TIMEOUT_MS);
    deps.log.debug("guest synced", { vmId: live.vm.spec.vmId, ms: Math.round(performance.now() - t0) });
  } catch (err) {
    deps.log.warn("guest sync before the snapshot failed; snapshotting anyway", { vmId: live.vm.spec.vmId, err });
  }
}

/** After a pause the guest's clock is behind by it (as after a wake): reconnected and set; a failure is logged only. */
export async function fixClockAfterPause(live: GuestOf, deps: GuestDeps<"restoreTimeoutMs" | "clockTargetMs">): Promise<void> {
  try {
    live.agent = await waitForGuestAgent(live.paths.vsock, deps.agentPort, {
      deadlineMs: deps.opts.restoreTimeoutMs ?? 10_000,
      gaveUp: () => live.proc.exitedWhy("firecracker"),
    });
    const clock = await fixGuestClock(live.agent, { targetMs: deps.opts.clockTargetMs ?? 50, sameNetwork: true }); // the same process
    deps.log.debug("guest clock fixed after a pause", { vmId: live.vm.spec.vmId, ...clock });
  } catch (err) {
    deps.log.warn("could not fix the guest clock after a checkpoint", { vmId: live.vm.spec.vmId, err });
  }
}

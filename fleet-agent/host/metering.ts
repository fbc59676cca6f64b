// The host's metering hooks: when a VM's active time starts and ends (the activity listener the meters hear), and when its run ends (the event log, and the run record a later restore compares its snapshot with).
import type { Clock } from "../../lib/clock.ts";
import type { Logger } from "../../lib/log.ts";
import type { SleepReason, WakeReason } from "../../contracts/agent.ts";
import type { ActivityListener } from "../activity.ts";
import type { EventLog } from "../event-log.ts";
import type { VmEntry } from "../vm-entry.ts";
import type { RunRecords } from "./rollbacks.ts";

export interface MeteringDeps {
  hostId: string;
  clock: Clock;
  activity: ActivityListener;
  events: Pick<EventLog, "runEnded">;
  /** Each VM's last run (host/rollbacks.ts): its end is recorded too. */
  records: RunRecords;
  log: Logger;
}

export class Metering {
  private readonly deps: MeteringDeps;

  constructor(deps: MeteringDeps) {
    this.deps = deps;
  }

  /** The VM is active (running) from now, in its current run. */
  startActivity(entry: VmEntry, reason: WakeReason): void {
    const { clock } = this.deps;
    this.deps.activity.active({
      at: clock.now(),
      mono: clock.monotonic(),
      hostId: this.deps.hostId,
      vmId: entry.vmSpec.vmId,
      agentId: entry.spec.id,
      tenantId: entry.spec.tenantId,
      runId: entry.runId!,
      vcpus: entry.vmSpec.vcpus,
      memMiB: entry.vmSpec.memMiB,
      reason,
    });
  }

  endActivity(entry: VmEntry, reason: SleepReason): void {
    this.deps.activity.inactive({ at: this.deps.clock.now(), mono: this.deps.clock.monotonic(), vmId: entry.vmSpec.vmId, reason });
  }

  /** The VM dozes (`true`: its active time stops, a dozing segment starts) or runs again, in the same run. */
  doze(entry: VmEntry, dozing: boolean): void {
    this.deps.activity.doze?.({ at: this.deps.clock.now(), mono: this.deps.clock.monotonic(), vmId: entry.vmSpec.vmId, dozing });
  }

  /** Ends the VM's run now; answers when (undefined: it had none). */
  endRun(entry: VmEntry, reason: SleepReason): Date | undefined {
    const runId = entry.runId;
    if (!runId) return undefined;
    entry.runId = undefined;
    const at = new Date(this.deps.clock.now());
    this.deps.events.runEnded(runId, at, reason);
    try {
      this.deps.records.write(entry.vmSpec.stateDir, { runId, wokeAt: entry.lastWakeAt ?? at.getTime(), endedAt: at.getTime() });
    } catch (err) {
      this.deps.log.warn("the run's end could not be recorded: a rollback to before it would be told as estimated", { agentId: entry.spec.id, err });
    }
    return at;
  }
}

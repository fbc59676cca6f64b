// Hibernation: a running VM's snapshot (cancelled by a call that arrives meanwhile), its commit to the shared store, and what a failed one leaves.
import type { Clock } from "../../lib/clock.ts";
import type { Logger } from "../../lib/log.ts";
import { seconds, type Metrics } from "../../lib/metrics.ts";
import type { SleepReason } from "../../contracts/agent.ts";
import type { RunningVm, VmDriver } from "../drivers/driver.ts";
import { snapshotFailureDetail } from "../drivers/common/snapshot-space.ts";
import type { SnapshotShipper } from "../artifacts/shipper.ts";
import type { EventLog } from "../event-log.ts";
import { defaultHibernateRetry, hibernateRetryMs, type HibernateRetry } from "../reaper.ts";
import type { VmEntry } from "../vm-entry.ts";
import type { Lifecycle } from "./lifecycle.ts";
import type { Metering } from "./metering.ts";
import { round } from "./ms.ts";

export interface HibernationDeps {
  clock: Clock;
  log: Logger;
  metrics: Metrics;
  driver: Pick<VmDriver, "hibernate" | "stop">;
  events: Pick<EventLog, "hold">;
  lifecycle: Pick<Lifecycle, "move">;
  metering: Pick<Metering, "startActivity" | "endActivity" | "endRun">;
  /** Backoff of the idle reaper after a failed hibernate (default 30 s doubling to 10 min). */
  hibernateRetry?: HibernateRetry;
  /** The shared artifact store each hibernation is committed to in the background; none: snapshots stay here. */
  shipper?: Pick<SnapshotShipper, "commit">;
  /** Whether checkpoint work on the agent is under way or queued. */
  checkpointWorkOn(agentId: string): boolean;
}

export class Hibernation {
  private readonly deps: HibernationDeps;

  constructor(deps: HibernationDeps) {
    this.deps = deps;
  }

  /** Hibernates a running VM (a snapshot under way is shared); resolves when it is hibernated, or kept awake. */
  hibernate(entry: VmEntry, reason: SleepReason): Promise<void> {
    const { lifecycle, metering, metrics } = this.deps;
    if (entry.hibernation) return entry.hibernation.promise;
    // The idle reaper's next pass tries again; the other callers waited for the checkpoint work before they came here.
    if (this.deps.checkpointWorkOn(entry.spec.id)) return Promise.resolve();
    const vm = entry.running;
    if (entry.state !== "running" || !vm) return Promise.resolve();
    const abort = new AbortController();
    // The driver's steps first: the event log's writes (this transition's among them) wait until it answers, so an
    // embedded database's CPU time does not land between `stop` and the snapshot's commit (event-log.ts `hold`).
    const release = this.deps.events.hold();
    lifecycle.move(entry, "snapshot", reason);
    metering.endActivity(entry, reason);
    const promise = (async () => {
      try {
        const result = await this.deps.driver.hibernate(vm, abort.signal).finally(release);
        if (entry.running !== vm) return; // crashed meanwhile: the exit handler recorded it
        if (result.completed) {
          entry.running = undefined;
          entry.hibernateFailures = 0;
          entry.hibernateRetryAt = undefined;
          entry.lastHibernateError = undefined;
          lifecycle.move(entry, "snapshotted", reason, { snapshotMs: round(result.snapshotMs), snapshotBytes: result.bytes });
          metrics.inc("agentvm_snapshot_bytes_total", {}, result.bytes);
          metrics.observe("agentvm_snapshot_seconds", { reason }, seconds(result.snapshotMs));
          const sleptAt = metering.endRun(entry, reason);
          // In the background: the snapshot here is enough to wake here. The commit's time is the run's end, which
          // placement compares to tell whether the store has the agent's last state (gateway/placement.ts `carryable`).
          if (sleptAt)
            void this.deps.shipper
              ?.commit({ spec: entry.spec, vmSpec: entry.vmSpec, generation: entry.generation, snapshotAt: sleptAt })
              .catch(() => undefined);
        } else {
          lifecycle.move(entry, "resume", "cancelled");
          entry.lastActivityAt = this.deps.clock.monotonic();
          metering.startActivity(entry, "request");
        }
      } catch (err) {
        // The driver resumed the VM (or ended it, and its exit handler recorded that): it keeps its state.
        if (entry.running !== vm || entry.state !== "snapshotting") return;
        this.hibernateFailed(entry, reason, err);
        if (reason === "shutdown") await this.stopAfterFailedShutdownSnapshot(entry, vm);
      } finally {
        entry.hibernation = undefined;
      }
    })();
    entry.hibernation = { promise, abort };
    return promise;
  }

  /**
   * A snapshot that could not be written leaves the VM as it was: running, metered again (as after a cancelled
   * snapshot), the failure in the event log and the host's status with its real cause, and no new idle attempt
   * before a backoff that grows with every failure in a row.
   */
  private hibernateFailed(entry: VmEntry, reason: SleepReason, err: unknown): void {
    const { clock } = this.deps;
    const detail = snapshotFailureDetail(err);
    const attempts = ++entry.hibernateFailures;
    this.deps.metrics.inc("agentvm_hibernate_failures_total", {});
    const retryInMs = hibernateRetryMs(attempts, this.deps.hibernateRetry ?? defaultHibernateRetry);
    entry.hibernateRetryAt = clock.monotonic() + retryInMs;
    const { error, code, neededBytes, freeBytes } = detail;
    entry.lastHibernateError = { at: clock.now(), message: error, code, neededBytes, freeBytes, attempts, retryAt: clock.now() + retryInMs };
    this.deps.log.error("hibernate failed; the VM stays awake", { agentId: entry.spec.id, vmId: entry.vmSpec.vmId, reason, ...detail, attempts, retryInMs });
    this.deps.lifecycle.move(entry, "resume", "hibernate_failed", undefined, { ...detail, sleepReason: reason, attempts, retryInMs });
    this.deps.metering.startActivity(entry, "request");
  }

  /** At shutdown there is no later attempt: the VM is stopped, and the event log says what its last snapshot misses. */
  private async stopAfterFailedShutdownSnapshot(entry: VmEntry, vm: RunningVm): Promise<void> {
    await this.deps.driver.stop(vm).catch((err) => this.deps.log.warn("stop failed", { agentId: entry.spec.id, err }));
    if (entry.running !== vm || entry.state !== "running") return;
    entry.running = undefined;
    this.deps.metering.endActivity(entry, "shutdown");
    this.deps.lifecycle.move(entry, "stop", "shutdown", undefined, { error: "hibernate failed at shutdown: what the VM did since its last snapshot is lost" });
    this.deps.metering.endRun(entry, "shutdown");
  }
}

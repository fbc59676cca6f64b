// The idle reaper: every interval, one pass over the running VMs that hibernates those the idle rule lets go.
import type { Clock } from "../lib/clock.ts";
import type { Logger } from "../lib/log.ts";
import type { VmDriver } from "./drivers/driver.ts";
import { idleVerdict } from "./idle.ts";
import { liveLeases } from "./leases.ts";
import type { VmEntry } from "./vm-entry.ts";

export interface ReaperDeps {
  clock: Clock;
  driver: Pick<VmDriver, "guestLeases" | "cpuSeconds">;
  log: Logger;
  intervalMs: number;
  /** Guest CPU fraction at or above which a VM counts as busy. */
  cpuBusyThreshold: number;
  /** The host's VMs at the start of a pass. */
  vms(): Iterable<VmEntry>;
  /** Puts an idle VM to sleep (reason `idle`, or `drain` while draining; a dozing one runs again first); a pass does not wait for the snapshot. */
  hibernate(entry: VmEntry, reason: "idle" | "drain"): void;
  /** Whether the host is draining: then every running VM with no request open sleeps at once (leases and timeouts aside). */
  draining?(): boolean;
}

export class IdleReaper {
  private readonly deps: ReaperDeps;
  private timer: { cancel(): void } | undefined;
  private running: Promise<void> | undefined;
  private stopped = false;

  constructor(deps: ReaperDeps) {
    this.deps = deps;
  }

  /** Schedules passes one interval apart, each counted from the end of the one before, so passes never overlap. */
  start(): void {
    if (this.stopped) return;
    this.timer = this.deps.clock.setTimeout(() => {
      this.running = this.pass()
        .catch((err) => this.deps.log.error("idle reaper failed", { err }))
        .finally(() => {
          this.running = undefined;
          this.start();
        });
    }, this.deps.intervalMs);
  }

  /** No further passes; resolves once a pass under way has finished. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.timer?.cancel();
    await this.running;
  }

  /** One pass. A VM's guest leases and CPU are asked one VM at a time: the answers are cheap but not free. */
  async pass(): Promise<void> {
    const { clock, driver } = this.deps;
    for (const entry of [...this.deps.vms()]) {
      const vm = entry.running;
      // A dozing VM is never hibernated for idleness (every call it has open waits on an outbound call); a drain
      // takes one with no call open too (the host resumes it first).
      if (vm && this.deps.draining?.() && entry.tickets.length === 0 && (settledRunning(entry) || entry.state === "dozing")) {
        this.deps.hibernate(entry, "drain"); // its next call wakes it on another host
        continue;
      }
      if (!vm || !settledRunning(entry)) continue;
      const guestLeases = await driver.guestLeases(vm).catch(() => 0);
      const cpuSeconds = await driver.cpuSeconds(vm).catch(() => undefined);
      // While the driver answered, the VM may have crashed, been woken again or begun to hibernate.
      if (entry.running !== vm || !settledRunning(entry)) continue;
      const now = clock.monotonic();
      if (cpuSeconds !== undefined) entry.cpu.sample(now, cpuSeconds);
      const verdict = idleVerdict({
        now,
        lastActivityAt: entry.lastActivityAt,
        idleTimeoutMs: entry.spec.idleTimeoutMs,
        streamIdleMs: entry.spec.streamIdleMs,
        tickets: entry.tickets,
        apiLeases: liveLeases(entry, now),
        guestLeases,
        cpuFraction: entry.cpu.fraction,
        cpuBusyThreshold: this.deps.cpuBusyThreshold,
      });
      if (verdict.hibernate) {
        // After a failed hibernate the VM stays awake until its backoff has passed, however idle it is.
        if (entry.hibernateRetryAt === undefined || now >= entry.hibernateRetryAt) this.deps.hibernate(entry, "idle");
      } else if (verdict.busy) entry.lastActivityAt = now; // the idle timeout counts from the end of the work
    }
  }
}

/** How long the idle reaper waits after failed hibernates: `initialMs` after the first, doubling up to `maxMs`. */
export interface HibernateRetry {
  initialMs: number;
  maxMs: number;
}

/** 30 s, 1 min, 2 min, … 10 min: a full disk is not retried every idle timeout, and is noticed within minutes once freed. */
export const defaultHibernateRetry: HibernateRetry = { initialMs: 30_000, maxMs: 600_000 };

/** The wait after the `failures`-th failed hibernate in a row. */
export function hibernateRetryMs(failures: number, retry: HibernateRetry): number {
  return Math.min(retry.maxMs, retry.initialMs * 2 ** Math.max(0, failures - 1));
}

/** Running with nothing under way: a wake or a snapshot in progress decides the VM's fate itself. */
function settledRunning(entry: VmEntry): boolean {
  return entry.state === "running" && entry.running !== undefined && !entry.wake && !entry.hibernation;
}

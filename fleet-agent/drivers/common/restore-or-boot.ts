// `VmDriver.wake` for every driver: restore from the snapshot, and when that is not possible boot cold and say why.
//
// The rule, in one place:
// - a fallback is a `RestoreFailed` thrown by the driver's `restore` (no snapshot, an unreadable, corrupt or
//   incompatible one, a hypervisor that refuses or dies while loading it) or a restored guest whose agent does not
//   answer or whose clock cannot be set. Any other error is a real failure and rejects the wake;
// - whatever the attempt registered with `undo` (its VM process, a checksum still being read) is undone, newest
//   first, before the cold boot or the rejection; the snapshot files stay (the next hibernation replaces them);
// - a restore reports `mode: "restore"` with the clock fix's figures; a fallback reports `mode: "boot"`, the reason
//   in `fallbackReason`, `bootMs` from the wake's start to the booted VM (what the caller waited for: a boot, named
//   so in `server-timing` and the run's timings), `restoreMs` the part of it the failed attempt took, and the
//   boot's clock fix if it made one.
import { silentLogger, type Logger } from "../../../lib/log.ts";
import type { WakeTier } from "../../../contracts/agent.ts";
import type { RunningVm, VmSpec, WakeResult, WakeTimings } from "../driver.ts";
import { fixGuestClock, type GuestAgentClient } from "./guest-agent.ts";

/** Restoring is not possible in a way a cold boot recovers from; the message is the `fallbackReason`. */
export class RestoreFailed extends Error {
  override name = "RestoreFailed";
}

/**
 * The VM cannot run here now (no disk space for its files): the wake fails and the snapshot stays. Unlike
 * RestoreFailed no cold boot is tried: it would need the same room, and would throw the snapshot away.
 */
export class WakeRefused extends Error {
  override name = "WakeRefused";
}

export type ClockFix = Omit<WakeTimings, "restoreMs" | "bootMs">;

const NO_CLOCK_FIX: ClockFix = { clockFixMs: 0, skewBeforeMs: 0, skewAfterMs: 0 };

export interface Restored {
  vm: RunningVm;
  /**
   * The restored guest's agent, once it answers (waiting is part of the restore); the clock is then fixed through it.
   * Absent when the guest runs on the host's clock (the process driver).
   */
  guestAgent?: () => Promise<GuestAgentClient>;
  /**
   * Set: `guestAgent` gives the agent's open channel without waiting for an answer, and the clock fix's first request
   * is the guest's first answer, awaited this long (ms); the restore then ends when the guest runs. Absent: it ends
   * when `guestAgent` has had its answer.
   */
  firstAnswerWithinMs?: number;
  /** The guest runs against the forwarded addresses it last saw: its clock fix skips the neighbour check (`setTime`). */
  sameNetwork?: boolean;
  /** Extra fields for the "restored" log line. */
  detail?: Record<string, unknown>;
  /** When the state it brings back was taken (ms since the epoch): `WakeResult.snapshotAt`. */
  takenAt?: number;
  /** `WakeResult.tier`. */
  tier?: WakeTier;
}

export interface RestoreOrBootOptions {
  spec: VmSpec;
  log?: Logger;
  /** performance.now() when the wake began. */
  started?: number;
  /** Skew the clock fix aims under (ms). */
  clockTargetMs?: number;
  /** Brings the VM back from its snapshot; throws RestoreFailed when a cold boot is the way out. */
  restore: (undo: (step: () => Promise<unknown> | void) => void) => Promise<Restored>;
  /** The cold boot; its clock fix, if it made one, is reported. */
  boot: () => Promise<{ vm: RunningVm; clock?: ClockFix }>;
}

export async function restoreOrBoot(opts: RestoreOrBootOptions): Promise<WakeResult> {
  const started = opts.started ?? performance.now();
  const log = opts.log ?? silentLogger;
  const vmId = opts.spec.vmId;
  const undo: (() => Promise<unknown> | void)[] = [];
  let reason: string;
  try {
    const restored = await opts.restore((step) => undo.push(step));
    let restoreMs = performance.now() - started;
    let clock = NO_CLOCK_FIX;
    // The clock fix's first round trip: the restored guest's first answer when `firstAnswerWithinMs` is set (logged).
    let firstAnswerMs: number | undefined;
    if (restored.guestAgent) {
      try {
        const agent = await restored.guestAgent();
        restoreMs = performance.now() - started;
        const first =
          restored.firstAnswerWithinMs !== undefined
            ? { firstAnswerWithinMs: restored.firstAnswerWithinMs, onFirstAnswer: (ms: number) => void (firstAnswerMs = ms) }
            : {};
        clock = await fixGuestClock(agent, { targetMs: opts.clockTargetMs ?? 50, sameNetwork: restored.sameNetwork, ...first });
      } catch (err) {
        throw new RestoreFailed(`restored guest did not answer: ${(err as Error).message}`, { cause: err });
      }
      if (Math.abs(clock.skewAfterMs) >= (opts.clockTargetMs ?? 50)) log.warn("guest clock still off after the fix", { vmId, skewAfterMs: clock.skewAfterMs });
    }
    log.info("restored", {
      vmId,
      pid: restored.vm.pid,
      ...(restored.tier ? { tier: restored.tier } : {}),
      ...restored.detail,
      ...rounded({ restoreMs, ...clock, ...(firstAnswerMs !== undefined ? { firstAnswerMs } : {}) }),
    });
    return {
      vm: restored.vm,
      mode: "restore",
      timings: { restoreMs, ...clock },
      ...(restored.takenAt !== undefined ? { snapshotAt: restored.takenAt } : {}),
      ...(restored.tier ? { tier: restored.tier } : {}),
    };
  } catch (err) {
    for (const step of undo.reverse()) {
      try {
        await step();
      } catch (undoErr) {
        log.warn("cleanup after a failed restore failed", { vmId, err: undoErr });
      }
    }
    if (!(err instanceof RestoreFailed)) throw err;
    reason = err.message;
  }
  const attemptMs = performance.now() - started;
  log.warn("restore not possible; booting cold", { vmId, reason });
  const booted = await opts.boot();
  return {
    vm: booted.vm,
    mode: "boot",
    fallbackReason: reason,
    timings: { restoreMs: attemptMs, bootMs: performance.now() - started, ...(booted.clock ?? NO_CLOCK_FIX) },
  };
}

function rounded(o: Record<string, number>): Record<string, number> {
  return Object.fromEntries(Object.entries(o).map(([k, v]) => [k, Math.round(v * 10) / 10]));
}

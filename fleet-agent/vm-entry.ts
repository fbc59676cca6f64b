// What the host knows about one agent's VM: its state, the run it is in, and what holds it awake.
import type { AgentSpec, HibernateFailure, VmState, WakeInfo } from "../contracts/agent.ts";
import type { RunningVm, VmSpec } from "./drivers/driver.ts";
import { Leases } from "./leases.ts";
import { CpuWindow } from "./cpu-window.ts";
import { DozedTime } from "./dozed-time.ts";
import type { TicketImpl } from "./tickets.ts";

export interface VmEntry {
  spec: AgentSpec;
  /** The lease generation this host runs the agent under (`AgentSpec.generation`, 0 when never moved). */
  generation: number;
  vmSpec: VmSpec;
  state: VmState;
  running: RunningVm | undefined;
  runId: string | undefined;
  /** The monotonic time the current run's wake started, for first-byte timing. */
  wakeStartedAt: number | undefined;
  firstByteRecorded: boolean;
  /**
   * Open tickets. An array with each ticket's own slot (swap-remove), not a Set: a Set that outlives many
   * short requests kept finished tickets reachable through old-generation GC and cost ~50 % more CPU per call.
   */
  tickets: TicketImpl[];
  lastActivityAt: number;
  lastWakeAt: number | undefined;
  /** The wake in progress, shared by every caller that waits for it (single flight). */
  wake: Promise<WakeInfo> | undefined;
  /** Callers waiting for `wake`: bounded by the queue limit. */
  waiting: number;
  hibernation: { promise: Promise<void>; abort: AbortController } | undefined;
  leases: Leases;
  cpu: CpuWindow;
  /** Whether the driver was asked to clean up what an earlier process left for this VM. */
  reaped: boolean;
  /** Hibernates that failed in a row (the VM stayed awake); 0 again after one succeeds. */
  hibernateFailures: number;
  /** Monotonic ms before which the idle reaper does not try to hibernate again (after a failure). */
  hibernateRetryAt: number | undefined;
  lastHibernateError: HibernateFailure | undefined;
  /** How long the VM has dozed (host/doze.ts): its calls' timeouts leave that time out. */
  dozed: DozedTime;
}

/** A VM the host has just heard of, in `state` (`creating`, or `stopped` when its state directory survived). */
export function newVmEntry(spec: AgentSpec, vmSpec: VmSpec, state: VmState, now: number): VmEntry {
  return {
    spec,
    generation: spec.generation ?? 0,
    vmSpec,
    state,
    running: undefined,
    runId: undefined,
    wakeStartedAt: undefined,
    firstByteRecorded: true,
    tickets: [],
    lastActivityAt: now,
    lastWakeAt: undefined,
    wake: undefined,
    waiting: 0,
    hibernation: undefined,
    leases: new Leases(),
    cpu: new CpuWindow(),
    reaped: false,
    hibernateFailures: 0,
    hibernateRetryAt: undefined,
    lastHibernateError: undefined,
    dozed: new DozedTime(),
  };
}

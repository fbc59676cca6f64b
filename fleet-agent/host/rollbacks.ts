// Whether a restore rolls an agent back: the run its state last moved on in (recorded in its state directory at each wake and run end) against the time of the snapshot the restore brings back.
//
// A snapshot taken at a hibernation is newer than the run it ends, so a restore of it loses nothing. A restore of a
// snapshot older than the wake of the agent's last run brings back a state from before that run: whatever the run did
// is gone. It happens whenever the run ended without a snapshot: the host killed (`kill -9`, power loss), its VM
// crashed (QEMU died), or the hibernation at shutdown failed and the VM was stopped anyway. The record outlives the
// host process (it is a file beside the snapshot), so the first restore after any of these says so, on this process
// or a later one, and only that one: its wake records a run of its own.
import { closeSync, openSync, readFileSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";

/** The run an agent's state last moved on in. */
export interface RunRecord {
  runId: string;
  /** When it woke (host wall clock, ms since the epoch): the guest ran from here. */
  wokeAt: number;
  /** When it ended, if the host saw it end (a hibernation, a stop, a crash it noticed); absent: the host died first. */
  endedAt?: number;
  /** The meter's heartbeat while it ran, ms: the meter cut a segment of it within this, had the host lived on. */
  heartbeatMs?: number;
}

/** Where the host keeps each agent's run record: a port so the host's rules can be tested without a disk. */
export interface RunRecords {
  read(stateDir: string): RunRecord | undefined;
  /** Replaces the record; throws when it cannot be written. */
  write(stateDir: string, record: RunRecord): void;
}

/** The record's file in the VM's state directory (destroyed with it). */
export const RUN_RECORD_FILE = "last-run.json";

/** The record's size on disk: its JSON padded with spaces, so that each write replaces the whole of it. */
const RECORD_BYTES = 256;

/**
 * Files in the state directory, each record one write of RECORD_BYTES at offset 0 of the existing file: a `kill -9`
 * cannot tear one write (and the page cache is the kernel's). Not truncated, not renamed: on ext4 either costs
 * ~120-140 µs on the wake's path, this ~5 µs. Not fsynced: a power loss may lose the last record, and then that
 * rollback is not told.
 */
export const fileRunRecords: RunRecords = {
  read(stateDir) {
    try {
      const r = JSON.parse(readFileSync(join(stateDir, RUN_RECORD_FILE), "utf8")) as Partial<RunRecord>;
      if (typeof r.runId !== "string" || typeof r.wokeAt !== "number") return undefined;
      return {
        runId: r.runId,
        wokeAt: r.wokeAt,
        ...(typeof r.endedAt === "number" ? { endedAt: r.endedAt } : {}),
        ...(typeof r.heartbeatMs === "number" ? { heartbeatMs: r.heartbeatMs } : {}),
      };
    } catch {
      return undefined;
    }
  },
  write(stateDir, record) {
    const path = join(stateDir, RUN_RECORD_FILE);
    const text = JSON.stringify(record);
    if (text.length > RECORD_BYTES) return writeFileSync(path, text); // ids are far shorter; whole all the same
    let fd: number;
    try {
      fd = openSync(path, "r+");
    } catch {
      fd = openSync(path, "w"); // the VM's first run here
    }
    try {
      writeSync(fd, text.padEnd(RECORD_BYTES), 0);
    } finally {
      closeSync(fd);
    }
  },
};

/** A restore that brought back a snapshot older than the state the agent had reached. */
export interface Rollback {
  /** Awake time lost, ms: from the lost run's wake to its last known awake instant (at least 1). */
  lostMs: number;
  /** The run whose work the restore undid. */
  lostRunId: string;
  /** Wall clock, ms since the epoch. */
  lastAwakeAt: number;
  snapshotAt: number;
  /** The lost run's end is not known (the host died within its first meter heartbeat): `lostMs` is its upper bound. */
  estimated: boolean;
}

export interface RollbackFacts {
  /** The run before this wake, as recorded. */
  last: RunRecord | undefined;
  /** When the snapshot this wake restored was taken (ms since the epoch); undefined: not a restore, or not known. */
  snapshotAt: number | undefined;
  /** The meter's last awake instant of a run (its last spooled segment's end), if it recorded any. */
  meteredUntil(runId: string): number | undefined;
  /** When this host process started: a run that woke before it and has no end ended when the host died, before it. */
  hostStartedAt: number;
  now: number;
}

/** The rollback of a restore, or undefined when it brought back the state the agent had reached (or no state at all). */
export function rollbackOf(f: RollbackFacts): Rollback | undefined {
  const { last, snapshotAt } = f;
  if (!last || snapshotAt === undefined || last.wokeAt <= snapshotAt) return undefined;
  const known = last.endedAt ?? f.meteredUntil(last.runId);
  let lastAwakeAt: number;
  if (known !== undefined) lastAwakeAt = known;
  else {
    // The host died within the run's first heartbeat, before this process started: it ran from its wake until at most then.
    const died = last.wokeAt < f.hostStartedAt ? f.hostStartedAt : f.now;
    lastAwakeAt = Math.min(died, last.heartbeatMs !== undefined ? last.wokeAt + last.heartbeatMs : died);
  }
  return {
    lostMs: Math.max(1, Math.round(lastAwakeAt - last.wokeAt)),
    lostRunId: last.runId,
    lastAwakeAt,
    snapshotAt,
    estimated: known === undefined,
  };
}

// The exec server's JSON (processes, directory listings) as the API shows it: ISO times, signal names, octal modes.
import { signalName } from "../../contracts/exec-wire.ts";

/** A process as the exec server describes it (`GET /v1/procs…`). */
export interface GuestProcess {
  pid: number;
  cmd?: string[];
  state?: string;
  exitCode?: number | null;
  signal?: number | string | null;
  startedAtMs?: number | null;
  endedAtMs?: number | null;
}

export interface GuestEntry {
  name: string;
  type?: string;
  size?: number;
  mode?: number | string;
  uid?: number;
  gid?: number;
  mtimeMs?: number;
}

export interface GuestListing {
  entries?: GuestEntry[];
}

const iso = (ms: number | null | undefined) => (typeof ms === "number" && Number.isFinite(ms) ? new Date(ms).toISOString() : null);

export function processView(p: GuestProcess) {
  const signal = p.signal === null || p.signal === undefined ? null : typeof p.signal === "number" ? signalName(p.signal) : p.signal.replace(/^SIG/, "");
  return {
    pid: p.pid,
    cmd: p.cmd ?? [],
    state: p.state === "exited" ? ("exited" as const) : ("running" as const),
    exitCode: typeof p.exitCode === "number" ? p.exitCode : null,
    signal,
    startedAt: iso(p.startedAtMs),
    endedAt: iso(p.endedAtMs),
  };
}

const entryTypes = new Set(["file", "dir", "symlink", "other"]);

export function listingView(path: string, listing: GuestListing) {
  return {
    path,
    entries: (listing.entries ?? []).map((e) => ({
      name: e.name,
      type: (entryTypes.has(e.type ?? "") ? e.type : "other") as "file" | "dir" | "symlink" | "other",
      size: e.size ?? 0,
      mode: octal(e.mode ?? 0),
      uid: e.uid ?? 0,
      gid: e.gid ?? 0,
      modifiedAt: iso(e.mtimeMs),
    })),
  };
}

/** A permission mode as 4 octal digits (`0644`): the exec server's number (the mode's value) or octal text as is. */
export function octal(mode: unknown): string {
  if (typeof mode === "number" && Number.isInteger(mode)) return (mode & 0o7777).toString(8).padStart(4, "0");
  if (typeof mode === "string" && /^[0-7]{1,6}$/.test(mode)) return (Number.parseInt(mode, 8) & 0o7777).toString(8).padStart(4, "0");
  return "0000";
}

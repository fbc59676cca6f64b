// The exec server's C files (exec.h says which does what), for the guest image build and the process driver's host build.
import { join } from "node:path";

/** Its sources, relative to fleet-agent/guest/. */
export const GUEST_EXEC_SOURCES = ["main.c", "http.c", "paths.c", "users.c", "run.c", "exec.c", "tty.c", "procs.c", "files.c", "tar.c"].map(
  (f) => `guest-exec/${f}`,
);
/** The headers it is built from besides (a change to them is a new binary); launch-common.h is shared with launch.c. */
export const GUEST_EXEC_HEADERS = ["guest-exec/exec.h", "launch-common.h"];

const GUEST_DIR = join(import.meta.dirname, "..");

/** Absolute paths of the sources and of the headers. */
export function guestExecFiles(): { sources: string[]; headers: string[] } {
  return { sources: GUEST_EXEC_SOURCES.map((f) => join(GUEST_DIR, f)), headers: GUEST_EXEC_HEADERS.map((f) => join(GUEST_DIR, f)) };
}

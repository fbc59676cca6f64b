// Remembers an answer read from apt (apt-cache) in a file for as long as apt's state is unchanged: where apt keeps no package cache (Docker's Debian images, CI) each apt-cache call parses every package list, about 0.5 s.
import { mkdirSync, readFileSync, renameSync, statSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";

/** What apt-cache's answers depend on: the package lists, the installed set, the sources and the pinning. */
export const APT_STATE = [
  "/var/lib/apt/lists",
  "/var/lib/dpkg/status",
  "/etc/apt/sources.list",
  "/etc/apt/sources.list.d",
  "/etc/apt/preferences",
  "/etc/apt/preferences.d",
];

/** The modification times of `paths` (a missing one counts as missing): apt update and install rename files into them. */
export function aptState(paths: readonly string[] = APT_STATE): string {
  return paths
    .map((p) => {
      try {
        return `${p}@${statSync(p).mtimeMs}`;
      } catch {
        return `${p}@-`;
      }
    })
    .join(" ");
}

/** `compute()`'s answer, kept in `file` with the apt state it was read in; computed again when that state changed. */
export function rememberWhileAptUnchanged<T>(file: string, compute: () => T, state: () => string = () => aptState()): T {
  const now = state();
  try {
    const saved = JSON.parse(readFileSync(file, "utf8")) as { state: string; value: T };
    if (saved.state === now) return saved.value;
  } catch {
    // none kept yet, or unreadable: compute it
  }
  const value = compute();
  try {
    mkdirSync(dirname(file), { recursive: true });
    writeFileSync(`${file}.${process.pid}`, JSON.stringify({ state: now, value }));
    renameSync(`${file}.${process.pid}`, file);
  } catch {
    // a read-only data directory: the answer is still right, only not kept
  }
  return value;
}

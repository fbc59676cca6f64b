// The fake Firecracker's snapshot files: the guest memory padded to whole pages, the microVM state behind a checksum.
import { readFileSync, writeFileSync } from "node:fs";
import type { GuestMemory, StateFile } from "./firecracker-fake-types.ts";
import { crc } from "./firecracker-fake-util.ts";

export function writeSnapshotFiles(memPath: string, statePath: string, mem: GuestMemory, state: StateFile): void {
  const memText = JSON.stringify(mem);
  // Padding makes a flipped byte anywhere likely to hit the checksum, not JSON syntax.
  writeFileSync(memPath, memText + " ".repeat(4096 - (memText.length % 4096)));
  const stateText = JSON.stringify(state);
  writeFileSync(statePath, `${crc(stateText)}\n${stateText}`);
}

/** The snapshot's state and memory; throws when a file is missing, corrupt (checksum) or not a snapshot. */
export function readSnapshotFiles(statePath: string, memPath: string): { state: StateFile; mem: GuestMemory } {
  const text = readFileSync(statePath, "utf8");
  const nl = text.indexOf("\n");
  if (crc(text.slice(nl + 1)) !== text.slice(0, nl)) throw new Error("CRC mismatch in the microVM state file");
  const state = JSON.parse(text.slice(nl + 1)) as StateFile;
  const mem = JSON.parse(readFileSync(memPath, "utf8")) as GuestMemory;
  if (state.magic !== "fake-fc-state" || mem.magic !== "fake-fc-mem") throw new Error("not a snapshot");
  return { state, mem };
}

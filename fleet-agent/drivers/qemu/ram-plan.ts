// How a QEMU holds guest RAM for a wake (anonymous and streamed, or a RAM file), decided from the snapshot, so that a
// host whose memory mode changed still wakes every agent from the snapshot it has.
import { RAM_ID, ramIdOf, type MemoryMode } from "./args.ts";
import { snapshotMemory, type SnapshotManifest } from "./snapshot.ts";

/** How a QEMU holds guest RAM (supervisor.ts `launch`). */
export interface LaunchRam {
  memory: MemoryMode;
  /** `memory: "file"`: the RAM backend's id (args.ts RAM_ID, or an older snapshot's `mem`). */
  ramId: string;
  /** `memory: "file"`: a template's RAM file, mapped privately instead of the VM's own. */
  templateRam?: string;
  /** A streamed snapshot loaded into file-backed RAM: a fresh RAM file receives its pages (`x-ignore-shared` off for the load). */
  convert?: boolean;
}

/**
 * How a wake's QEMU holds guest RAM for this snapshot, whatever the host's mode (QemuHost.memory) is now, so that a
 * changed setting never costs an agent its memory (migrations skip shared RAM: `x-ignore-shared`):
 * - RAM in a file (snapshotMemory `file`) can only be loaded by a QEMU that maps that file: file-backed, with the
 *   backend id the snapshot names, even on a host now set to `stream` (its next hibernation streams: hibernate.ts).
 *   The VM's own file is mapped shared; a template's clone not yet hibernated maps the template's file privately (its
 *   device state carries no RAM; its hibernation splits the private RAM into a file of its own, ram-stream.ts);
 * - RAM in the data file (streamed) loads into the host's mode; with file-backed RAM into a fresh RAM file
 *   (`convert`), after which the VM runs and hibernates file-backed.
 * `prestartable`: a QEMU started ahead in `-incoming defer` can take the load (it maps the VM's own file, or none).
 */
export function ramPlan(
  hostMemory: MemoryMode,
  manifest: Pick<SnapshotManifest, "ram" | "templateRam" | "machineArgs">,
): LaunchRam & { prestartable: boolean } {
  if (snapshotMemory(manifest) === "file") {
    const ramId = ramIdOf(manifest.machineArgs);
    if (manifest.templateRam) return { memory: "file", ramId, templateRam: manifest.templateRam.path, prestartable: false };
    return { memory: "file", ramId, prestartable: true };
  }
  if (hostMemory === "file") return { memory: "file", ramId: RAM_ID, convert: true, prestartable: false };
  return { memory: "stream", ramId: RAM_ID, prestartable: true };
}

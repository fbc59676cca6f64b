// Snapshots of the qemu driver: what the manifest records (one data file, its checksum, the QEMU and machine it
// belongs to), the compatibility rule, and which files in the stateDir are stale. Writing and reading the manifest
// (the commit point) is common/snapshot-files.ts.
import { basename } from "node:path";
import type { DiskFingerprint } from "../common/agent-disk.ts";
import { readManifest as readManifestFile, removeFiles } from "../common/snapshot-files.ts";
import type { MemoryMode } from "./args.ts";
import type { RamFingerprint, RamPending } from "./ram-file.ts";

export const MANIFEST_VERSION = 1;

/** What the QEMU about to restore looks like; the snapshot must match it. */
export interface RestoreTarget {
  qemuVersion: string;
  accel: string;
  /** Host CPU model: under KVM the guest sees the host's CPU (`-cpu host`). */
  hostCpu: string;
  machineArgs: string[];
  memMiB: number;
  vcpus: number;
}

/**
 * `snapshot.json` names the one complete snapshot of a VM. It is replaced by rename only after its
 * data file is complete and synced, so a crash at any point leaves the old or the new snapshot.
 */
export interface SnapshotManifest extends RestoreTarget {
  version: number;
  /** Data file name inside the stateDir (`snapshot-<time>.bin`). */
  file: string;
  sha256: string;
  bytes: number;
  createdAt: string;
  snapshotMs: number;
  /** A built image's VM: its disk as it was when the snapshot was taken (the memory is valid only with that disk). */
  disk?: DiskFingerprint;
  /** `memory: "file"`: the data file is device state only; it is valid only over this RAM file (ram-file.ts). */
  ram?: RamFingerprint;
  /** Committed while the RAM file's pages were still being written back (ram-file.ts says what that may lose). */
  ramPending?: RamPending;
  /** Made from this checkpoint (restore or fork, qemu/checkpoint.ts): the wake gives the guest a fresh identity. */
  clonedFrom?: string;
  /**
   * A template's clone not yet run (common/templates.ts): guest RAM is the template's RAM file, mapped privately; the data
   * file is device state only. Its fingerprint must still be the template's (templates never change).
   */
  templateRam?: { path: string } & RamFingerprint;
}

/**
 * Host-side network settings (forwarded port, egress: `restrict`, the guestfwd to the egress proxy and its relay's
 * paths), where guest RAM lives (anonymous or a file, which file, how mapped: the manifest binds a RAM file,
 * ram-file.ts) and the size of TCG's translated-code cache do not change the virtual hardware. Within a `-netdev` value a comma of a path is doubled (args.ts `opt`).
 */
export function hardware(args: readonly string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === "-object" && args[i + 1]?.startsWith("memory-backend-file,")) {
      i++;
      continue;
    }
    out.push(
      args[i]!.replace(/,restrict=(on|off)/, "")
        .replace(/,tb-size=\d+/, "")
        .replace(/,hostfwd=tcp:(?:[^,]|,,)*/g, "")
        .replace(/,guestfwd=(?:[^,]|,,)*/g, "")
        .replace(/^(microvm(?:,[^,]+)*?),memory-backend=(?:[^,]|,,)+/, "$1"),
    );
  }
  return out;
}

/**
 * Where a snapshot keeps guest RAM: `file` (a RAM file its device state pairs with: the VM's own, or a template's for a
 * clone not yet run), else `stream` (in its data file). A QEMU with file-backed RAM loads either; one without only the
 * second.
 */
export function snapshotMemory(m: Pick<SnapshotManifest, "ram" | "templateRam">): MemoryMode {
  return m.ram || m.templateRam ? "file" : "stream";
}

/**
 * The guest-side addresses QEMU's user network forwards (`guestfwd=tcp:<ip>:<port>`, the egress proxy's), sorted: not
 * hardware, but what a guest may have failed to resolve before its snapshot and could resolve after it.
 */
export function forwardedAddresses(args: readonly string[]): string[] {
  return args.flatMap((a) => [...a.matchAll(/,guestfwd=tcp:([^-,]+)-/g)].map((m) => m[1]!)).sort();
}

/** Why this snapshot cannot be restored into `target`, or undefined when it can. */
export function incompatibility(m: Pick<SnapshotManifest, "version" | keyof RestoreTarget>, target: RestoreTarget): string | undefined {
  if (m.version !== MANIFEST_VERSION) return `snapshot manifest version ${m.version}, driver writes ${MANIFEST_VERSION}`;
  if (m.qemuVersion !== target.qemuVersion) return `snapshot taken by "${m.qemuVersion}", this host runs "${target.qemuVersion}"`;
  if (m.accel !== target.accel) return `snapshot taken under ${m.accel}, this host uses ${target.accel}`;
  if (m.accel === "kvm" && m.hostCpu !== target.hostCpu) return `snapshot taken on a "${m.hostCpu}" CPU under KVM, this host has "${target.hostCpu}"`;
  if (m.memMiB !== target.memMiB) return `snapshot has ${m.memMiB} MiB of memory, the VM now has ${target.memMiB} MiB`;
  if (m.vcpus !== target.vcpus) return `snapshot has ${m.vcpus} vCPUs, the VM now has ${target.vcpus}`;
  const a = hardware(m.machineArgs).join(" ");
  const b = hardware(target.machineArgs).join(" ");
  if (a !== b) return "snapshot was taken with other virtual hardware (machine arguments differ)";
  return undefined;
}

/** The committed manifest of the stateDir: `{}` when there is none, `{problem}` when it cannot be used. */
export function readManifest(path: string): Promise<{ manifest?: SnapshotManifest; problem?: string }> {
  return readManifestFile<SnapshotManifest>(path, (m) => typeof m.file === "string" && !m.file.includes("/") && typeof m.sha256 === "string");
}

/** Files of a snapshot that was never committed: attempts (`snapshot-<id>.tmp[.done]`, `snapshot.tmp[.done]` of older drivers), the manifest's temporary. */
function isPartial(name: string): boolean {
  return /^snapshot(-[\w-]+)?\.tmp(\.done)?$|^snapshot\.json\.tmp$/.test(name);
}

/** What an interrupted disk creation or launch drive write left (common/agent-disk.ts, common/launch-data.ts). */
export function removePartialDrives(stateDir: string): Promise<string[]> {
  return removeFiles(stateDir, (name) => /^disk\.ext4\.tmp-|^disk\.gen\.tmp$|^launch\.ext4\.tmp$|^ram\.gen\.tmp$|^ram\.synced\.tmp$|^ram\.tmp-/.test(name));
}

/** Removes snapshot data files the manifest does not name (older snapshots, partial files). */
export function removeUnreferencedSnapshots(stateDir: string, keep: string | undefined): Promise<string[]> {
  return removeFiles(stateDir, (name) => (isPartial(name) || /^snapshot-[\w.-]+\.bin$/.test(name)) && !(keep && name === basename(keep)));
}

/** Removes what uncommitted snapshot attempts left; committed snapshot files stay. */
export function removePartialSnapshots(stateDir: string): Promise<string[]> {
  return removeFiles(stateDir, isPartial);
}

// The firecracker driver's options (FirecrackerDriverOptions) and the fixed facts of the VMs it configures.
import type { Logger } from "../../../lib/log.ts";
import type { HostCheckOptions } from "./host.ts";
import type { NetOptions } from "./net.ts";

/** What the guest boots from. An initramfs (`initrd`) is the default; `rootfs` adds a read-only root drive. */
export interface FirecrackerImage {
  /** Uncompressed ELF vmlinux (Firecracker on x86_64 does not boot a bzImage). */
  kernel: string;
  initrd?: string;
  rootfs?: string;
  /** Extra kernel arguments this image needs. */
  bootArgs?: string;
}

export interface FirecrackerDriverOptions {
  /** Path of the firecracker binary (or a name on PATH). */
  binary?: string;
  /** Kernel and initramfs by image name; a built image's VM asks for IMAGE_GUEST (its init runs built images). */
  images: (image: string) => Promise<FirecrackerImage>;
  network: NetOptions;
  guestAgentPort?: number;
  workloadPort?: number;
  bootTimeoutMs?: number;
  /** How long a restored guest may take until its agent answers. */
  restoreTimeoutMs?: number;
  /** Diff snapshots (dirty page tracking): only pages written since the restore are written on hibernate. */
  diffSnapshots?: boolean;
  /** Hash both snapshot files before a restore (sha256: measured ≈145 ms per 256 MiB from the page cache). */
  verifyChecksums?: boolean;
  /** Send `clock_realtime: true` on load (the guest agent still sets and verifies the clock afterwards). */
  clockRealtime?: boolean;
  clockTargetMs?: number;
  extraBootArgs?: string;
  stopGraceMs?: number;
  /** How long a hibernation waits for the guest to flush a built image's disk (SYNC) before it snapshots anyway. */
  syncTimeoutMs?: number;
  /** Host check overrides (tests): /dev/kvm path, /proc/cpuinfo path, kernel release. */
  hostCheck?: Omit<HostCheckOptions, "binary">;
  /** Run each Firecracker under the jailer (chroot, own uid/gid, seccomp as shipped). */
  jailer?: JailerOptions;
  logger?: Logger;
  /** Tests: called after each step of restoreCheckpoint (a test kills the process there, as a crash would). */
  restoreCheckpointStep?: (step: string) => Promise<void> | void;
  /**
   * Warm templates (common/templates.ts), kept under `root`: a new VM starts as a clone of a checkpoint of a VM of its
   * kind booted earlier. A built image's VM only under the jailer (its drives' paths are the same in every chroot).
   */
  templates?: { root: string };
}

export interface JailerOptions {
  binary: string;
  uid: number;
  gid: number;
  /** Extra jailer arguments before `--`, e.g. ["--cgroup-version", "2", "--netns", "/var/run/netns/x"]. */
  extraArgs?: string[];
}

/** Firecracker's own boot arguments for a serial console, reboot = exit, and no PCI probing. */
export const BASE_BOOT_ARGS = "console=ttyS0 reboot=k panic=1 pci=off";
export const GUEST_CID = 3;
/** The guest image (kernel and initramfs) a built image's VM boots: the demo's, whose init also runs images. */
export const IMAGE_GUEST = "demo";

/** The guest agent's vsock port. */
export function guestAgentPort(opts: Pick<FirecrackerDriverOptions, "guestAgentPort">): number {
  return opts.guestAgentPort ?? 1024;
}

// The qemu driver's options (QemuDriverOptions) and their defaults; the guest image a VM boots.
import type { Logger } from "../../../lib/log.ts";
import type { EgressProxy } from "../../egress/proxy.ts";
import type { VmSpec } from "../driver.ts";
import type { Accel, MemoryMode } from "./args.ts";

export interface GuestImagePaths {
  kernel: string;
  initrd: string;
}

/** The guest image (kernel and initramfs) a built image's VM boots: the demo's, which also runs images (guest/init.sh). */
export const IMAGE_GUEST = "demo";

export interface QemuDriverOptions {
  /** Kernel and initramfs per image name (`demo`; a built image's VM asks for IMAGE_GUEST); a fixed pair serves every VM. */
  image: GuestImagePaths | ((name: string) => Promise<GuestImagePaths>);
  /** `auto` (default) picks KVM when /dev/kvm is usable by a hardware module, else TCG. */
  accel?: Accel | "auto";
  qemuBinary?: string;
  log?: Logger;
  /** Cold boot to a guest that answers HTTP (TCG on a busy 2-core machine needs a while). */
  bootTimeoutMs?: number;
  restoreTimeoutMs?: number;
  /**
   * Keep a QEMU waiting in `-incoming defer` for every hibernated VM so the wake path skips process
   * start-up. Costs one idle QEMU process per hibernated VM.
   * `paused` (file-backed RAM; otherwise as `true`): the hibernated QEMU itself waits, stopped, once its snapshot is
   * committed, and a wake whose snapshot is that one only renews the generations and runs `cont` — no load, and
   * under TCG its translated code stays warm. Costs more than a QEMU in `-incoming defer`: its translation cache
   * (up to TCG_TB_MIB) and QEMU's own memory stay resident; the guest's pages are the RAM file's clean page cache.
   */
  prestart?: boolean | "paused";
  /**
   * How long a kept QEMU (either kind of `prestart`) waits for its VM's wake, in ms after the hibernation; then it is
   * ended and the next wake restores from the files. 0: until the wake. Default 600 000 (10 min).
   */
  prestartKeepMs?: number;
  /** The most QEMUs kept waiting at once (the oldest is ended first). Default 64. */
  prestartMax?: number;
  /**
   * The anonymous resident memory kept QEMUs may hold together, bytes (each weighed when kept: /proc's RssAnon; its RAM
   * file's pages are page cache the host may reclaim). The least recently kept goes first. Default: no bound.
   */
  prestartMemoryBytes?: number;
  /** TCG's translated-code cache per QEMU, MiB (`-accel tcg,tb-size`): most of a kept QEMU's anonymous memory. Default TCG_TB_MIB. */
  tcgTbMiB?: number;
  /**
   * LD_PRELOAD shim that raises QEMU's listen backlog (see backlog.ts): `auto` (default) builds it
   * with gcc on first use, a path uses that file, false runs QEMU without it.
   */
  listenBacklogShim?: "auto" | string | false;
  /**
   * Bytes that must be free in the VM's stateDir before a snapshot is written (checked with statfs; less refuses it
   * with SnapshotNoSpace before the guest is paused). Default: guest memory plus SNAPSHOT_MARGIN_BYTES, the most a
   * snapshot can take; 0 turns the check off (a full disk is then still caught while the snapshot is written).
   */
  snapshotBytesNeeded?: (spec: VmSpec) => number;
  /** How long a hibernation waits for the guest to flush a built image's disk (SYNC) before it snapshots anyway. */
  syncTimeoutMs?: number;
  /**
   * Guest RAM: `stream` (default) streams all of it into each snapshot; `file` maps `<stateDir>/ram` shared, so a
   * hibernation writes the device state and syncs the file, and a wake consumes the snapshot (ram-file.ts).
   */
  memory?: MemoryMode;
  /**
   * The egress proxy agents with `allowEgress` reach out through (default: one with the default rules). The driver
   * listens for a VM on its socket before its QEMU starts and stops when the VM stops, hibernates or is destroyed;
   * the driver closes it with itself.
   */
  egress?: EgressProxy;
  /** The guestfwd relay binary (default: relay.c built with gcc on first use); false: no VM gets egress. */
  egressRelay?: string | false;
  /**
   * Templates (common/templates.ts): new VMs start as clones of a warm checkpoint of their kind, kept under `root`, instead
   * of booting cold. With file-backed memory a clone maps the template's RAM file privately (pages shared with every
   * other clone until written); with streamed memory it gets a copy of the template's state.
   */
  templates?: { root: string };
  /**
   * Start QEMU from waiting exec stubs (common/exec-stubs.ts) instead of forking the fleet-agent on the wake path
   * (default true; without gcc there are none and QEMU is forked as before).
   */
  execStubs?: boolean;
  /**
   * Run each QEMU in a network namespace of its own, its forwarded ports reachable only through root-only unix sockets
   * (common/exec-stub.c). Default: when a namespace can be made here (root, gcc); false: forward on the host's
   * loopback, where any local process can connect.
   */
  netns?: boolean;
  /** Test seam: runs on a wake after the load, before the new generations are committed (crash tests). */
  beforeGenerations?: (pid: number | undefined) => Promise<void>;
  /** Test seam: runs on a wake after the load and the RAM generation's renewal, just before `cont` (crash tests). */
  beforeCont?: (pid: number | undefined) => Promise<void>;
  /** Test seam: runs on a wake right after `cont`, before the guest's first answer is awaited (a starved guest). */
  afterCont?: (pid: number | undefined) => Promise<void>;
}

/** QemuDriverOptions.prestartKeepMs and prestartMax when not given. */
export const DEFAULT_PRESTART_KEEP_MS = 600_000;
export const DEFAULT_PRESTART_MAX = 64;

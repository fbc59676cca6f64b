// One QEMU process and the clients the driver holds on it (QemuVm), the host's QEMU facts every phase reads (QemuHost),
// and the host end of its guest agent's port: connecting, waiting for an answer, the flush before a snapshot.
import { connect } from "node:net";
import type { Logger } from "../../../lib/log.ts";
import type { PortEndpoint } from "../../../lib/node-net.ts";
import { GuestAgentClient } from "../common/guest-agent.ts";
import { pollUntil } from "../common/readiness.ts";
import type { VmProcess } from "../common/vm-process.ts";
import type { RunningVm, VmSpec } from "../driver.ts";
import type { Accel, MemoryMode, VmPaths } from "./args.ts";
import type { QmpClient } from "./qmp.ts";

/** What this host runs VMs with, fixed when the driver is made; snapshots and checkpoints record most of it. */
export interface QemuHost {
  binary: string;
  accel: Accel;
  qemuVersion: string;
  hostCpu: string;
  tscKhz: number | undefined;
  /** TCG's translated-code cache per QEMU, MiB (QemuDriverOptions.tcgTbMiB). */
  tcgTbMiB: number;
  /** The mode new VMs start in and hibernations write (a VM woken from a snapshot of the other mode converts: ram-file.ts `ramPlan`). */
  memory: MemoryMode;
  /** The listen-backlog shim QEMU runs with (backlog.ts), if any. */
  preload: string | undefined;
  /**
   * Each QEMU runs in a network namespace of its own, its forwarded ports reachable only through root-only unix
   * sockets (VmPaths.web, VmPaths.exec; common/exec-stub.c); false: forwarded on the host's loopback (no root, no gcc).
   */
  netns: boolean;
  /** The guestfwd relay; undefined: VMs with `allowEgress` get no way out (logged once). */
  egressRelay: string | undefined;
  /** The host kernel's boot id: a snapshot whose RAM was not yet durable is trusted only within the boot it was taken in. */
  bootId: string;
}

/** One QEMU process and the clients the driver holds on it. */
export interface QemuVm {
  spec: VmSpec;
  paths: VmPaths;
  hostPort: number;
  /** The port forwarded to the guest's exec server, this QEMU's own. */
  execPort: number;
  /** Started in a network namespace of its own: its ports are reached through `paths.web` and `paths.exec` only. */
  relayed: boolean;
  /** This run's exec key (driver.ts `execTarget`), made and pushed on first use. */
  execKey?: string;
  /** The push of `execKey` through the guest agent, once per QEMU (cleared when it failed). */
  execKeyPushed?: Promise<void>;
  machineArgs: string[];
  proc: VmProcess;
  qmp: QmpClient | undefined;
  agent: GuestAgentClient | undefined;
  agentOpen: boolean;
  /** A template's clone: its RAM is the template's file mapped privately; its first snapshot splits it out (ram-stream.ts). */
  templateRam: string | undefined;
  /**
   * How this QEMU holds guest RAM: as its snapshot did (or the host's mode, for a cold boot or a streamed snapshot), so
   * it may differ from QemuHost.memory after the host's setting changed; its hibernation writes the host's mode (hibernate.ts).
   */
  memory: MemoryMode;
  /** `memory: "file"`: the RAM backend's id (args.ts RAM_ID, or an older snapshot's). */
  ramId: string;
  /**
   * The template's RAM file held open while this QEMU runs: its first hibernation copies it and compares pages with
   * it, and the template may have been deleted (or rebuilt) since the clone started.
   */
  templateFd: number | undefined;
  /** Kept stopped after its hibernation (`prestart: "paused"`): `<file>:<sha256>` of the snapshot it holds in memory. */
  pausedAt?: string;
  /**
   * An adopted reset standby (standby.ts): the disk it runs on, which becomes the VM's when its wake runs it (until
   * then the VM's disk is the checkpoint's copy the restored snapshot pairs with).
   */
  pendingDisk?: string;
  /** Kept stopped over its own RAM file: the dig (ram-space.ts) its end asks for, valid unless a wake came first. */
  digTicket?: number;
  /** A running VM whose vCPUs are stopped by a doze (doze.ts); its process, memory and connections stay. */
  dozing?: boolean;
  /** The guest's keep-awake leases as it last answered: what a dozing guest holds (it cannot change them stopped). */
  lastLeases?: number;
}

/** How long a hibernation or checkpoint waits for the guest's flush (SYNC) when QemuDriverOptions.syncTimeoutMs is not given. */
const SYNC_TIMEOUT_MS = 10_000;

export function runningVm(vp: QemuVm): RunningVm {
  return { spec: vp.spec, endpoint: { host: "127.0.0.1", port: vp.hostPort, ...(vp.relayed ? { socketPath: vp.paths.web } : {}) }, pid: vp.proc.pid };
}

/** Where the QEMU's exec server forward is reached from the host (without the key). */
export function execEndpoint(vp: QemuVm): PortEndpoint {
  return { host: "127.0.0.1", port: vp.execPort, ...(vp.relayed ? { socketPath: vp.paths.exec } : {}) };
}

/** A guest's hostname: its agent id as a DNS label (RFC 1123 has no `_`). */
export function guestHostname(agentId: string): string {
  return agentId.replace(/_/g, "-").toLowerCase().slice(0, 63);
}

/** Opens the host end of the agent's virtio-serial port (a unix socket QEMU serves). */
export function openAgent(vp: QemuVm): Promise<void> {
  if (vp.agent && vp.agentOpen) return Promise.resolve();
  vp.agent?.close();
  return new Promise((resolve, reject) => {
    const socket = connect(vp.paths.agent);
    const agent = new GuestAgentClient(socket);
    vp.agent = agent;
    socket.once("connect", () => {
      if (vp.agent === agent) vp.agentOpen = true;
      resolve();
    });
    socket.once("error", reject);
    socket.once("close", () => {
      if (vp.agent === agent) vp.agentOpen = false;
    });
  });
}

/** Pings over the agent port (reconnecting when it closed) until the guest agent answers. */
export function waitAgent(
  vp: QemuVm,
  deadline: number,
  timeout: string,
  gaveUp: () => string | undefined = () => vp.proc.exitedWhy("QEMU"),
): Promise<GuestAgentClient> {
  return pollUntil(
    async (remaining) => {
      await openAgent(vp);
      await vp.agent!.ping(Math.max(100, Math.min(500, remaining)));
      return vp.agent!;
    },
    { deadline, gaveUp, timeout },
  );
}

/** Asks the guest to flush its disks before a snapshot; a failure is logged, not fatal (QEMU flushes its own side). */
export async function syncGuest(vp: QemuVm, log: Logger, timeoutMs: number | undefined): Promise<void> {
  const t0 = performance.now();
  try {
    await vp.agent!.sync(timeoutMs ?? SYNC_TIMEOUT_MS);
    log.debug("guest synced", { vmId: vp.spec.vmId, ms: Math.round(performance.now() - t0) });
  } catch (err) {
    log.warn("guest sync failed; going on without it", { vmId: vp.spec.vmId, err });
  }
}

// The QEMU command line for one VM (pure): identical device arguments for boot and restore, as migration requires.
import { join } from "node:path";
import { AGENT_DISK_LABEL, agentDiskPath } from "../common/agent-disk.ts";
import { LAUNCH_DRIVE_FILE, LAUNCH_DRIVE_LABEL } from "../common/launch-data.ts";
import { MANIFEST_FILE, processFiles, socketDir } from "../common/state-dir.ts";
import { EGRESS_PROXY_GUEST_IP, EGRESS_PROXY_GUEST_PORT, egressProxyUrl } from "../../egress/guest-address.ts";
import { EXEC_GUEST_PORT, type VmSpec } from "../driver.ts";

export const RAM_FILE = "ram";
export const RAM_GENERATION_FILE = "ram.gen";
/** A hard link to the checkpoint RAM file a restored snapshot names (checkpointing.ts `RamSharing` "link"). */
export const CHECKPOINT_RAM_FILE = "ram.checkpoint";

export type Accel = "kvm" | "tcg";

/**
 * Where guest RAM lives: `stream` (anonymous memory, streamed whole into the snapshot by `migrate`) or `file` (a
 * shared mapping of `<stateDir>/ram`; a snapshot is the device state only, see ram-file.ts).
 */
export type MemoryMode = "stream" | "file";

/** Files a VM keeps in its stateDir. */
export interface VmPaths {
  /** Where the unix sockets live: the stateDir, or a short per-VM directory when its path is too long for a socket. */
  socketDir: string;
  qmp: string;
  agent: string;
  /** The host's egress proxy for this VM (fleet-agent/egress/), a unix socket the guestfwd relay connects to. */
  egress: string;
  /**
   * A QEMU in a network namespace of its own (QemuHost.netns): the unix sockets (0600) relayed to its forwarded ports
   * on that namespace's loopback, the workload's and the exec server's: the host's only way to them.
   */
  web: string;
  exec: string;
  pid: string;
  console: string;
  qemuLog: string;
  port: string;
  manifest: string;
  manifestTmp: string;
  /** A built image's VM: the agent's persistent disk and the per-boot launch drive. */
  disk: string;
  launchDrive: string;
  /** `memory: "file"`: the guest RAM file and its generation (ram-file.ts). */
  ram: string;
  ramGeneration: string;
}

export function vmPaths(stateDir: string): VmPaths {
  const sockets = socketDir(stateDir, "agent.sock");
  const { pidFile, log } = processFiles(stateDir, "qemu");
  const manifest = join(stateDir, MANIFEST_FILE);
  return {
    socketDir: sockets,
    qmp: join(sockets, "qmp.sock"),
    agent: join(sockets, "agent.sock"),
    egress: join(sockets, "proxy.sock"), // no longer than agent.sock: the socket directory stays where it was
    web: join(sockets, "web.sock"),
    exec: join(sockets, "exec.sock"),
    pid: pidFile,
    console: join(stateDir, "console.log"),
    qemuLog: log,
    port: join(stateDir, "port.json"),
    manifest,
    manifestTmp: `${manifest}.tmp`,
    disk: agentDiskPath(stateDir),
    launchDrive: join(stateDir, LAUNCH_DRIVE_FILE),
    ram: join(stateDir, RAM_FILE),
    ramGeneration: join(stateDir, RAM_GENERATION_FILE),
  };
}

/**
 * The files of a VM's reset standby (standby.ts), a second QEMU beside the VM's own: whatever it opens by name is its
 * own (sockets, pid file, logs, port, disk, the link to the checkpoint's RAM file), no name longer than the VM's (the
 * socket directory is the VM's). It shares the VM's egress socket (same agent, same rules) and launch drive
 * (read-only). Adopting it renames its files to the VM's (`standbyAdoption`).
 */
export function standbyPaths(stateDir: string): VmPaths & { ramLink: string; migration: string } {
  const p = vmPaths(stateDir);
  return {
    ...p,
    qmp: join(p.socketDir, "s-qmp.sock"),
    agent: join(p.socketDir, "s-agt.sock"),
    web: join(p.socketDir, "s-web.sock"),
    exec: join(p.socketDir, "s-exe.sock"),
    migration: "s-mig.sock",
    pid: join(stateDir, "standby.pid"),
    console: join(stateDir, "standby-console.log"),
    qemuLog: join(stateDir, "standby-qemu.log"),
    port: join(stateDir, "standby-port.json"),
    disk: `${p.disk}.standby`,
    ramLink: join(stateDir, "ram.standby"),
  };
}

/**
 * What adopting a standby renames: each of its files (`standbyPaths`) to the VM's own name (`vmPaths`); the sockets of
 * its relayed ports when it runs in a namespace of its own (`relayed`: a unix socket renamed still reaches its relay),
 * else its port file.
 */
export function standbyAdoption(stateDir: string, relayed: boolean): [from: string, to: string][] {
  const s = standbyPaths(stateDir);
  const v = vmPaths(stateDir);
  return [
    [s.qmp, v.qmp],
    [s.agent, v.agent],
    [s.pid, v.pid],
    [s.console, v.console],
    [s.qemuLog, v.qemuLog],
    // A relayed QEMU's ports are fixed (no port file); the others' kept port is in their port file.
    ...(relayed
      ? ([
          [s.web, v.web],
          [s.exec, v.exec],
        ] as [string, string][])
      : ([[s.port, v.port]] as [string, string][])),
  ];
}

/**
 * The files of one snapshot attempt: the data QEMU's `exec:` command writes and the marker it writes once that file
 * is closed. Named per attempt, so a marker (or a writer still finishing) left by an earlier, failed or cancelled
 * attempt can never end a later one early or write into its file.
 */
export function snapshotAttempt(stateDir: string, attemptId: string): { data: string; done: string } {
  const data = join(stateDir, `snapshot-${attemptId}.tmp`);
  return { data, done: `${data}.done` };
}

export interface QemuLaunch {
  spec: VmSpec;
  paths: VmPaths;
  accel: Accel;
  /**
   * The port forwarded to the guest's workload: on the host's loopback, or (QemuHost.netns) on the loopback of QEMU's
   * own network namespace, fixed (NETNS_WEB_PORT) and relayed to `paths.web`.
   */
  hostPort: number;
  /** The port forwarded to the guest's exec server (EXEC_GUEST_PORT); a new one for every QEMU start, or NETNS_EXEC_PORT. */
  execPort?: number;
  kernel: string;
  initrd: string;
  /** Host TSC frequency; under TCG the guest kernel otherwise sometimes hangs calibrating its TSC. */
  tscKhz: number | undefined;
  /** Start paused, waiting for `migrate-incoming` (restore). */
  incoming: boolean;
  /** TCG's translated-code cache, MiB (QemuHost.tcgTbMiB); absent: TCG_TB_MIB. Not the guest's hardware (`hardware`). */
  tcgTbMiB?: number | undefined;
  /** Absent: `stream`. */
  memory?: MemoryMode;
  /** `memory: "file"`: the RAM backend's id, which names the guest's RAM block in a snapshot. Absent: RAM_ID. */
  ramId?: string;
  /**
   * `memory: "file"`: a template's RAM file mapped privately (`share=off`: the guest's writes go to copy-on-write
   * pages of its own, the file and the page cache every clone of it shares stay as they are). Absent: the VM's own
   * `<stateDir>/ram`, shared.
   */
  templateRam?: string | undefined;
  /**
   * The relay QEMU runs per guest connection to the egress proxy (fleet-agent/egress/relay.c). Only with it does a VM
   * reach its tenant's upstreams, and an agent with `allowEgress` get a way out; without it the guest reaches nothing.
   */
  egressRelay?: string | undefined;
  /** A cold boot: the tenant's upstreams' names, for the guest's environment (`AGENTVM_UPSTREAM_<NAME>_URL`). */
  upstreams?: readonly string[];
}

/** Whether this VM gets the guestfwd to the host's egress proxy: every VM (its upstreams are there), when the relay exists. */
export function hasProxy(l: Pick<QemuLaunch, "egressRelay">): boolean {
  return l.egressRelay !== undefined;
}

/** Whether this VM may reach out through the proxy (`HTTP_PROXY` and friends in its environment). */
export function hasEgress(l: Pick<QemuLaunch, "spec" | "egressRelay">): boolean {
  return l.spec.allowEgress && hasProxy(l);
}

/**
 * The id of file-backed RAM's memory backend: the one QEMU gives the microvm machine's RAM when no backend is named
 * (its default_ram_id). A snapshot names the guest's RAM block by it, so a streamed snapshot loads into a QEMU with
 * file-backed RAM (its pages land in the RAM file: the snapshot converts) and one with file-backed RAM streams into a
 * snapshot a QEMU without it loads. Snapshots taken before, with `mem`, keep their id until a cold boot (`ramIdOf`).
 */
export const RAM_ID = "microvm.ram";

/** The RAM backend's id in a snapshot's machine arguments (RAM_ID when it names none). */
export function ramIdOf(args: readonly string[]): string {
  for (const a of args) {
    const m = /(?:^|,)memory-backend=((?:[^,]|,,)+)/.exec(a);
    if (m && a.startsWith("microvm")) return m[1]!;
  }
  return RAM_ID;
}

/**
 * microvm with only what the guest uses: virtio-mmio net and serial, the ISA serial for the console,
 * and the RTC (without it the kernel waits a second for a clock that never answers, and boots at 1970).
 */
export const MACHINE = "microvm,x-option-roms=off,pit=off,pic=off";

/**
 * TCG's translated-code cache, MiB (QEMU's default is 1 GiB, most of it resident after a while). It fills to its size
 * and is most of a kept QEMU's memory, which the kept tier's budget weighs. Measured (bench:wake, kept tier): 64 → 32
 * takes a kept demo QEMU 83.5 → 65.7 MiB and a Python agent's 103 → 67.5 MiB, its wake 38.0 → 40.1 ms and boot 8.1 → 8.5
 * s; at 16 the Python agent's boot took 21 s (the cache thrashed). A build in the builder VM took about 1 % longer at
 * 32. 64 stays the default because at 32 the Python agent's kept wake (40–43 ms) misses the kept tier's 40 ms;
 * `QEMU_TCG_TB_MIB` trades that for a bigger kept tier.
 */
export const TCG_TB_MIB = 64;

/**
 * `egress`: the guest's init exports the proxy (`HTTP_PROXY`, `HTTPS_PROXY`, …) to the demo's processes; `upstreams`
 * (the guest reaches the proxy): `AGENTVM_UPSTREAMS_URL` and one `AGENTVM_UPSTREAM_<NAME>_URL` per name (guest/init.sh).
 */
export function kernelCmdline(accel: Accel, tscKhz: number | undefined, egress = false, upstreams?: readonly string[]): string {
  // init_on_free zeroes freed pages, so the snapshot skips them (≈ 95 MB → ≈ 60 MB of state here).
  // reboot=t: a triple fault, which QEMU (-no-reboot) turns into its exit at once. The kernel's default order tries
  // ACPI and the keyboard controller first, then jumps into the firmware in real mode; under load that sometimes
  // hung for good after "reboot: Restarting system" (an entrypoint that exited left a QEMU spinning, never an exit).
  const parts = ["console=ttyS0", "panic=-1", "reboot=t", "quiet", "init_on_free=1"];
  if (accel === "tcg" && tscKhz) parts.push(`tsc_early_khz=${tscKhz}`);
  if (egress) parts.push(`agentvm.egress_proxy=${egressProxyUrl}`);
  // Names are [a-z0-9-] (lib/upstreams.ts): nothing in them needs quoting on a command line.
  if (upstreams) parts.push(`agentvm.upstreams=${upstreams.join(",")}`);
  return parts.join(" ");
}

/**
 * QEMU user networking, always `restrict=on`: the guest reaches no address outside the VM — not the host's loopback
 * through 10.0.2.2, not the host's other addresses, not the outside — except through what is forwarded. Every VM
 * gets one forward (its upstreams are there; only an agent with egress may go further through it): a guest connection to 10.0.2.100:3128 runs the relay (`cmd:`, one process per
 * connection; a `chardev` guestfwd would carry a single stream, shared by every connection), which hands it to the
 * host's egress proxy on the VM's unix socket; the proxy decides where it may go (fleet-agent/egress/policy.ts).
 * A second host port reaches the guest's exec server (guest/guest-exec/, its key pushed per run: driver.ts `execTarget`).
 */
export function netdevArg(l: Pick<QemuLaunch, "spec" | "paths" | "hostPort" | "execPort" | "egressRelay">): string {
  const port = l.spec.rootImage ? l.spec.rootImage.config.port : DEMO_PORT;
  const parts = ["user", "id=net0", "restrict=on", `hostfwd=tcp:127.0.0.1:${l.hostPort}-:${port}`];
  if (l.execPort) parts.push(`hostfwd=tcp:127.0.0.1:${l.execPort}-:${EXEC_GUEST_PORT}`);
  if (hasProxy(l))
    parts.push(`guestfwd=tcp:${EGRESS_PROXY_GUEST_IP}:${EGRESS_PROXY_GUEST_PORT}-cmd:${opt(`${shellQuote(l.egressRelay!)} ${shellQuote(l.paths.egress)}`)}`);
  return parts.join(",");
}

/**
 * The arguments that define the virtual hardware. A snapshot stores them; restoring into a QEMU
 * started with different ones would fail or misbehave, so a difference means a cold boot.
 */
export function machineArgs(
  l: Pick<QemuLaunch, "spec" | "paths" | "accel" | "hostPort" | "execPort" | "memory" | "ramId" | "egressRelay" | "templateRam" | "tcgTbMiB">,
): string[] {
  const image = l.spec.rootImage;
  const file = l.memory === "file";
  const ramId = l.ramId ?? RAM_ID;
  return [
    "-M",
    file ? `${MACHINE},memory-backend=${ramId}` : MACHINE,
    // share=on: QEMU writes guest RAM straight into the file (page cache), so a hibernation only has to make it durable.
    ...(file
      ? [
          "-object",
          `memory-backend-file,id=${ramId},size=${l.spec.memMiB}M,mem-path=${opt(l.templateRam ?? l.paths.ram)},share=${l.templateRam ? "off" : "on"}`,
        ]
      : []),
    "-accel",
    l.accel === "tcg" ? `tcg,tb-size=${l.tcgTbMiB ?? TCG_TB_MIB}` : "kvm",
    ...(l.accel === "kvm" ? ["-cpu", "host"] : []),
    "-m",
    String(l.spec.memMiB),
    "-smp",
    String(l.spec.vcpus),
    "-nodefaults",
    "-no-user-config",
    "-nographic",
    "-no-reboot",
    "-chardev",
    `file,id=console,path=${opt(l.paths.console)},append=on`,
    "-serial",
    "chardev:console",
    "-netdev",
    netdevArg(l),
    "-device",
    "virtio-net-device,netdev=net0",
    "-device",
    "virtio-serial-device",
    "-chardev",
    `socket,id=agent,path=${opt(l.paths.agent)},server=on,wait=off`,
    "-device",
    "virtserialport,chardev=agent,name=agent",
    ...(image ? imageDrives(image.rootfs, l.paths) : []),
  ];
}

/**
 * The ports a QEMU in a network namespace of its own forwards on that namespace's loopback (nothing else listens
 * there: fixed, never taken), relayed to `VmPaths.web` and `VmPaths.exec`. Below the ephemeral range and off the
 * fetch standard's list of blocked ports (a Host header or a test's fetch names them).
 */
export const NETNS_WEB_PORT = 21080;
export const NETNS_EXEC_PORT = 21025;

/** The port the built-in demo serves on in the guest. */
export const DEMO_PORT = 8080;

/**
 * A built image's three virtio-blk drives (the guest finds them by filesystem label, not by order): the image's
 * ext4 read-only (shared by every agent of the image: read-only drives take a shared lock), the agent's disk
 * read-write, the launch drive read-only. Each also carries its label as its virtio serial, which the init reads
 * from sysfs without probing the filesystems. Part of the machine: a snapshot names the same files.
 */
function imageDrives(rootfs: string, paths: VmPaths): string[] {
  const drive = (id: string, file: string, label: string, readonly: boolean) => [
    // werror=report on the agent's disk: a full host disk under the sparse file is an I/O error in the guest, not a VM paused for ever.
    "-drive",
    `file=${opt(file)},format=raw,if=none,id=${id}${readonly ? ",readonly=on" : ",werror=report"}`,
    "-device",
    `virtio-blk-device,drive=${id},serial=${label}`,
  ];
  return [
    ...drive("image", rootfs, IMAGE_LABEL, true),
    ...drive("disk", paths.disk, AGENT_DISK_LABEL, false),
    ...drive("launch", paths.launchDrive, LAUNCH_DRIVE_LABEL, true),
  ];
}

/** The filesystem label of a built image's root filesystem (images/build/rootfs.ts writes it). */
export const IMAGE_LABEL = "agentvm-image";

export function qemuArgs(l: QemuLaunch): string[] {
  return [
    ...machineArgs(l),
    // A restore's guest memory (the kernel in it) comes from the snapshot: the kernel and initramfs would only be read
    // into fw_cfg, which the guest reads at boot alone (a reboot ends QEMU, `-no-reboot`). Reading them cost each
    // restore ~10 ms of QEMU's start-up under TCG.
    ...(l.incoming
      ? []
      : ["-kernel", l.kernel, "-initrd", l.initrd, "-append", kernelCmdline(l.accel, l.tscKhz, hasEgress(l), hasProxy(l) ? (l.upstreams ?? []) : undefined)]),
    "-chardev",
    `socket,id=qmp,path=${opt(l.paths.qmp)},server=on,wait=off`,
    "-mon",
    "chardev=qmp,mode=control",
    "-pidfile",
    l.paths.pid,
    ...(l.incoming ? ["-incoming", "defer"] : []),
  ];
}

/** A value inside a QEMU `key=value,…` option list: commas are doubled. */
export function opt(value: string): string {
  return value.replace(/,/g, ",,");
}

/** Quotes a path for the /bin/sh that runs QEMU's `exec:` migration commands. */
export function shellQuote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

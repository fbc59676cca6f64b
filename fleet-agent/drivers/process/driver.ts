// The `process` driver: a workload is a plain host process. NOT isolated; hibernate = SIGSTOP, wake = SIGCONT.
// A doze (pause/resume) is the same pair of signals to the workload's whole process group, and needs no clock fix:
// the workload runs on the host's clock.
//
// A built image (`spec.rootImage`) runs here too, still NOT isolated: its ext4 is unpacked once into
// `<stateDir>/rootfs` (rootfs.ts), the agent's persistent copy from then on, and its entrypoint is started in it by
// the image launcher (fleet-agent/guest/launch.c, built for the host: launcher.ts) with `launch <rootfs> <spec>`:
// chroot, the image's workdir, uid and gid, env. Only a chroot: the agent shares the host's kernel, network (it
// listens on a loopback port the driver picks), processes and resources, and root inside can leave the chroot.
// Needs root (chroot). `diskMiB` is not enforced (a directory has no size).
// Exec (execTarget) runs the guest's exec server on the host per VM (exec-server.ts), started on first use, frozen,
// thawed and ended with the VM; as root only (it chroots into the agent's files, an empty directory for the demo).
// Where the host lets it (CAP_SYS_ADMIN), the workload and the exec server each run in a PID namespace of their own
// (common/pid-ns.c): whatever they start, daemons included, is killed by the kernel when the namespace's init goes,
// which dies with the fleet-agent; freezing and thawing then signal the whole tree, which holds the whole namespace.
import { execFile } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { guestLeaseDir } from "../../../contracts/image.ts";
import { AppError } from "../../../lib/errors.ts";
import { silentLogger, type Logger } from "../../../lib/log.ts";
import { launchSpecFor } from "../common/launch-data.ts";
import { pidNamespaceSupport, type PidNamespaceSupport } from "../common/pid-namespace.ts";
import { killLeftover, processAlive, readPidFile, signalTree, writePidFile } from "../common/proc.ts";
import { freeLoopbackPort, waitForTcp } from "../common/readiness.ts";
import { RestoreFailed, restoreOrBoot } from "../common/restore-or-boot.ts";
import { processFiles } from "../common/state-dir.ts";
import { logTail, VmProcess, VmProcesses } from "../common/vm-process.ts";
import type { BootResult, ExecTarget, RunningVm, SnapshotResult, VmDriver, VmExit, VmSpec, WakeResult } from "../driver.ts";
import { waitImageReady } from "../common/image-boot.ts";
import { execPaths, ProcessExecServer, reapExecServer } from "./exec-server.ts";
import { ensureGuestExec, ensureLauncher } from "./launcher.ts";
import { ensureRootfs, prepareRootfs, rootfsPath } from "./rootfs.ts";

/** Commands the process driver may run, by image name; each gets PORT and LEASE_DIR in its environment. */
export type ProcessImages = Record<string, readonly string[]>;

export const defaultProcessImages: ProcessImages = {
  demo: [process.execPath, fileURLToPath(new URL("../../workloads/demo.ts", import.meta.url))],
};

export interface ProcessDriverOptions {
  images?: ProcessImages;
  /** How long a workload may take to answer on its port after spawning. */
  bootTimeoutMs?: number;
  /** Where the image launcher is built (default: `.launcher` beside the VM's stateDir). */
  launcherCacheDir?: string;
  /** Whether this process may chroot (default: it runs as root); a built image is refused without. */
  runningAsRoot?: boolean;
  /**
   * Whether workloads and exec servers run in PID namespaces of their own (default: probed once per process, used where
   * the host allows it): `{ error }` runs them without, as where it does not.
   */
  pidNamespaces?: PidNamespaceSupport;
  logger?: Logger;
}

/** The spec file the launcher reads, in the VM's stateDir (outside the agent's root). */
const LAUNCH_SPEC_FILE = "launch.spec";

interface Owned {
  proc: VmProcess;
  vm: RunningVm;
  /** Hibernated (SIGSTOP): the next wake thaws it. */
  frozen: boolean;
  /** When it was frozen (ms since the epoch): the state a wake brings back is the process as it was then. */
  frozenAt?: number;
  /** Dozing (SIGSTOP of its group): the next resume thaws it; apart from that it is a running VM. */
  dozing: boolean;
  /** Its exec server, started by the first execTarget of this run. */
  exec?: Promise<ProcessExecServer>;
}

export class ProcessDriver implements VmDriver {
  readonly name = "process" as const;
  readonly isolated = false;
  private readonly images: ProcessImages;
  private readonly bootTimeoutMs: number;
  private readonly owned = new Map<string, Owned>();
  private readonly processes = new VmProcesses();
  private readonly opts: ProcessDriverOptions;
  private readonly log: Logger;
  /** VMs already told that their diskMiB is not enforced (once per VM and driver). */
  private readonly diskWarned = new Set<string>();
  /** The namespace helper (common/pid-ns.c), when namespaces can be made here. */
  private readonly pidNs: string | undefined;

  constructor(opts: ProcessDriverOptions = {}) {
    this.opts = opts;
    this.images = { ...defaultProcessImages, ...opts.images };
    this.bootTimeoutMs = opts.bootTimeoutMs ?? 15_000;
    this.log = (opts.logger ?? silentLogger).child({ driver: "process" });
    const ns = opts.pidNamespaces ?? pidNamespaceSupport();
    this.pidNs = "path" in ns ? ns.path : undefined;
    if ("error" in ns)
      this.log.warn(
        "workloads run without a PID namespace of their own: what one starts in the background may outlive a killed fleet-agent until its next start",
        { why: ns.error },
      );
    else this.log.info("each workload runs in a PID namespace of its own: nothing it starts outlives it or the fleet-agent");
  }

  async boot(spec: VmSpec): Promise<BootResult> {
    if (spec.rootImage) return this.bootImage(spec);
    const started = performance.now();
    const command = this.images[spec.image];
    if (!command || command.length === 0)
      throw new Error(`unknown image "${spec.image}" for the process driver (known: ${Object.keys(this.images).join(", ")})`);
    mkdirSync(join(spec.stateDir, "leases"), { recursive: true });
    const { pidFile, log } = processFiles(spec.stateDir, "workload");
    const port = await freeLoopbackPort();
    const proc = VmProcess.spawn({
      vmId: spec.vmId,
      command: command[0]!,
      args: command.slice(1),
      log,
      env: { ...process.env, PORT: String(port), LEASE_DIR: join(spec.stateDir, "leases"), AGENT_ID: spec.agentId },
      // A shell command's work may run in children of the workload process.
      cpuIncludesChildren: true,
      pidNamespace: this.pidNs,
    });
    const vm: RunningVm = { spec, endpoint: { host: "127.0.0.1", port }, pid: proc.pid };
    const owned: Owned = { proc, vm, frozen: false, dozing: false };
    this.owned.set(spec.vmId, owned);
    this.processes.add(proc);
    // The whole command line is the marker: the pid of a workload only counts while it runs that command.
    if (proc.pid) writePidFile(pidFile, proc.pid, command.join(" "));
    proc.onEnd(() => {
      if (this.owned.get(spec.vmId) === owned) this.owned.delete(spec.vmId);
      rmSync(pidFile, { force: true });
      this.endExec(owned);
    });
    try {
      await waitForTcp(vm.endpoint, { deadline: started + this.bootTimeoutMs, gaveUp: () => (proc.exit ? "the process exited" : undefined) });
    } catch (err) {
      await proc.kill();
      const tail = logTail(log);
      throw new Error(`workload did not start: ${(err as Error).message}${tail ? `; log: ${tail}` : ""}`, { cause: err });
    }
    return { vm, bootMs: performance.now() - started };
  }

  /**
   * A built image's boot: its files unpacked on the first boot, the launcher built on the first use, then the
   * entrypoint under the launcher with PORT (a free loopback port: the agent shares the host's network), AGENT_ID and
   * LEASE_DIR. Ready when the port accepts connections (or `readyPath` answers below 500). Every failure is
   * `boot_failed` with the reason and the log's tail; an entrypoint that exits fails it at once.
   */
  private async bootImage(spec: VmSpec): Promise<BootResult> {
    const started = performance.now();
    const image = spec.rootImage!;
    if (!(this.opts.runningAsRoot ?? process.getuid?.() === 0)) {
      throw new AppError(
        "boot_failed",
        `agent ${spec.agentId}: the process driver runs a built image only as root (it chroots into the image's files); run the fleet-agent as root, or use the qemu driver`,
      );
    }
    this.log.warn(
      "the process driver does NOT isolate the agent: its image runs as a host process in a chroot (host kernel, network and resources; root inside can leave)",
      {
        vmId: spec.vmId,
        agentId: spec.agentId,
        image: image.digest,
      },
    );
    if (!this.diskWarned.has(spec.vmId)) {
      this.diskWarned.add(spec.vmId);
      this.log.warn("diskMiB is not enforced by the process driver: the agent's files are a plain directory", {
        vmId: spec.vmId,
        diskMiB: spec.diskMiB,
        dir: rootfsPath(spec.stateDir),
      });
    }
    const stateDir = resolve(spec.stateDir);
    mkdirSync(stateDir, { recursive: true });
    const { pidFile, log } = processFiles(stateDir, "workload");
    const specFile = join(stateDir, LAUNCH_SPEC_FILE);
    let root: string;
    let launcher: string;
    let port: number;
    try {
      root = await ensureRootfs(stateDir, image, this.log);
      await prepareRootfs(root, guestLeaseDir);
      launcher = await ensureLauncher(this.opts.launcherCacheDir ?? join(dirname(stateDir), ".launcher"));
      port = await freeLoopbackPort();
      await writeFile(
        specFile,
        launchSpecFor(image.config, { agentId: spec.agentId, port, leaseDir: guestLeaseDir, ...(spec.desktop ? { desktop: spec.desktop } : {}) }),
      );
    } catch (err) {
      throw new AppError("boot_failed", `agent ${spec.agentId} did not boot: ${(err as Error).message}`, { cause: err });
    }
    const proc = VmProcess.spawn({
      vmId: spec.vmId,
      command: launcher,
      args: [root, specFile],
      log,
      // The launcher gives the entrypoint the spec's environment only: nothing of the fleet-agent's leaks into it.
      env: {},
      cwd: stateDir,
      cpuIncludesChildren: true,
      pidNamespace: this.pidNs,
    });
    const vm: RunningVm = { spec, endpoint: { host: "127.0.0.1", port }, pid: proc.pid };
    const owned: Owned = { proc, vm, frozen: false, dozing: false };
    this.owned.set(spec.vmId, owned);
    this.processes.add(proc);
    // The launcher execs the entrypoint in place: from then on the pid's command line is the image's command (in a
    // namespace the pid is the helper's, whose command line names the launcher, this VM's root and spec).
    const marker = proc.namespaced ? [launcher, root, specFile].join(" ") : [...image.config.entrypoint, ...image.config.cmd].join(" ");
    if (proc.pid) writePidFile(pidFile, proc.pid, marker);
    proc.onEnd(() => {
      if (this.owned.get(spec.vmId) === owned) this.owned.delete(spec.vmId);
      rmSync(pidFile, { force: true });
      // An entrypoint that ended (or crashed) leaves none of its children behind, holding its port or its files.
      this.signal(owned, "SIGKILL");
      this.endExec(owned);
    });
    try {
      const deadline = performance.now() + this.bootTimeoutMs;
      const gaveUp = () =>
        proc.exit ? `the entrypoint exited (${proc.exit.signal ? `signal ${proc.exit.signal}` : `status ${proc.exit.code}`})` : proc.spawnError?.message;
      if (image.config.readyPath) await waitImageReady(vm.endpoint, { readyPath: image.config.readyPath, port }, { deadline, gaveUp });
      else await waitForTcp(vm.endpoint, { deadline, gaveUp });
    } catch (err) {
      this.signal(owned, "SIGKILL"); // the whole group: what a script entrypoint started too
      await proc.kill();
      const tail = logTail(log);
      throw new AppError("boot_failed", `agent ${spec.agentId} did not boot: ${(err as Error).message}${tail ? ` (log: ${tail})` : ""}`, { cause: err });
    }
    this.log.info("booted", { vmId: spec.vmId, image: image.digest, pid: proc.pid, port, bootMs: Math.round(performance.now() - started) });
    return { vm, bootMs: performance.now() - started };
  }

  async hibernate(vm: RunningVm): Promise<SnapshotResult> {
    const started = performance.now();
    const owned = this.owned.get(vm.spec.vmId);
    if (!owned) throw new Error(`no process for ${vm.spec.vmId}`);
    this.signal(owned, "SIGSTOP");
    await this.withExec(owned, (e) => e.freeze());
    owned.frozen = true;
    owned.frozenAt = Date.now();
    return { completed: true, snapshotMs: performance.now() - started, bytes: 0 };
  }

  async wake(spec: VmSpec): Promise<WakeResult> {
    return restoreOrBoot({
      spec,
      restore: async () => {
        const owned = this.owned.get(spec.vmId);
        if (!owned?.frozen || owned.proc.exit) throw new RestoreFailed("no frozen process (the process driver keeps no snapshot across host restarts)");
        this.signal(owned, "SIGCONT");
        await this.withExec(owned, (e) => e.thaw());
        owned.frozen = false;
        owned.dozing = false; // a VM hibernated while dozing runs again as a whole
        // The workload runs on the host's clock: there is nothing to fix (no guest agent).
        return { vm: owned.vm, ...(owned.frozenAt !== undefined ? { takenAt: owned.frozenAt } : {}) };
      },
      boot: () => this.boot(spec),
    });
  }

  /**
   * A doze: SIGSTOP to the workload's process group (it leads one: VmProcess spawns it detached), so whatever it
   * started stops with it. Its sockets stay open; the kernel keeps accepting and buffering for it meanwhile.
   */
  async pause(vm: RunningVm): Promise<void> {
    const owned = this.runningOwned(vm);
    this.signal(owned, "SIGSTOP", { group: true });
    await this.withExec(owned, (e) => e.freeze());
    owned.dozing = true;
  }

  /** The doze's end: SIGCONT to the group. No clock to fix: the workload runs on the host's clock. */
  async resume(vm: RunningVm): Promise<{ clockFixMs: number }> {
    const owned = this.runningOwned(vm);
    this.signal(owned, "SIGCONT", { group: true });
    await this.withExec(owned, (e) => e.thaw());
    owned.dozing = false;
    return { clockFixMs: 0 };
  }

  /**
   * The VM's exec server on the host (exec-server.ts), started on the first call of this run with a fresh key: as root
   * only (it chroots into the agent's files; the demo's root is an empty directory of its own).
   */
  async execTarget(vm: RunningVm): Promise<ExecTarget> {
    const owned = this.runningOwned(vm);
    if (!(this.opts.runningAsRoot ?? process.getuid?.() === 0))
      throw new AppError("exec_unsupported", "the process driver runs exec only as root (its exec server chroots into the agent's files)");
    if (!owned.exec) {
      const stateDir = resolve(vm.spec.stateDir);
      const starting = (async () => {
        const binary = await ensureGuestExec(this.opts.launcherCacheDir ?? join(dirname(stateDir), ".launcher"));
        let root = rootfsPath(stateDir);
        if (!vm.spec.rootImage) {
          root = execPaths(stateDir).demoRoot;
          mkdirSync(root, { recursive: true });
        }
        const server = await ProcessExecServer.start({
          binary,
          stateDir,
          root,
          pidNamespace: this.pidNs,
          ...(vm.spec.rootImage ? { spec: join(stateDir, LAUNCH_SPEC_FILE) } : {}),
          log: this.log.child({ vmId: vm.spec.vmId }),
        });
        if (this.owned.get(vm.spec.vmId) !== owned || owned.proc.exit) {
          server.stop(); // the VM ended while it started
          throw new Error(`VM ${vm.spec.vmId} is not running`);
        }
        if (owned.dozing || owned.frozen) server.freeze(); // it stopped while this one started: it stops with it
        return server;
      })();
      owned.exec = starting;
      starting.catch(() => {
        if (owned.exec === starting) owned.exec = undefined;
      });
    }
    return (await owned.exec).target;
  }

  async stop(vm: RunningVm): Promise<void> {
    const owned = this.owned.get(vm.spec.vmId);
    if (owned) await this.kill(owned);
  }

  async destroy(spec: VmSpec): Promise<void> {
    const owned = this.owned.get(spec.vmId);
    if (owned) await this.kill(owned);
    this.diskWarned.delete(spec.vmId);
    // With a built image this removes the agent's files (`rootfs`) too; something the agent mounted in there (it is
    // root in a chroot) is detached first, so that the removal never reaches through a mount into the host's files.
    if (spec.rootImage) await detachMountsUnder(resolve(spec.stateDir));
    rmSync(spec.stateDir, { recursive: true, force: true });
  }

  async cpuSeconds(vm: RunningVm): Promise<number> {
    return this.owned.get(vm.spec.vmId)?.proc.cpuSeconds() ?? 0; // not running here: nothing is using CPU for it
  }

  async guestLeases(vm: RunningVm): Promise<number> {
    // A built image's agent writes them inside its root (LEASE_DIR is guestLeaseDir there).
    const dir = vm.spec.rootImage ? join(rootfsPath(vm.spec.stateDir), guestLeaseDir) : join(vm.spec.stateDir, "leases");
    if (!existsSync(dir)) return 0;
    const nowS = Date.now() / 1000;
    let live = 0;
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      // Only regular files: a FIFO would block this read, a symlink would read a host file.
      if (!entry.isFile()) continue;
      const expires = Number(readFileSync(join(dir, entry.name), "utf8").trim());
      if (Number.isFinite(expires) && expires > nowS) live++;
    }
    return live;
  }

  onExit(vm: RunningVm, listener: (exit: VmExit) => void): void {
    this.processes.onExit(vm, listener);
  }

  logPath(spec: VmSpec): string {
    return processFiles(spec.stateDir, "workload").log;
  }

  async reap(spec: VmSpec): Promise<void> {
    if (this.owned.has(spec.vmId)) return;
    reapExecServer(spec.stateDir);
    const { pidFile } = processFiles(spec.stateDir, "workload");
    const left = readPidFile(pidFile);
    if (left?.marker && processAlive(left.pid, left.marker)) {
      // Its tree goes with it (in a namespace of its own: all of it). A built image's leftover takes its process group
      // too (what its entrypoint started, without a namespace), known by its files: the host reaps every VM directory
      // at its start with a bare spec.
      signalTree(left.pid, "SIGKILL");
      try {
        if (spec.rootImage || existsSync(rootfsPath(spec.stateDir))) process.kill(-left.pid, "SIGKILL");
      } catch {
        // not a group leader any more, or gone
      }
    }
    await killLeftover(pidFile);
  }

  async close(): Promise<void> {
    await Promise.all([...this.owned.values()].map((o) => this.kill(o)));
  }

  /** Runs `f` on the VM's exec server if one was started (a failed start has nothing to freeze). */
  private async withExec(owned: Owned, f: (e: ProcessExecServer) => void): Promise<void> {
    const server = await owned.exec?.catch(() => undefined);
    if (server) f(server);
  }

  /** Ends the VM's exec server and what it runs, with the VM. */
  private endExec(owned: Owned): void {
    const exec = owned.exec;
    owned.exec = undefined;
    void exec?.then(
      (e) => e.stop(),
      () => undefined,
    );
  }

  private async kill(owned: Owned): Promise<void> {
    this.endExec(owned);
    // A dozing group runs again first: its other processes were stopped with it and would stay stopped.
    if (owned.dozing) this.signal(owned, "SIGCONT", { group: true });
    // A frozen process only sees SIGTERM once it runs again.
    await owned.proc.stop(() => {
      this.signal(owned, "SIGTERM");
      this.signal(owned, "SIGCONT");
    }, 2000);
    // What a built image's entrypoint started (a shell script's server) goes with it.
    if (owned.vm.spec.rootImage) this.signal(owned, "SIGKILL");
  }

  /** The workload of a VM that runs here (not hibernated, not gone). */
  private runningOwned(vm: RunningVm): Owned {
    const owned = this.owned.get(vm.spec.vmId);
    if (!owned || owned.frozen || owned.proc.exit) throw new Error(`VM ${vm.spec.vmId} is not running`);
    return owned;
  }

  /**
   * In a PID namespace, SIGSTOP and SIGCONT reach every process of it (the tree below the helper's pid: nothing in the
   * namespace leaves it, a daemon neither), any other signal goes to the helper, which forwards it to the workload's
   * process group (SIGKILL: the namespace goes with its init, which dies with the helper).
   * Without one, a built image's signals go to its whole process group (the launcher leads it, the entrypoint keeps
   * it): an entrypoint script that starts its server as a child is frozen, thawed and ended as one. The demo keeps
   * its one-process signals, except for a doze (`group`), which stops every process of the workload.
   */
  private signal(owned: Owned, sig: NodeJS.Signals, opts: { group?: boolean } = {}): void {
    const pid = owned.proc.pid;
    if (owned.proc.namespaced && pid !== undefined) {
      if (sig !== "SIGSTOP" && sig !== "SIGCONT") return owned.proc.signal(sig);
      if (!owned.proc.exit) signalTree(pid, sig);
      return;
    }
    if (!(owned.vm.spec.rootImage || opts.group) || pid === undefined) return owned.proc.signal(sig);
    try {
      process.kill(-pid, sig);
    } catch {
      // the group is gone
    }
  }
}

/** Lazily unmounts every mount point below `dir` (deepest first), from /proc/self/mountinfo. */
async function detachMountsUnder(dir: string): Promise<void> {
  let info: string;
  try {
    info = readFileSync("/proc/self/mountinfo", "utf8");
  } catch {
    return;
  }
  // Field 5 is the mount point, with space, tab, newline and backslash octal-escaped.
  const points = info
    .split("\n")
    .map((l) => l.split(" ")[4]?.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(Number.parseInt(o, 8))))
    .filter((p): p is string => !!p && p.startsWith(`${dir}/`))
    .sort((a, b) => b.length - a.length);
  for (const p of points) {
    await new Promise<void>((done) => execFile("umount", ["-l", p], () => done()));
  }
}

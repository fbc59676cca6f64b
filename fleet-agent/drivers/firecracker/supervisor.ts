// Process supervision for the firecracker driver: one Firecracker process (under the jailer, or not) per running VM,
// started until its API answers, watched until it exits (onExit for a crash only), stopped, ended, and reaped after a
// fleet-agent that left one running.
import { accessSync, constants, readFileSync, rmSync } from "node:fs";
import { chown, mkdir, rm } from "node:fs/promises";
import { basename, delimiter, join, resolve } from "node:path";
import type { Logger } from "../../../lib/log.ts";
import type { GuestAgentClient } from "../common/guest-agent.ts";
import { killLeftover, processAlive, readPidFile, writePidFile } from "../common/proc.ts";
import { pollUntil } from "../common/readiness.ts";
import { checkSocketPath } from "../common/state-dir.ts";
import { VmProcess, VmProcesses, withLogTail } from "../common/vm-process.ts";
import type { RunningVm, VmExit, VmSpec } from "../driver.ts";
import { FirecrackerClient, type Drive } from "./api.ts";
import type { VmNet } from "./net.ts";
import type { JailerOptions } from "./options.ts";
import { firecrackerId, vmPaths, type VmPaths } from "./paths.ts";
import { removeStaleSnapshotFiles } from "./snapshot.ts";

/** A VM whose Firecracker process runs (or starts). */
export interface Live {
  vm: RunningVm;
  /** Firecracker's process: the child, or under a forking jailer the one it wrote into the chroot (polled). */
  proc: VmProcess;
  poller: NodeJS.Timeout | undefined;
  api: FirecrackerClient;
  paths: VmPaths;
  net: VmNet;
  agent: GuestAgentClient | undefined;
  /** Generation this process was restored from with dirty tracking on: the base a Diff snapshot applies to. */
  diffBase: number | undefined;
  /** A built image's VM: its drives as Firecracker was given them (recorded in its snapshots). */
  drives: Drive[] | undefined;
  /** Its vCPUs are stopped by a doze (doze.ts); process, memory and connections stay. */
  dozing?: boolean;
  /** The guest's keep-awake leases as it last answered: what a dozing guest holds (it cannot change them stopped). */
  lastLeases?: number;
  /** This process's exec key (driver.ts `execTarget`) and its push through the guest agent (cleared when it failed). */
  execKey?: string;
  execKeyPushed?: Promise<void>;
}

export interface SupervisorOptions {
  /** Path of the firecracker binary (or a name on PATH). */
  binary: string;
  jailer?: JailerOptions;
  workloadPort?: number;
  stopGraceMs?: number;
  log: Logger;
}

/** The running Firecracker processes of one driver, by VM id. */
export class FirecrackerProcesses {
  private readonly opts: SupervisorOptions;
  private readonly live = new Map<string, Live>();
  private readonly processes = new VmProcesses();

  constructor(opts: SupervisorOptions) {
    this.opts = opts;
  }

  /** The file layout of one VM (depends on whether the jailer is used). */
  paths(spec: VmSpec): VmPaths {
    return vmPaths(resolve(spec.stateDir), this.opts.jailer ? { execFile: basename(this.opts.binary), id: firecrackerId(spec.vmId) } : undefined);
  }

  /** The VM's process when it runs here. */
  get(vmId: string): Live | undefined {
    return this.live.get(vmId);
  }

  has(vmId: string): boolean {
    return this.live.has(vmId);
  }

  /** The VM's process, which must run here. */
  owned(vm: RunningVm): Live {
    const live = this.live.get(vm.spec.vmId);
    if (!live) throw new Error(`no running firecracker process for ${vm.spec.vmId}`);
    return live;
  }

  onExit(vm: RunningVm, listener: (exit: VmExit) => void): void {
    this.processes.onExit(vm, listener);
  }

  /** Starts Firecracker (under the jailer when configured) for the VM on `net`; resolves once its API answers. */
  async spawn(spec: VmSpec, net: VmNet): Promise<Live> {
    if (this.live.has(spec.vmId)) throw new Error(`${spec.vmId} already runs (pid ${this.live.get(spec.vmId)!.proc.pid}): stop or hibernate it first`);
    const paths = this.paths(spec);
    checkSocketPath(paths.apiSock);
    checkSocketPath(paths.vsock);
    await killLeftover(paths.pidFile);
    const jailer = this.opts.jailer;
    if (jailer) {
      // The jailer makes /dev and /run in the chroot itself and refuses to find them there already.
      await rm(join(paths.root, "dev"), { recursive: true, force: true });
      await rm(join(paths.root, "run"), { recursive: true, force: true });
      await rm(join(paths.root, "firecracker.pid"), { force: true });
    }
    await mkdir(paths.snapDir, { recursive: true });
    if (jailer) await chown(paths.snapDir, jailer.uid, jailer.gid);
    // Firecracker refuses to bind over existing socket files.
    rmSync(paths.apiSock, { force: true });
    rmSync(paths.vsock, { force: true });
    const [command, args] = jailer
      ? [
          jailer.binary,
          [
            "--id",
            firecrackerId(spec.vmId),
            "--exec-file",
            resolveOnPath(this.opts.binary),
            "--uid",
            String(jailer.uid),
            "--gid",
            String(jailer.gid),
            "--chroot-base-dir",
            resolve(spec.stateDir, "jail"),
            ...(jailer.extraArgs ?? []),
            "--",
            "--api-sock",
            paths.vm(paths.apiSock),
          ],
        ]
      : [this.opts.binary, ["--api-sock", paths.apiSock, "--id", firecrackerId(spec.vmId)]];
    // A jailer may fork Firecracker and exit 0 at once: its exit is then not the VM's (watched below).
    const proc = VmProcess.spawn({ vmId: spec.vmId, command, args, log: paths.log, cwd: spec.stateDir, childIsVm: !jailer });
    const api = new FirecrackerClient(paths.apiSock);
    const live: Live = {
      vm: { spec, endpoint: { host: net.guestIp, port: spec.rootImage?.config.port ?? this.opts.workloadPort ?? 8080 }, pid: proc.pid },
      proc,
      api,
      paths,
      net,
      agent: undefined,
      diffBase: undefined,
      poller: undefined,
      drives: undefined,
    };
    proc.onEnd((exit) => {
      if (live.poller) clearInterval(live.poller);
      live.agent?.close();
      live.agent = undefined;
      void api.close();
      if (this.live.get(spec.vmId) === live) this.live.delete(spec.vmId);
      if (readPidFile(paths.pidFile)?.pid === proc.pid) rmSync(paths.pidFile, { force: true });
      if (proc.crashed) this.opts.log.warn("firecracker process exited unexpectedly", { vmId: spec.vmId, ...exit });
    });
    // Until the jailer's child is known, only a failing jailer is an exit.
    let pidKnown = !jailer;
    let earlyExit: VmExit | undefined;
    if (jailer) {
      proc.child.once("exit", (code, sig) => {
        if (pidKnown ? proc.pid === proc.child.pid : code !== 0) proc.end({ code, signal: sig });
        else if (!pidKnown) earlyExit = { code, signal: sig };
      });
    }
    if (proc.pid === undefined) {
      await proc.exited;
      throw new Error(`cannot start ${command}: ${proc.spawnError?.message ?? "spawn failed"}`);
    }
    this.live.set(spec.vmId, live);
    try {
      await waitForApi(api, 5000, () => proc.exitedWhy("firecracker"));
      // The jailer may fork: Firecracker's own pid is then in <root>/firecracker.pid, and its exit is polled.
      const jailedPid = jailer ? Number(readFileSync(join(paths.root, "firecracker.pid"), "utf8").trim()) : undefined;
      pidKnown = true;
      if (jailedPid === proc.child.pid && earlyExit) proc.end(earlyExit);
      if (jailedPid && jailedPid !== proc.child.pid) {
        proc.adopt(jailedPid);
        live.vm.pid = jailedPid;
        live.poller = setInterval(() => processAlive(jailedPid, paths.marker) || proc.end({ code: null, signal: null }), 250);
        live.poller.unref();
      }
    } catch (err) {
      proc.stopping = true;
      pidKnown = true;
      if (earlyExit) proc.end(earlyExit); // the jailer is gone; what it may have forked is unknown
      await this.kill(live);
      throw withLogTail(new Error(`firecracker API did not come up: ${(err as Error).message}`, { cause: err }), paths.log, "firecracker log");
    }
    this.processes.add(proc);
    writePidFile(paths.pidFile, proc.pid!, paths.marker);
    return live;
  }

  /** Ends the process (intentionally: no onExit) and waits for it. */
  async kill(live: Live): Promise<void> {
    live.agent?.close();
    live.agent = undefined;
    await live.proc.kill();
    await live.api.close();
    rmSync(live.paths.apiSock, { force: true });
    rmSync(live.paths.vsock, { force: true });
  }

  /** Stops the VM without a snapshot: the guest is asked to end, a hung one is killed. */
  async stop(vm: RunningVm): Promise<void> {
    const live = this.live.get(vm.spec.vmId);
    if (!live) return;
    live.agent?.close();
    live.agent = undefined;
    // A dozing guest must run to take Ctrl-Alt-Del (its clock does not matter any more).
    if (live.dozing) await live.api.resume().catch(() => undefined);
    live.dozing = false;
    // Ctrl-Alt-Del makes the guest reboot, which with reboot=k ends Firecracker; a hung guest gets SIGKILL.
    await live.proc.stop(() => live.api.action("SendCtrlAltDel"), this.opts.stopGraceMs ?? 1000);
    await this.kill(live);
  }

  /** Ends every VM's process (fleet-agent shutdown without hibernation). */
  async killAll(): Promise<void> {
    await Promise.all([...this.live.values()].map((l) => this.kill(l)));
  }

  /** Removes what a VM not running here left: a process of a previous fleet-agent, sockets, partial snapshot files. */
  async reap(spec: VmSpec): Promise<void> {
    if (this.live.has(spec.vmId)) return;
    const paths = this.paths(spec);
    await killLeftover(paths.pidFile);
    rmSync(paths.apiSock, { force: true });
    rmSync(paths.vsock, { force: true });
    await removeStaleSnapshotFiles(paths.snapDir);
  }
}

/** The jailer wants the firecracker binary as a path (and its file name must contain "firecracker"). */
function resolveOnPath(binary: string): string {
  if (binary.includes("/")) return resolve(binary);
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    const candidate = join(dir, binary);
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      /* not here */
    }
  }
  return binary;
}

/** Resolves once Firecracker's API socket answers. */
function waitForApi(api: FirecrackerClient, timeoutMs: number, gaveUp: () => string | undefined): Promise<void> {
  return pollUntil(() => api.describeInstance().then(() => true), {
    deadline: performance.now() + timeoutMs,
    gaveUp,
    timeout: `no answer within ${timeoutMs} ms`,
  }).then(() => undefined);
}

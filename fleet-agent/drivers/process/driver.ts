// The `process` driver: a workload is a plain host process. NOT isolated; hibernate = SIGSTOP, wake = SIGCONT.
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { killLeftover, writePidFile } from "../common/proc.ts";
import { freeLoopbackPort, waitForTcp } from "../common/readiness.ts";
import { RestoreFailed, restoreOrBoot } from "../common/restore-or-boot.ts";
import { processFiles } from "../common/state-dir.ts";
import { logTail, VmProcess, VmProcesses } from "../common/vm-process.ts";
import type { BootResult, RunningVm, SnapshotResult, VmDriver, VmExit, VmSpec, WakeResult } from "../driver.ts";

/** Commands the process driver may run, by image name; each gets PORT and LEASE_DIR in its environment. */
export type ProcessImages = Record<string, readonly string[]>;

export const defaultProcessImages: ProcessImages = {
  demo: [process.execPath, fileURLToPath(new URL("../../workloads/demo.ts", import.meta.url))],
};

export interface ProcessDriverOptions {
  images?: ProcessImages;
  /** How long a workload may take to answer on its port after spawning. */
  bootTimeoutMs?: number;
}

interface Owned {
  proc: VmProcess;
  vm: RunningVm;
  frozen: boolean;
}

export class ProcessDriver implements VmDriver {
  readonly name = "process" as const;
  readonly isolated = false;
  private readonly images: ProcessImages;
  private readonly bootTimeoutMs: number;
  private readonly owned = new Map<string, Owned>();
  private readonly processes = new VmProcesses();

  constructor(opts: ProcessDriverOptions = {}) {
    this.images = { ...defaultProcessImages, ...opts.images };
    this.bootTimeoutMs = opts.bootTimeoutMs ?? 15_000;
  }

  async boot(spec: VmSpec): Promise<BootResult> {
    const started = performance.now();
    const command = this.images[spec.image];
    if (!command || command.length === 0) throw new Error(`unknown image "${spec.image}" for the process driver (known: ${Object.keys(this.images).join(", ")})`);
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
    });
    const vm: RunningVm = { spec, endpoint: { host: "127.0.0.1", port }, pid: proc.pid };
    const owned: Owned = { proc, vm, frozen: false };
    this.owned.set(spec.vmId, owned);
    this.processes.add(proc);
    // The whole command line is the marker: the pid of a workload only counts while it runs that command.
    if (proc.pid) writePidFile(pidFile, proc.pid, command.join(" "));
    proc.onEnd(() => {
      if (this.owned.get(spec.vmId) === owned) this.owned.delete(spec.vmId);
      rmSync(pidFile, { force: true });
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

  async hibernate(vm: RunningVm): Promise<SnapshotResult> {
    const started = performance.now();
    const owned = this.owned.get(vm.spec.vmId);
    if (!owned) throw new Error(`no process for ${vm.spec.vmId}`);
    owned.proc.signal("SIGSTOP");
    owned.frozen = true;
    return { completed: true, snapshotMs: performance.now() - started, bytes: 0 };
  }

  async wake(spec: VmSpec): Promise<WakeResult> {
    return restoreOrBoot({
      spec,
      restore: async () => {
        const owned = this.owned.get(spec.vmId);
        if (!owned?.frozen || owned.proc.exit) throw new RestoreFailed("no frozen process (the process driver keeps no snapshot across host restarts)");
        owned.proc.signal("SIGCONT");
        owned.frozen = false;
        // The workload runs on the host's clock: there is nothing to fix (no guest agent).
        return { vm: owned.vm };
      },
      boot: () => this.boot(spec),
    });
  }

  async stop(vm: RunningVm): Promise<void> {
    const owned = this.owned.get(vm.spec.vmId);
    if (owned) await this.kill(owned);
  }

  async destroy(spec: VmSpec): Promise<void> {
    const owned = this.owned.get(spec.vmId);
    if (owned) await this.kill(owned);
    rmSync(spec.stateDir, { recursive: true, force: true });
  }

  async cpuSeconds(vm: RunningVm): Promise<number> {
    return this.owned.get(vm.spec.vmId)?.proc.cpuSeconds() ?? 0; // not running here: nothing is using CPU for it
  }

  async guestLeases(vm: RunningVm): Promise<number> {
    const dir = join(vm.spec.stateDir, "leases");
    if (!existsSync(dir)) return 0;
    const nowS = Date.now() / 1000;
    let live = 0;
    for (const name of readdirSync(dir)) {
      const expires = Number(readFileSync(join(dir, name), "utf8").trim());
      if (Number.isFinite(expires) && expires > nowS) live++;
    }
    return live;
  }

  onExit(vm: RunningVm, listener: (exit: VmExit) => void): void {
    this.processes.onExit(vm, listener);
  }

  async reap(spec: VmSpec): Promise<void> {
    if (this.owned.has(spec.vmId)) return;
    await killLeftover(processFiles(spec.stateDir, "workload").pidFile);
  }

  async close(): Promise<void> {
    await Promise.all([...this.owned.values()].map((o) => this.kill(o)));
  }

  private async kill(owned: Owned): Promise<void> {
    // A frozen process only sees SIGTERM once it runs again.
    await owned.proc.stop(() => {
      owned.proc.signal("SIGTERM");
      owned.proc.signal("SIGCONT");
    }, 2000);
  }
}

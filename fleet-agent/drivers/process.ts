// The `process` driver: a workload is a plain host process. NOT isolated; hibernate = SIGSTOP, wake = SIGCONT.
import { spawn, type ChildProcess } from "node:child_process";
import { createWriteStream, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { connect, createServer } from "node:net";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { BootResult, RunningVm, SnapshotResult, VmDriver, VmExit, VmSpec, WakeResult } from "./driver.ts";
import { readCpuSeconds, processAlive } from "./proc.ts";

/** Commands the process driver may run, by image name; each gets PORT and LEASE_DIR in its environment. */
export type ProcessImages = Record<string, readonly string[]>;

export const defaultProcessImages: ProcessImages = {
  demo: [process.execPath, fileURLToPath(new URL("../workloads/demo.ts", import.meta.url))],
};

export interface ProcessDriverOptions {
  images?: ProcessImages;
  /** How long a workload may take to answer on its port after spawning. */
  bootTimeoutMs?: number;
}

interface Owned {
  child: ChildProcess;
  vm: RunningVm;
  frozen: boolean;
  stopping: boolean;
  exitListeners: ((e: VmExit) => void)[];
  exited: Promise<void>;
}

export class ProcessDriver implements VmDriver {
  readonly name = "process" as const;
  readonly isolated = false;
  private readonly images: ProcessImages;
  private readonly bootTimeoutMs: number;
  private readonly owned = new Map<string, Owned>();

  constructor(opts: ProcessDriverOptions = {}) {
    this.images = { ...defaultProcessImages, ...opts.images };
    this.bootTimeoutMs = opts.bootTimeoutMs ?? 15_000;
  }

  async boot(spec: VmSpec): Promise<BootResult> {
    const started = performance.now();
    const command = this.images[spec.image];
    if (!command || command.length === 0) throw new Error(`unknown image "${spec.image}" for the process driver (known: ${Object.keys(this.images).join(", ")})`);
    mkdirSync(join(spec.stateDir, "leases"), { recursive: true });
    const port = await freePort();
    const log = createWriteStream(join(spec.stateDir, "workload.log"), { flags: "a" });
    const child = spawn(command[0]!, command.slice(1), {
      env: { ...process.env, PORT: String(port), LEASE_DIR: join(spec.stateDir, "leases"), AGENT_ID: spec.agentId },
      stdio: ["ignore", "pipe", "pipe"],
      // Its own process group: a terminal's Ctrl-C reaches the host, which freezes or stops workloads in order.
      detached: true,
    });
    child.stdout?.pipe(log);
    child.stderr?.pipe(log);
    const vm: RunningVm = { spec, endpoint: { host: "127.0.0.1", port }, pid: child.pid };
    const owned: Owned = {
      child,
      vm,
      frozen: false,
      stopping: false,
      exitListeners: [],
      exited: new Promise((resolve) => child.once("exit", () => resolve())),
    };
    this.owned.set(spec.vmId, owned);
    if (child.pid) writeFileSync(join(spec.stateDir, "workload.pid"), `${child.pid}\n${command.join(" ")}\n`);
    child.once("exit", (code, signal) => {
      if (this.owned.get(spec.vmId) === owned) this.owned.delete(spec.vmId);
      rmSync(join(spec.stateDir, "workload.pid"), { force: true });
      if (!owned.stopping) for (const l of owned.exitListeners.splice(0)) l({ code, signal });
    });
    try {
      await waitForPort(port, this.bootTimeoutMs, () => child.exitCode !== null || child.signalCode !== null);
    } catch (err) {
      owned.stopping = true;
      child.kill("SIGKILL");
      const tail = existsSync(join(spec.stateDir, "workload.log")) ? readFileSync(join(spec.stateDir, "workload.log"), "utf8").slice(-400) : "";
      throw new Error(`workload did not start: ${(err as Error).message}${tail ? `; log: ${tail.trim()}` : ""}`);
    }
    return { vm, bootMs: performance.now() - started };
  }

  async hibernate(vm: RunningVm): Promise<SnapshotResult> {
    const started = performance.now();
    const owned = this.owned.get(vm.spec.vmId);
    if (!owned) throw new Error(`no process for ${vm.spec.vmId}`);
    owned.child.kill("SIGSTOP");
    owned.frozen = true;
    return { completed: true, snapshotMs: performance.now() - started, bytes: 0 };
  }

  async wake(spec: VmSpec): Promise<WakeResult> {
    const started = performance.now();
    const owned = this.owned.get(spec.vmId);
    if (owned?.frozen && owned.child.exitCode === null) {
      owned.child.kill("SIGCONT");
      owned.frozen = false;
      // The workload runs on the host's clock: there is nothing to fix.
      return { vm: owned.vm, mode: "restore", timings: { restoreMs: performance.now() - started, clockFixMs: 0, skewBeforeMs: 0, skewAfterMs: 0 } };
    }
    const booted = await this.boot(spec);
    return {
      vm: booted.vm,
      mode: "boot",
      timings: { restoreMs: booted.bootMs, clockFixMs: 0, skewBeforeMs: 0, skewAfterMs: 0 },
      fallbackReason: "no frozen process (the process driver keeps no snapshot across host restarts)",
    };
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
    if (!vm.pid) return 0;
    return readCpuSeconds(vm.pid, { includeChildren: true });
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
    this.owned.get(vm.spec.vmId)?.exitListeners.push(listener);
  }

  async reap(spec: VmSpec): Promise<void> {
    const pidFile = join(spec.stateDir, "workload.pid");
    if (this.owned.has(spec.vmId) || !existsSync(pidFile)) return;
    const [pidLine, command] = readFileSync(pidFile, "utf8").split("\n");
    const pid = Number(pidLine);
    if (Number.isInteger(pid) && pid > 1 && processAlive(pid, command?.split(" ")[0])) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        /* gone already */
      }
    }
    rmSync(pidFile, { force: true });
  }

  async close(): Promise<void> {
    await Promise.all([...this.owned.values()].map((o) => this.kill(o)));
  }

  private async kill(owned: Owned): Promise<void> {
    owned.stopping = true;
    if (owned.child.exitCode !== null || owned.child.signalCode !== null) return;
    owned.child.kill("SIGTERM");
    owned.child.kill("SIGCONT"); // a frozen process only sees SIGTERM once it runs again
    const timer = setTimeout(() => owned.child.kill("SIGKILL"), 2000);
    await owned.exited;
    clearTimeout(timer);
  }
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => resolve(typeof addr === "object" && addr ? addr.port : 0));
    });
  });
}

async function waitForPort(port: number, timeoutMs: number, gaveUp: () => boolean): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    if (gaveUp()) throw new Error("the process exited");
    const ok = await new Promise<boolean>((resolve) => {
      const sock = connect(port, "127.0.0.1");
      sock.once("connect", () => {
        sock.destroy();
        resolve(true);
      });
      sock.once("error", () => resolve(false));
    });
    if (ok) return;
    if (performance.now() > deadline) throw new Error(`nothing listened on port ${port} within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

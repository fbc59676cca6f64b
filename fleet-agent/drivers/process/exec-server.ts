// The process driver's exec server: the guest's guest-exec (fleet-agent/guest/guest-exec/), built for the host, run
// per VM on a loopback port with `--root` the agent's files (a built image's rootfs; for the demo an empty directory of
// its own), the image's launch spec for the defaults, and a key made per run in a root-only file of the stateDir. It
// chroots like the launcher: NOT isolation (the process driver has none), only the same paths as in a VM. Its whole
// process tree (connections, commands, background processes' keepers, which it keeps as a subreaper) is frozen,
// thawed and ended with the VM; where the host allows it, in a PID namespace of its own (common/pid-ns.c), so that a
// command it started ends with it also when the fleet-agent is killed.
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { closeSync } from "node:fs";
import { chmod, mkdir, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { createInterface } from "node:readline";
import type { Logger } from "../../../lib/log.ts";
import { processAlive, readPidFile, signalTree, writePidFile } from "../common/proc.ts";
import { inPidNamespace } from "../common/pid-namespace.ts";
import { dyingWithUs, openLog } from "../common/vm-process.ts";
import type { ExecTarget } from "../driver.ts";

/** The exec server's files in a VM's stateDir: its key, background processes' state, its pid file and log. */
export function execPaths(stateDir: string): { dir: string; key: string; state: string; pid: string; log: string; demoRoot: string } {
  const dir = join(stateDir, "exec");
  return {
    dir,
    key: join(dir, "key"),
    state: join(dir, "state"),
    pid: join(dir, "guest-exec.pid"),
    log: join(dir, "guest-exec.log"),
    demoRoot: join(stateDir, "exec-root"),
  };
}

export class ProcessExecServer {
  private readonly child: ChildProcess;
  readonly target: ExecTarget;

  private constructor(child: ChildProcess, target: ExecTarget) {
    this.child = child;
    this.target = target;
  }

  /** Starts it and waits for its port (its first line on stdout). */
  static async start(opts: {
    binary: string;
    stateDir: string;
    root: string;
    spec?: string;
    /** The namespace helper (pid-namespace.ts), when the server is to run in a PID namespace of its own. */
    pidNamespace?: string | undefined;
    log: Logger;
  }): Promise<ProcessExecServer> {
    const paths = execPaths(opts.stateDir);
    await mkdir(paths.dir, { recursive: true, mode: 0o700 });
    await chmod(paths.dir, 0o700);
    // A run starts without the background processes of the last one, as a guest's tmpfs does at its boot; their pids
    // (a namespace's, counted from 1 again) would be read against this run's processes.
    await rm(paths.state, { recursive: true, force: true });
    const key = randomBytes(32).toString("hex");
    await writeFile(paths.key, key, { mode: 0o600 });
    const args = ["--listen", "127.0.0.1:0", "--root", opts.root, "--key-file", paths.key, "--state-dir", paths.state];
    if (opts.spec) args.push("--spec", opts.spec);
    const logFd = openLog(paths.log);
    let child: ChildProcess;
    try {
      // It dies with the fleet-agent, as the workload does (vm-process.ts `dyingWithUs`, or the namespace's helper).
      const command = opts.pidNamespace ? inPidNamespace(opts.pidNamespace, opts.binary, args) : dyingWithUs(opts.binary, args);
      child = spawn(...command, { stdio: ["ignore", "pipe", logFd], detached: true, env: {} });
    } finally {
      closeSync(logFd);
    }
    const port = await new Promise<number>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("the exec server did not say its port within 10 s")), 10_000);
      const lines = createInterface({ input: child.stdout! });
      lines.on("line", (line) => {
        const m = /listening on 127\.0\.0\.1:(\d+)/.exec(line);
        if (m) {
          clearTimeout(timer);
          resolve(Number(m[1]));
        }
      });
      child.once("error", (err) => {
        clearTimeout(timer);
        reject(err);
      });
      child.once("exit", (code, signal) => {
        clearTimeout(timer);
        reject(new Error(`the exec server exited (${signal ?? `status ${code}`}) before listening`));
      });
    });
    child.stdout!.resume();
    if (child.pid) writePidFile(paths.pid, child.pid, paths.key);
    opts.log.info("exec server started", { pid: child.pid, port });
    return new ProcessExecServer(child, { host: "127.0.0.1", port, key });
  }

  freeze(): void {
    if (this.child.pid && this.child.exitCode === null) signalTree(this.child.pid, "SIGSTOP");
  }

  thaw(): void {
    if (this.child.pid && this.child.exitCode === null) signalTree(this.child.pid, "SIGCONT");
  }

  /** Ends it and everything it started (background processes too). */
  stop(): void {
    if (this.child.pid) signalTree(this.child.pid, "SIGKILL");
  }
}

/** Ends an exec server (and its tree) a previous fleet-agent left running for this VM. */
export function reapExecServer(stateDir: string): void {
  const paths = execPaths(stateDir);
  const left = readPidFile(paths.pid);
  if (left && processAlive(left.pid, paths.key)) signalTree(left.pid, "SIGKILL");
}

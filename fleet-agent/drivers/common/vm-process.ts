// The host process that runs one VM (QEMU, Firecracker, or the process driver's workload): started in its own
// process group with its output in a bounded log file, its exit awaited, ended on purpose or reported as a crash.
//
// One behaviour for every driver where each had its own: logs are rotated past LOG_MAX_BYTES (only qemu capped them),
// a crash is told to onExit listeners exactly once, also to one that registers after the crash (only qemu did),
// and a stop is "ask, wait a grace period, then SIGKILL and wait for the exit".
import { spawn, type ChildProcess } from "node:child_process";
import {
  closeSync,
  copyFileSync,
  existsSync,
  fstatSync,
  openSync,
  readFileSync,
  readSync,
  renameSync,
  rmSync,
  statSync,
  truncateSync,
  writeSync,
} from "node:fs";
import { appendFile } from "node:fs/promises";
import { setTimeout as sleep } from "node:timers/promises";
import type { RunningVm, VmExit } from "../driver.ts";
import type { ExecStubs, PortRelay } from "./exec-stubs.ts";
import { inPidNamespace } from "./pid-namespace.ts";
import { processTree, readCpuSeconds, treeCpuSeconds } from "./proc.ts";

/**
 * A VM's log is rotated (`rotateLog`) when a new process starts on it past this size. The host rotates the logs of
 * awake agents by the same rule, with its own configured limit (fleet-agent/agent-logs.ts); this is its default.
 */
export const LOG_MAX_BYTES = 4 << 20;

/** How much of a relayed stderr is kept in memory (`VmProcess.recentOutput`). */
const RECENT_OUTPUT_CHARS = 16 << 10;

export interface SpawnVmOptions {
  vmId: string;
  command: string;
  args: readonly string[];
  /** File for the process's output (appended; rotated first when past LOG_MAX_BYTES). */
  log: string;
  /** `stderr`: stdout is discarded (QEMU writes the guest console to its own file). Default both. */
  output?: "both" | "stderr";
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /**
   * false when the child is a launcher that may fork the VM process and exit 0 (a jailer): the driver then
   * watches the real process itself and calls `end()`. Default true: the child's exit is the VM's.
   */
  childIsVm?: boolean;
  /** Count CPU time of reaped children too (a workload that runs its work in subprocesses). */
  cpuIncludesChildren?: boolean;
  /**
   * Stderr comes through a pipe to this process instead of going straight to the log file: its last lines are kept
   * in memory (`recentOutput`) and appended to the log as best it can. The log lives in the VM's stateDir, on the
   * same filesystem as its snapshots, so when a snapshot fills that disk what the hypervisor (and the `exec:`
   * command writing the snapshot, which inherits its stderr) says about it cannot be written there: kept in memory
   * it still reaches the driver's errors and our own log. No other directory is sure to be on another filesystem; a
   * pipe needs none. The cost: a VM process that outlives its fleet-agent writes stderr into a closed pipe (QEMU
   * ignores SIGPIPE), and the next fleet-agent kills such leftovers anyway.
   */
  relayStderr?: boolean;
  /**
   * Waiting exec stubs (exec-stubs.ts) to start the process from instead of forking this one, when one is free;
   * only for `output: "stderr"` with `relayStderr` (the stdio a stub has).
   */
  stubs?: ExecStubs | undefined;
  /**
   * The namespace helper (pid-namespace.ts): the command runs as the first process of a PID namespace of its own, so
   * that whatever it starts ends with it, and with the fleet-agent. The VM's pid is then the helper's outer process,
   * which ends as the command did; signals other than SIGSTOP, SIGCONT and SIGKILL sent to it reach the command's
   * process group; CPU time is the whole tree's.
   */
  pidNamespace?: string | undefined;
  /**
   * Run the process in a network namespace of its own, its loopback ports reachable only through these unix sockets
   * (exec-stub.c): it is then always started by a stub (one forked now when none waits). Needs `stubs`.
   */
  relays?: readonly PortRelay[] | undefined;
}

/**
 * util-linux's `setpriv`, which sets the parent-death signal and execs the command (same pid): what a VM's process
 * started without an exec stub runs under so that it too dies with the fleet-agent (a workload of the process driver,
 * its exec server, a hypervisor when no stub was free). Absent: it starts as it is (and a restart reaps it).
 */
const setpriv = ["/usr/bin/setpriv", "/bin/setpriv"].find((p) => existsSync(p));

/** `command args` as spawned so that the process gets SIGKILL when this one (its parent) goes. */
export function dyingWithUs(command: string, args: readonly string[]): [string, string[]] {
  return setpriv ? [setpriv, ["--pdeathsig", "KILL", "--", command, ...args]] : [command, [...args]];
}

export class VmProcess {
  readonly vmId: string;
  readonly child: ChildProcess;
  /** The VM's process: the child's pid, or the one a forking launcher started (`adopt`). */
  pid: number | undefined;
  exit: VmExit | undefined;
  readonly exited: Promise<VmExit>;
  /** Set before the driver ends the process itself: its exit is then no crash. */
  stopping = false;
  /** Why the spawn itself failed (binary missing, not executable). */
  spawnError: Error | undefined;
  private resolveExit!: (e: VmExit) => void;
  private readonly crashListeners: ((e: VmExit) => void)[] = [];
  private readonly endHooks: ((e: VmExit) => void)[] = [];
  private readonly cpuIncludesChildren: boolean;
  /** Started in a PID namespace of its own (`SpawnVmOptions.pidNamespace`). */
  readonly namespaced: boolean;
  private lastCpuSeconds = 0;
  /** Relayed stderr: its tail, the log appends in order, the first append that failed, the pipe's end. */
  private recent = "";
  private relayed = 0;
  private logAppends: Promise<void> = Promise.resolve();
  logWriteError: Error | undefined;
  private readonly outputEnded: Promise<void>;

  static spawn(opts: SpawnVmOptions): VmProcess {
    const fd = openLog(opts.log);
    try {
      // Its own process group: a terminal's Ctrl-C reaches the fleet-agent, which snapshots or stops VMs in order,
      // not the VM directly (a VM killed first would lose its state). Orphans are reaped at the next start (pid files).
      // The helper dies with this process by itself (it is told which one), as everything in its namespace does then.
      const wrapped = opts.pidNamespace ? inPidNamespace(opts.pidNamespace, opts.command, opts.args) : undefined;
      const request = {
        command: wrapped?.[0] ?? opts.command,
        args: wrapped?.[1] ?? opts.args,
        env: opts.env ?? process.env,
        cwd: opts.cwd,
        relays: opts.relays,
      };
      const stubbed = opts.stubs && opts.output === "stderr" && opts.relayStderr;
      if (opts.relays?.length) {
        const child = stubbed ? opts.stubs!.start(request) : undefined;
        if (!child) throw new Error("a process with port relays is started by an exec stub, and none can be made");
        return new VmProcess(opts.vmId, child, opts);
      }
      const viaStub = stubbed ? opts.stubs!.take(request) : undefined;
      if (viaStub) return new VmProcess(opts.vmId, viaStub, opts);
      // Not from a stub (none free, or none kept): the process is still to die with this one, as a stub's would.
      const [command, args] = wrapped ?? dyingWithUs(opts.command, opts.args);
      const child = spawn(command, args, {
        stdio: ["ignore", opts.output === "stderr" ? "ignore" : fd, opts.relayStderr ? "pipe" : fd],
        detached: true,
        ...(opts.env ? { env: opts.env } : {}),
        ...(opts.cwd ? { cwd: opts.cwd } : {}),
      });
      return new VmProcess(opts.vmId, child, opts);
    } finally {
      closeSync(fd);
    }
  }

  private constructor(vmId: string, child: ChildProcess, opts: SpawnVmOptions) {
    this.vmId = vmId;
    this.child = child;
    this.pid = child.pid;
    this.cpuIncludesChildren = opts.cpuIncludesChildren ?? false;
    this.namespaced = opts.pidNamespace !== undefined;
    this.exited = new Promise((r) => (this.resolveExit = r));
    const stderr = opts.relayStderr ? child.stderr : null;
    this.outputEnded = stderr ? new Promise((r) => stderr.once("close", () => r())) : Promise.resolve();
    stderr?.on("data", (chunk: Buffer) => this.relay(opts.log, chunk));
    child.once("error", (err) => {
      this.spawnError = err;
      this.end({ code: null, signal: null });
    });
    if (opts.childIsVm ?? true) child.once("exit", (code, signal) => this.end({ code, signal }));
  }

  /** The process is gone (idempotent): hooks run, then crash listeners if the driver did not end it. */
  end(exit: VmExit): void {
    if (this.exit) return;
    this.exit = exit;
    this.resolveExit(exit);
    for (const hook of this.endHooks.splice(0)) hook(exit);
    if (!this.stopping) for (const l of this.crashListeners.splice(0)) l(exit);
  }

  /** The VM runs in another process than the child (a launcher forked it); its exit is then polled by the caller. */
  adopt(pid: number): void {
    this.pid = pid;
  }

  /** Runs once when the process is gone, whoever ended it (the driver's bookkeeping: sockets, maps, clients). */
  onEnd(hook: (exit: VmExit) => void): void {
    if (this.exit) hook(this.exit);
    else this.endHooks.push(hook);
  }

  /** Told once if the process exits without the driver ending it, also when registered after that exit. */
  onCrash(listener: (exit: VmExit) => void): void {
    const exit = this.exit;
    if (!exit) this.crashListeners.push(listener);
    else if (!this.stopping) queueMicrotask(() => listener(exit));
  }

  /**
   * Forgets the crash listeners registered so far: the run they watched is over while the process lives on (a QEMU
   * kept stopped after its hibernation, run again at the next wake, whose host registers anew for that run).
   */
  dropCrashListeners(): void {
    this.crashListeners.length = 0;
  }

  get crashed(): boolean {
    return this.exit !== undefined && !this.stopping;
  }

  /** A line for errors while the process is gone, undefined while it runs. */
  exitedWhy(what: string): string | undefined {
    return this.exit ? `${what} exited (code ${this.exit.code}, signal ${this.exit.signal})` : undefined;
  }

  /** The last lines of the relayed stderr (as `logTail` formats them), from `since` (an `outputMark`) on; "" without `relayStderr`. */
  recentOutput(since = 0): string {
    const fresh = this.relayed - since;
    return fresh > 0 ? tailOf(this.recent.slice(-fresh)) : "";
  }

  /** A position in the relayed stderr: `recentOutput(mark)` is then only what came after it. */
  outputMark(): number {
    return this.relayed;
  }

  /** `recentOutput` once the process is gone and its stderr has been read to the end (at most `waitMs`). */
  async finalOutput(waitMs = 300): Promise<string> {
    if (this.exit) await waitAtMost(this.outputEnded, waitMs);
    return this.recentOutput();
  }

  private relay(log: string, chunk: Buffer): void {
    const text = chunk.toString("utf8");
    this.relayed += text.length;
    this.recent = (this.recent + text).slice(-RECENT_OUTPUT_CHARS);
    this.logAppends = this.logAppends
      .then(() => appendFile(log, chunk))
      .catch((err: Error) => {
        this.logWriteError ??= err;
      });
  }

  /** Cumulative CPU seconds; the last value read once the process is gone, so the counter never runs backwards. */
  cpuSeconds(): number {
    if (this.pid === undefined) return this.lastCpuSeconds;
    if (this.namespaced) {
      // The outer process and the namespace's init spend next to nothing: the work is below them, in processes that
      // come and go. A process reaped between two reads of the walk is missed once: the counter never goes back.
      const s = treeCpuSeconds(this.pid);
      if (s !== undefined) this.lastCpuSeconds = Math.max(this.lastCpuSeconds, s);
      return this.lastCpuSeconds;
    }
    const s = readCpuSeconds(this.pid, { includeChildren: this.cpuIncludesChildren });
    if (s !== undefined) this.lastCpuSeconds = s;
    return this.lastCpuSeconds;
  }

  signal(signal: NodeJS.Signals): void {
    if (this.exit) return;
    try {
      if (this.pid !== undefined && this.pid !== this.child.pid) process.kill(this.pid, signal);
      else this.child.kill(signal);
    } catch {
      // gone already
    }
  }

  /** Ends the process on the driver's behalf (no crash report) and waits until it is gone. */
  async kill(): Promise<void> {
    this.stopping = true;
    if (this.exit) return;
    // In a namespace the init is killed: the kernel ends everything in it before the init is gone, and only then does
    // the outer process exit, so that nothing of the VM runs any more once its exit is seen. (Killing the outer one
    // would end the init too, through its parent-death signal, but after the exit was seen.)
    const init = this.namespaced && this.pid !== undefined ? processTree(this.pid)[1] : undefined;
    if (init !== undefined) {
      try {
        process.kill(init, "SIGKILL");
      } catch {
        // gone already
      }
      this.signal("SIGCONT"); // a frozen outer process would not see its init go
      await waitAtMost(this.exited, 2000);
    }
    this.signal("SIGKILL");
    await this.exited;
  }

  /** Asks the process to go (`ask`), waits up to `graceMs` for it, then kills it. */
  async stop(ask: () => Promise<unknown> | void, graceMs: number): Promise<void> {
    this.stopping = true;
    if (this.exit) return;
    try {
      await ask();
    } catch {
      // it may go before answering
    }
    await waitAtMost(this.exited, graceMs);
    await this.kill();
  }
}

/** Resolves when `p` settles or after `ms`, whichever comes first; the timer does not hold the process open. */
async function waitAtMost(p: Promise<unknown>, ms: number): Promise<void> {
  const ac = new AbortController();
  await Promise.race([p, sleep(ms, undefined, { ref: false, signal: ac.signal }).catch(() => undefined)]);
  ac.abort();
}

/**
 * How long a crashed process stays findable by `onExit` after it is gone: a host asks right after a wake returns, and
 * a process that died in between must still be told. Long enough for any such gap, short enough that a host whose
 * agents come and go keeps no trace of them (a dead process holds its ChildProcess, pipes and output tail).
 */
const CRASHED_KEPT_MS = 60_000;

/**
 * The processes one driver started, found again by the VM they ran: a crash is told to onExit listeners also
 * after the driver has dropped the process from its own tables. A process the driver ended itself is forgotten at
 * its end (nobody is to be told of it); a crashed one `CRASHED_KEPT_MS` later.
 */
export class VmProcesses {
  private readonly byPid = new Map<number, VmProcess>();

  private readonly crashedKeptMs: number;

  constructor(crashedKeptMs = CRASHED_KEPT_MS) {
    this.crashedKeptMs = crashedKeptMs;
  }

  add(proc: VmProcess): void {
    const pid = proc.pid;
    if (pid === undefined) return;
    this.byPid.set(pid, proc);
    proc.onEnd(() => {
      const forget = () => {
        if (this.byPid.get(pid) === proc) this.byPid.delete(pid);
      };
      if (proc.stopping) forget();
      else setTimeout(forget, this.crashedKeptMs).unref();
    });
  }

  /** How many processes are findable (running, or crashed within `CRASHED_KEPT_MS`): for tests of the bound. */
  get size(): number {
    return this.byPid.size;
  }

  /** `VmDriver.onExit`: the process that runs `vm`, if it was this driver's. */
  onExit(vm: RunningVm, listener: (exit: VmExit) => void): void {
    const proc = vm.pid === undefined ? undefined : this.byPid.get(vm.pid);
    if (proc && proc.vmId === vm.spec.vmId) proc.onCrash(listener);
  }
}

/** Rotates a VM's log (its process log, QEMU's console file) when it grew past LOG_MAX_BYTES: the last run's output stays in `<log>.1`. */
export function capLog(path: string): void {
  try {
    if (statSync(path).size > LOG_MAX_BYTES) rotateLog(path);
  } catch {
    // no log yet
  }
}

/** Where a rotated log's one older generation is kept. */
export function rotatedLogPath(path: string): string {
  return `${path}.1`;
}

/**
 * Rotates a log in place: its content replaces `<log>.1` (one older generation is kept), then it is truncated. Its
 * writers hold it open in append mode, so they go on writing at its (new) end; nobody has to reopen anything.
 *
 * The copy is written beside `<log>.1` and renamed over it, so a reader never sees half of it and can tell a new
 * generation by its inode. What a writer appends while the copy runs is copied after it; only what lands between
 * that last look and the truncate (microseconds) is lost. When the copy cannot be written (a full disk) the log is
 * truncated all the same, without keeping it: an unbounded log would fill the disk the snapshots need.
 * Synchronous on purpose: a reader in this process (a follow) never sees the log between the rename and the truncate.
 */
export function rotateLog(path: string): "rotated" | "truncated" {
  const aside = rotatedLogPath(path);
  const tmp = `${aside}.tmp`;
  try {
    copyFileSync(path, tmp);
    appendGrowth(path, tmp);
    renameSync(tmp, aside);
    truncateSync(path, 0);
    return "rotated";
  } catch (err) {
    rmSync(tmp, { force: true });
    if (statSync(path, { throwIfNoEntry: false }) === undefined) throw err; // no log (any more): nothing to bound
    truncateSync(path, 0);
    return "truncated";
  }
}

/** Appends to `copy` what `source` grew by since `copy` was made from it (a few rounds at most: writers may keep writing). */
function appendGrowth(source: string, copy: string): void {
  const from = openSync(source, "r");
  const to = openSync(copy, "a");
  try {
    let copied = fstatSync(to).size;
    const buf = Buffer.alloc(64 << 10);
    for (let round = 0; round < 8; round++) {
      const size = fstatSync(from).size;
      if (size <= copied) return;
      while (copied < size) {
        const n = readSync(from, buf, 0, Math.min(buf.length, size - copied), copied);
        if (n === 0) return;
        writeSync(to, buf, 0, n);
        copied += n;
      }
    }
  } finally {
    closeSync(from);
    closeSync(to);
  }
}

/** Opens a VM's log for appending, rotated first when past LOG_MAX_BYTES. */
export function openLog(path: string): number {
  capLog(path);
  return openSync(path, "a");
}

/** The last lines of a log, for error messages: up to 3 lines joined by " | ", at most 600 characters. */
export function logTail(path: string): string {
  try {
    return tailOf(readFileSync(path, "utf8"));
  } catch {
    return "";
  }
}

function tailOf(text: string): string {
  const tail = text.trim().split("\n").slice(-3).join(" | ");
  return tail.length > 600 ? `…${tail.slice(-600)}` : tail;
}

/** `err` with the log's tail appended (once), labelled e.g. "qemu" or "firecracker log". */
export function withLogTail(err: Error, path: string, label: string): Error {
  return withTail(err, logTail(path), label);
}

/** `err` with `tail` (a process's last words) appended once. */
export function withTail(err: Error, tail: string, label: string): Error {
  if (!tail || err.message.includes(tail)) return err;
  return new Error(`${err.message} (${label}: ${tail})`, { cause: err });
}

// Hypervisor processes started without forking the fleet-agent on the wake path: a few small exec stubs (exec-stub.c)
// wait, already forked, with the stdio a VM gets (stdout discarded, stderr a pipe to us); a spawn hands one the
// command line and it execs it, keeping its pid, its pipe and its place as our child. Measured on this project's
// 2-core host: a `child_process.spawn` from a fleet-agent of ~300 MiB RSS blocks its event loop 25–35 ms (fork copies
// the page tables); handing a stub its command takes well under 1 ms. Stubs used up are replaced after a quiet
// moment, off the caller's path; when none is waiting (a burst, or no gcc) a spawn forks as before. A command with
// port relays (a QEMU in a network namespace of its own, reachable through root-only unix sockets) always starts
// from a stub, forked on the spot when none waits: only the stub makes the namespace and the relay.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { join } from "node:path";
import type { Writable } from "node:stream";
import type { Logger } from "../../../lib/log.ts";
import { buildCTool, toolCacheDir, type CTool } from "../../../lib/node-c-tool.ts";

const SOURCE = join(import.meta.dirname, "exec-stub.c");

/** What a stub becomes: a program looked up on PATH unless it has a slash, with exactly this environment. */
export interface StubCommand {
  command: string;
  args: readonly string[];
  env: NodeJS.ProcessEnv;
  cwd?: string | undefined;
  /**
   * Run it in a network namespace of its own, reachable only through these unix sockets, each relayed to a TCP port
   * on the namespace's loopback (exec-stub.c). Absent or empty: the host's network, as it is.
   */
  relays?: readonly PortRelay[] | undefined;
}

/** A unix socket (mode 0600) the stub's relay serves, and the port in the command's namespace it connects to. */
export interface PortRelay {
  socket: string;
  port: number;
}

export interface ExecStubsOptions {
  log: Logger;
  /** Stubs kept waiting (default 2; 0: none wait, `start` forks one when asked). */
  size?: number;
  /** How long after a stub is taken the pool is filled again (ms, default 300): the fork then blocks no wake. */
  refillDelayMs?: number;
  /**
   * Every command will have relays (a host whose QEMUs each run in a namespace of their own): the stubs make their
   * namespace while they wait (`exec-stub --netns`), off the wake's path.
   */
  netns?: boolean;
  /** The command's stdout: discarded (a VM's hypervisor), or a pipe to us (a helper whose answer is read). */
  stdout?: "ignore" | "pipe";
  /** The compiled stub (tests); default: exec-stub.c built with gcc on first use. */
  tool?: CTool;
}

let builtTool: CTool | undefined;

/** The stub, built with gcc on first use (once per process). */
export function execStubTool(): CTool {
  return (builtTool ??= buildCTool({ file: SOURCE }, "exec-stub", toolCacheDir("qemu")));
}

/** The request a stub reads: `cwd NUL relays NUL (socket NUL port NUL)… argc NUL argv… NUL env… NUL` (exec-stub.c). */
export function stubRequest(c: StubCommand): Buffer {
  const relays = c.relays ?? [];
  const fields = [c.cwd ?? "", String(relays.length), ...relays.flatMap((r) => [r.socket, String(r.port)]), String(c.args.length + 1), c.command, ...c.args];
  for (const [k, v] of Object.entries(c.env)) if (v !== undefined) fields.push(`${k}=${v}`);
  for (const f of fields) if (f.includes("\0")) throw new Error(`a command line or environment value holds a NUL byte: ${f.slice(0, 60)}`);
  return Buffer.from(fields.map((f) => `${f}\0`).join(""));
}

/**
 * Whether commands can run in network namespaces of their own here (StubCommand.relays): the stub is built and can
 * make one (root: CAP_SYS_ADMIN). Asked once by a driver at its start, answered with why not.
 */
export function privateNetwork(tool: CTool): { ok: true } | { ok: false; why: string } {
  if (!("path" in tool)) return { ok: false, why: `no exec stub: ${tool.error}` };
  const r = spawnSync(tool.path, ["--probe-netns"], { encoding: "utf8", timeout: 5000 });
  if (r.status === 0) return { ok: true };
  return { ok: false, why: `cannot make a network namespace: ${(r.stdout || r.stderr || r.error?.message || `exit ${r.status}`).trim()}` };
}

export class ExecStubs {
  private readonly idle: ChildProcess[] = [];
  private readonly size: number;
  private readonly refillDelayMs: number;
  private readonly log: Logger;
  private readonly tool: CTool;
  private readonly stubArgs: string[];
  private readonly stdio: ["pipe", "ignore" | "pipe", "pipe"];
  private refill: NodeJS.Timeout | undefined;
  private closed = false;

  constructor(opts: ExecStubsOptions) {
    this.log = opts.log;
    this.size = opts.size ?? 2;
    this.refillDelayMs = opts.refillDelayMs ?? 300;
    this.tool = opts.tool ?? execStubTool();
    this.stubArgs = opts.netns ? ["--netns"] : [];
    this.stdio = ["pipe", opts.stdout ?? "ignore", "pipe"];
    if ("error" in this.tool && this.size > 0) this.log.warn("no exec stubs: VM processes are forked from the fleet-agent", { err: this.tool.error });
  }

  /** Whether stubs can be made here (gcc built the stub). */
  get available(): boolean {
    return "path" in this.tool;
  }

  /**
   * A child running `c` like `take`, from a stub forked now (from this process) when none is waiting: what a command
   * that needs the stub (`relays`) starts from. Undefined only without a stub binary.
   */
  start(c: StubCommand): ChildProcess | undefined {
    const waiting = this.take(c);
    if (waiting || !("path" in this.tool)) return waiting;
    const stub = spawn(this.tool.path, this.stubArgs, { stdio: this.stdio, detached: true });
    stub.stdin?.on("error", () => undefined); // a stub that failed to start: its exit (or spawn error) says so
    (stub.stdin as Writable).end(stubRequest(c));
    return stub;
  }

  /** Forks the stubs the pool lacks (off any caller's path: at start, and a moment after stubs were taken). */
  fill(): void {
    if (this.closed || !("path" in this.tool)) return;
    while (this.idle.length < this.size) {
      const stub = spawn(this.tool.path, this.stubArgs, { stdio: this.stdio, detached: true });
      stub.once("error", (err) => {
        this.forget(stub);
        this.log.warn("exec stub failed to start", { err });
      });
      // A waiting stub that ends (killed from outside) is of no use; one that was used is no longer in the pool.
      stub.once("exit", () => this.forget(stub));
      // Waiting stubs keep nothing alive: an idle fleet-agent exits as it would without them.
      quiet(stub, false);
      this.idle.push(stub);
    }
  }

  /**
   * A child running `c` (its stdout discarded unless `stdout` is "pipe", its stderr a pipe), or undefined when no stub
   * is waiting: the caller then spawns it itself. The child's exit is the command's (the stub execs it; an exec that fails exits 127
   * after saying why on stderr).
   */
  take(c: StubCommand): ChildProcess | undefined {
    if (this.closed) return undefined;
    let stub: ChildProcess | undefined;
    while ((stub = this.idle.shift())) if (stub.exitCode === null && stub.signalCode === null && stub.pid !== undefined) break;
    this.scheduleRefill();
    if (!stub) return undefined;
    quiet(stub, true);
    (stub.stdin as Writable).end(stubRequest(c));
    return stub;
  }

  /** Ends the waiting stubs (they exit when their input closes) and stops refilling. */
  close(): void {
    this.closed = true;
    if (this.refill) clearTimeout(this.refill);
    for (const stub of this.idle.splice(0)) {
      stub.stdin?.end();
      stub.kill("SIGKILL");
    }
  }

  private scheduleRefill(): void {
    if (this.refill || this.closed) return;
    this.refill = setTimeout(() => {
      this.refill = undefined;
      this.fill();
    }, this.refillDelayMs);
    this.refill.unref();
  }

  private forget(stub: ChildProcess): void {
    const i = this.idle.indexOf(stub);
    if (i >= 0) this.idle.splice(i, 1);
  }
}

/** Whether the child and its pipes hold the event loop open (a VM's process does; a waiting stub does not). */
function quiet(child: ChildProcess, ref: boolean): void {
  const handles = [child, child.stdin, child.stdout, child.stderr] as unknown as ({ ref?(): void; unref?(): void } | null)[];
  for (const h of handles) (ref ? h?.ref : h?.unref)?.call(h);
}

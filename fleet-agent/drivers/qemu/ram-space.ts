// Disk space of a file-backed VM's RAM file: all of it reserved while a guest may run on the file, only what the guest
// holds while it sleeps.
//
// Why reserve: the RAM file is mapped shared, so a guest write to a page that has no block yet makes the host kernel
// allocate one in the page fault. On a full filesystem that fails, and QEMU dies of SIGBUS, idle or not, taking the
// agent's live state with it. With every block allocated up front (fallocate: unwritten extents, read as zeros, no data
// written) a guest write never allocates, and a full disk costs a running VM nothing but a failed hibernation (the
// device state cannot be written), as with streamed memory. Reserving is done before the guest runs (a cold boot, a
// wake before `cont`); when it fails the wake fails and the snapshot stays as it was.
//
// Why dig afterwards: reserved, a sleeping agent's file would take its whole memory size on disk. Once its hibernation
// is committed and its pages durable, ram-space.c makes every range that reads as zero a hole again (unwritten extents
// and the pages the guest zeroed). Never while a guest runs on the file: a wake cancels the dig and waits for its end
// before it reserves (RamSpace).
// Not covered: a RAM file whose extents are shared with a copy (reflinks on XFS: a restored checkpoint) needs new blocks
// for the pages its guest writes, which a reservation cannot give without unsharing (copying) the whole file.
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { promisify } from "node:util";
import { mkdir, open, rm } from "node:fs/promises";
import { dirname, join } from "node:path";
import { buildCTool, toolCacheDir, type CTool } from "../../../lib/node-c-tool.ts";
import type { Logger } from "../../../lib/log.ts";
import { WakeRefused } from "../common/restore-or-boot.ts";
import { freeBytes, saysNoSpace } from "../common/snapshot-space.ts";

const run = promisify(execFile);
/** A dig reads the file's data once (≈ 200 ms for 60 MiB out of the page cache): one still at it after this is stuck. */
const DIG_TIMEOUT_MS = 600_000;
const SOURCE = join(import.meta.dirname, "ram-space.c");
let tool: CTool | undefined;

/** The compiled helper (gcc on first use), or why there is none: RAM files are then sparse while awake (logged at start). */
export function ramSpaceTool(): CTool {
  return (tool ??= buildCTool({ file: SOURCE }, "ram-space", toolCacheDir("qemu")));
}

/**
 * Why `dir`'s filesystem cannot keep RAM files well (reserve a file's blocks, then punch them out again), undefined
 * when it can: tried on a small file of its own, removed after.
 */
export async function ramFileUnfit(dir: string): Promise<string | undefined> {
  const helper = ramSpaceTool();
  if (!("path" in helper)) return `no helper to reserve a RAM file's blocks (${helper.error})`;
  await mkdir(dir, { recursive: true });
  const file = join(dir, `.ram-probe-${process.pid}`);
  const size = 1 << 20;
  try {
    const fh = await open(file, "w");
    try {
      await fh.truncate(size);
      await fh.write(Buffer.alloc(4096, 1), 0, 4096, 0);
    } finally {
      await fh.close();
    }
    const blocks = async (cmd: string) => Number((await run(helper.path, [cmd, file], { timeout: 10_000 })).stdout.trim().split(" ")[1]);
    if ((await blocks("reserve")) < size) return "the filesystem allocates no blocks for fallocate";
    if ((await blocks("dig")) >= size) return "the filesystem punches no holes";
    return undefined;
  } catch (err) {
    return `the filesystem refused: ${(err as { stderr?: string }).stderr?.trim() || (err as Error).message}`;
  } finally {
    await rm(file, { force: true });
  }
}

/**
 * Runs the helper with these arguments, its stdout and stderr piped. On a host with exec stubs it is handed to a stub
 * already waiting (QemuDriver): a fork of the fleet-agent itself blocks its event loop for 15–30 ms, on a wake's path.
 */
export type StartHelper = (path: string, args: readonly string[]) => ChildProcess;

const forkHelper: StartHelper = (path, args) => spawn(path, args, { stdio: ["ignore", "pipe", "pipe"] });

/** A helper's run: its process, and its end (killed after `timeoutMs`): its exit code (null: killed) and what it wrote. */
function runHelper(
  start: StartHelper,
  path: string,
  args: readonly string[],
  timeoutMs: number,
): { child: ChildProcess; done: Promise<{ code: number | null; stdout: string; stderr: string }> } {
  const child = start(path, args);
  const done = new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve, reject) => {
    let stdout = "";
    let stderr = "";
    child.stdout?.setEncoding("utf8").on("data", (d: string) => (stdout += d));
    child.stderr?.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.once("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.once("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
  return { child, done };
}

/**
 * The RAM files' space, by vmId: reserved before a guest may run on one (`reserve`), dug once it sleeps (`dig`). Digs
 * run one at a time per VM and are cancelled before a guest may run on the file. A dig is asked for after the fact
 * (once the RAM is durable, once a kept QEMU ended), so it carries the ticket its hibernation took: a cancel since (a
 * wake, a checkpoint) makes it stale, and it does not start.
 */
export class RamSpace {
  private readonly running = new Map<string, { kill: () => void; done: Promise<void> }>();
  /** Per VM, bumped by each cancel. */
  private readonly epochs = new Map<string, number>();
  private readonly log: Logger;
  private readonly startHelper: StartHelper;

  constructor(log: Logger, startHelper: StartHelper = forkHelper) {
    this.log = log;
    this.startHelper = startHelper;
  }

  /**
   * Allocates every block of the RAM file (ram-space.c `reserve`: holes become unwritten extents, data is kept, the
   * file's mtime is put back). Rejects with WakeRefused (a guest must not run on the file; the snapshot stays): how much
   * is needed and free on a full filesystem, the helper's words otherwise. Without the helper it does nothing.
   */
  async reserve(file: string): Promise<void> {
    const helper = ramSpaceTool();
    if (!("path" in helper)) return;
    let said: string;
    let cause: unknown;
    try {
      const r = await runHelper(this.startHelper, helper.path, ["reserve", file], 30_000).done;
      if (r.code === 0) return;
      said = r.stderr.trim() || (r.code === null ? "killed after 30 s" : `exit ${r.code}`);
    } catch (err) {
      said = (err as Error).message;
      cause = err;
    }
    if (!saysNoSpace(said)) throw new WakeRefused(`reserving the blocks of the guest's RAM file failed: ${said}`, { cause });
    const dir = dirname(file);
    const free = await freeBytes(dir);
    const mib = (n: number | undefined) => (n === undefined ? "?" : String(Math.round(n / 2 ** 20)));
    const size = Number(/\((\d+) bytes\)/.exec(said)?.[1] ?? Number.NaN);
    throw new WakeRefused(
      `no space for the guest's RAM file: it needs ${Number.isNaN(size) ? "its size" : `${mib(size)} MiB`} allocated while the agent is awake, ${mib(free)} MiB free in ${dir}`,
      { cause },
    );
  }

  /** A ticket for a later `dig`: valid until the VM's next `cancel`. Taken when a hibernation is committed. */
  ticket(vmId: string): number {
    return this.epochs.get(vmId) ?? 0;
  }

  /** Digs the holes of `file` in the background, unless the VM was cancelled since `ticket` was taken. */
  dig(vmId: string, file: string, ticket: number): void {
    if (ticket !== this.ticket(vmId)) return; // a wake (or a checkpoint) came first: its guest may run on the file
    const helper = ramSpaceTool();
    if (!("path" in helper)) return; // nothing was reserved either
    const previous = this.running.get(vmId)?.done ?? Promise.resolve(); // one at a time; a start never ends another
    const started = performance.now();
    let cancelled = false;
    let child: ChildProcess | undefined;
    const done = previous.then(async () => {
      if (cancelled) return;
      const run = runHelper(this.startHelper, helper.path, ["dig", file], DIG_TIMEOUT_MS);
      child = run.child;
      try {
        const { code, stdout, stderr } = await run.done;
        const [before, after] = stdout.trim().split(" ").map(Number);
        if (code === 0)
          this.log.info("RAM file holes dug", {
            vmId,
            digMs: Math.round(performance.now() - started),
            allocatedMiB: [Math.round((before ?? 0) / 2 ** 20), Math.round((after ?? 0) / 2 ** 20)],
            ...(cancelled ? { stoppedEarly: true } : {}),
          });
        else this.log.warn("digging a RAM file's holes failed", { vmId, said: stderr.trim(), code });
      } catch (err) {
        this.log.warn("digging a RAM file's holes failed", { vmId, err: (err as Error).message });
      }
    });
    const entry = {
      kill: () => {
        cancelled = true;
        child?.kill("SIGTERM"); // it stops after the punch in flight and puts the file's times back (ram-space.c)
      },
      done,
    };
    this.running.set(vmId, entry);
    void done.then(() => {
      if (this.running.get(vmId) === entry) this.running.delete(vmId);
    });
  }

  /** Ends the VM's dig, if one runs, and resolves once its process is gone (the file's times put back: its fingerprint holds). */
  cancel(vmId: string): Promise<void> {
    this.epochs.set(vmId, this.ticket(vmId) + 1);
    const entry = this.running.get(vmId);
    if (!entry) return Promise.resolve();
    entry.kill();
    return entry.done;
  }

  /** A destroyed VM: its dig ended, and nothing kept of it. */
  async forget(vmId: string): Promise<void> {
    await this.cancel(vmId);
    this.epochs.delete(vmId);
  }

  /** Every dig still running (a host's shutdown ends them). */
  async cancelAll(): Promise<void> {
    await Promise.all([...this.running.keys()].map((id) => this.cancel(id)));
  }
}

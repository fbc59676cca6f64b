// The process driver with checkpoints made by copying the VM's directory: enough to drive the host's and the API's checkpoint logic without QEMU.
//
// A process has no memory to keep: a restored or forked agent's next wake boots its workload again (the process
// driver's fallback), over the files the checkpoint copied. `restored-from` in its state directory names the checkpoint.
// The "guest" asks for checkpoints by writing names, one a line, into `<stateDir>/checkpoint-requests`.
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";
import { AppError } from "../../lib/errors.ts";
import type { CheckpointInfo, RunningVm, VmSpec, WakeResult } from "../../fleet-agent/drivers/driver.ts";
import { ProcessDriver, type ProcessDriverOptions } from "../../fleet-agent/drivers/process/driver.ts";

/** The file a fake guest writes checkpoint names into. */
export const checkpointRequestsFile = "checkpoint-requests";
/** Where a restored or forked state directory says which checkpoint it came from. */
export const restoredFromFile = "restored-from";

export class FakeCheckpointDriver extends ProcessDriver {
  /** What happened, in order: `checkpoint:start <agent>`, `checkpoint:end <agent>`, `wake <agent>`, `restore <agent> <ckp>`. */
  readonly happened: string[] = [];
  /** How long each checkpoint takes beyond the copy (to catch work that would overlap it). */
  checkpointDelayMs = 0;

  constructor(opts: ProcessDriverOptions = {}) {
    super(opts);
  }

  async checkpoint(spec: VmSpec, vm: RunningVm | undefined, dir: string): Promise<CheckpointInfo> {
    if (existsSync(dir)) throw new Error(`checkpoint directory ${dir} exists`);
    if (!existsSync(spec.stateDir)) throw new AppError("conflict", `agent ${spec.agentId} has no state to copy`);
    this.happened.push(`checkpoint:start ${spec.agentId}`);
    const started = performance.now();
    mkdirSync(dir);
    cpSync(spec.stateDir, join(dir, "state"), { recursive: true, filter: (src) => basename(src) !== checkpointRequestsFile });
    writeFileSync(join(dir, "checkpoint.json"), JSON.stringify({ agentId: spec.agentId, running: vm !== undefined }));
    if (this.checkpointDelayMs > 0) await new Promise((r) => setTimeout(r, this.checkpointDelayMs));
    const ms = performance.now() - started;
    this.happened.push(`checkpoint:end ${spec.agentId}`);
    return { bytes: bytesUnder(dir), pausedMs: vm ? ms : 0, ms, copy: "copy" };
  }

  async restoreCheckpoint(spec: VmSpec, dir: string): Promise<void> {
    if (!existsSync(join(dir, "state"))) throw new AppError("not_found", `no checkpoint at ${dir}`);
    this.happened.push(`restore ${spec.agentId} ${basename(dir)}`);
    await this.destroy(spec); // a frozen process would otherwise be what the next wake resumes
    cpSync(join(dir, "state"), spec.stateDir, { recursive: true });
    writeFileSync(join(spec.stateDir, restoredFromFile), basename(dir));
  }

  async guestCheckpointRequests(vm: RunningVm): Promise<string[]> {
    const file = join(vm.spec.stateDir, checkpointRequestsFile);
    if (!existsSync(file)) return [];
    const taken = `${file}.taken`;
    renameSync(file, taken); // each name once, however often the host asks
    const names = readFileSync(taken, "utf8")
      .split("\n")
      .filter((l) => l !== "");
    rmSync(taken);
    return names;
  }

  override async wake(spec: VmSpec): Promise<WakeResult> {
    this.happened.push(`wake ${spec.agentId}`);
    return super.wake(spec);
  }
}

function bytesUnder(dir: string): number {
  let total = 0;
  for (const e of readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (e.isFile()) total += statSync(join(e.parentPath, e.name)).size;
  }
  return total;
}

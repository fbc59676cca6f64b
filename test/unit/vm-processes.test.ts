// VmProcesses: a crashed VM process is still told to an onExit listener that registers after the crash, and no ended
// process is kept past that (a host whose agents wake and sleep by the thousand must not keep one per wake).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import type { RunningVm, VmExit } from "../../fleet-agent/drivers/driver.ts";
import { VmProcess, VmProcesses } from "../../fleet-agent/drivers/common/vm-process.ts";
import { waitFor } from "../helpers/wait.ts";

const dir = mkdtempSync(join(tmpdir(), "vm-processes-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function start(vmId: string, args: string[]): VmProcess {
  return VmProcess.spawn({ vmId, command: "sleep", args, log: join(dir, `${vmId}.log`) });
}

const running = (proc: VmProcess) => ({ pid: proc.pid, spec: { vmId: proc.vmId } }) as unknown as RunningVm;

describe("VmProcesses", () => {
  it("forgets a process the driver ended at once, and nobody is told of it", async () => {
    const procs = new VmProcesses();
    const proc = start("vm_ended", ["600"]);
    procs.add(proc);
    const told: VmExit[] = [];
    procs.onExit(running(proc), (e) => told.push(e));
    expect(procs.size).toBe(1);
    await proc.kill();
    expect(procs.size).toBe(0);
    await new Promise((r) => setTimeout(r, 20));
    expect(told).toEqual([]);
  });

  it("tells a crash to a listener that comes after it, then forgets the process", async () => {
    const procs = new VmProcesses(300);
    const proc = start("vm_crashed", ["0.05"]);
    procs.add(proc);
    await proc.exited;
    const told: VmExit[] = [];
    procs.onExit(running(proc), (e) => told.push(e));
    await waitFor(() => told.length === 1, 2000);
    expect(told[0]).toEqual({ code: 0, signal: null });
    expect(procs.size).toBe(1);
    await waitFor(() => procs.size === 0, 3000);
    // Past the grace period a late listener is told nothing (the process is forgotten), as for any unknown pid.
    const late: VmExit[] = [];
    procs.onExit(running(proc), (e) => late.push(e));
    await new Promise((r) => setTimeout(r, 20));
    expect(late).toEqual([]);
  });
});

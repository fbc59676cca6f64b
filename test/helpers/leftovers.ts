// What a killed host leaves running when no restart reaps it (a test that failed midway): its VMs' processes, ended
// through their pid files as a restarted host would (only a live process that still matches the file's marker).
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { killLeftover } from "../../fleet-agent/drivers/common/proc.ts";

/** Ends the QEMU or workload process of every VM state directory under `vmsDir`. */
export async function endLeftoverVms(vmsDir: string): Promise<void> {
  for (const agentDir of existsSync(vmsDir) ? readdirSync(vmsDir) : []) {
    for (const name of ["qemu.pid", "workload.pid"]) await killLeftover(join(vmsDir, agentDir, name)).catch(() => undefined); // one odd entry must not leave the rest running
  }
}

// Whether a pid is still the Firecracker of one VM: its command line carries a marker unique to that VM
// (the API socket path, or the jailer --id), so a recycled pid is never mistaken for it.
import { readFile } from "node:fs/promises";

/** True when `pid` runs (not a zombie) and one of its arguments contains `marker`. */
export async function processMatches(pid: number, marker: string): Promise<boolean> {
  try {
    const cmdline = await readFile(`/proc/${pid}/cmdline`, "utf8");
    const state = await readFile(`/proc/${pid}/stat`, "utf8");
    if (/\) Z /.test(state)) return false;
    return cmdline.split("\0").some((arg) => arg.includes(marker));
  } catch {
    return false;
  }
}

export async function waitForProcessGone(pid: number, marker: string, timeoutMs: number): Promise<boolean> {
  const deadline = performance.now() + timeoutMs;
  while (performance.now() < deadline) {
    if (!(await processMatches(pid, marker))) return true;
    await new Promise((r) => setTimeout(r, 20));
  }
  return !(await processMatches(pid, marker));
}

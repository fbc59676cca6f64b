// What the benchmarks share to stop the processes they started.
import type { ChildProcess } from "node:child_process";

/** Sends `signal`, SIGKILL after `graceMs`; resolves at the exit (at once if it has exited already). */
export async function stopChild(proc: ChildProcess, signal: NodeJS.Signals, graceMs: number): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return;
  const exited = new Promise((r) => proc.once("exit", r));
  proc.kill(signal);
  const timer = setTimeout(() => proc.kill("SIGKILL"), graceMs);
  await exited;
  clearTimeout(timer);
}

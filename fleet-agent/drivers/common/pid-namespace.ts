// Whether the process driver's workloads can run in PID namespaces of their own (pid-ns.c), asked once per process:
// the helper built with gcc on first use, then its `--probe` (a namespace needs CAP_SYS_ADMIN: root, outside a
// container that took it away). Without it a workload runs as before, dying with the fleet-agent itself (setpriv's
// parent-death signal) while what it forked may outlive it until the next start reaps it.
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { buildCTool, toolCacheDir } from "../../../lib/node-c-tool.ts";

const SOURCE = join(import.meta.dirname, "pid-ns.c");

/** The helper's path when namespaces can be made here, else why not. */
export type PidNamespaceSupport = { path: string } | { error: string };

let probed: PidNamespaceSupport | undefined;

/** Built and probed on the first call (a compile the first time on this machine, then a few ms), the same answer after. */
export function pidNamespaceSupport(): PidNamespaceSupport {
  probed ??= probe();
  return probed;
}

function probe(): PidNamespaceSupport {
  const tool = buildCTool({ file: SOURCE }, "pid-ns", toolCacheDir("process"));
  if ("error" in tool) return { error: `cannot build the namespace helper: ${tool.error}` };
  const r = spawnSync(tool.path, ["--probe"], { encoding: "utf8", timeout: 10_000 });
  if (r.error) return { error: r.error.message };
  if (r.status !== 0) return { error: r.stderr.trim() || `the probe exited with ${r.status ?? r.signal}` };
  return { path: tool.path };
}

/** `command args` as spawned so that the command is the first process of a PID namespace of its own (pid-ns.c). */
export function inPidNamespace(helper: string, command: string, args: readonly string[]): [string, string[]] {
  return [helper, ["--parent", String(process.pid), "--", command, ...args]];
}

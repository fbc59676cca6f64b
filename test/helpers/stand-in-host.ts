// A stand-in fleet-agent for kill -9 tests: the process driver in a node process of its own, which boots one agent and prints what the test needs.
import { spawn, type ChildProcess } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import type { VmSpec } from "../../fleet-agent/drivers/driver.ts";

/**
 * Boots `spec` with `new ProcessDriver(driverOptions)` in a child process (a script written into `dir`) that then
 * idles until it is killed; answers the child and the JSON of `answer`, an expression over the driver `d` and the
 * booted `vm` (e.g. `{ pid: vm.pid }`, `await d.execTarget(vm)`), which the child prints once booted.
 */
export async function bootInStandInHost<T>(
  dir: string,
  driverOptions: Record<string, unknown>,
  spec: VmSpec,
  answer: string,
): Promise<{ host: ChildProcess; answer: T }> {
  const script = join(dir, "fleet-agent.ts");
  writeFileSync(
    script,
    `import { ProcessDriver } from ${JSON.stringify(join(import.meta.dirname, "../../fleet-agent/drivers/process/driver.ts"))};
const d = new ProcessDriver(${JSON.stringify(driverOptions)});
const { vm } = await d.boot(${JSON.stringify(spec)});
console.log(JSON.stringify(${answer}));
setInterval(() => {}, 1000);
`,
  );
  const host = spawn(process.execPath, [script], { stdio: ["ignore", "pipe", "inherit"] });
  const printed = await new Promise<string>((resolve, reject) => {
    host.stdout!.once("data", (c: Buffer) => resolve(c.toString()));
    host.once("exit", (code) => reject(new Error(`the stand-in fleet-agent exited (${code})`)));
  });
  return { host, answer: JSON.parse(printed) as T };
}

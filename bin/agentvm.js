#!/usr/bin/env node
// The `agentvm` command: runs cli/main.ts, under the project's own Node 24 when this Node cannot strip TypeScript types.
// Plain JavaScript on purpose, so it runs on Node 20 too (the machine's node) and hands over to node_modules/node.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";

const main = new URL("../cli/main.ts", import.meta.url);

/** Type stripping is on by default from Node 22.18 (and 23.6). */
function stripsTypes() {
  if (process.features?.typescript) return true;
  const [major, minor] = process.versions.node.split(".").map(Number);
  return major > 23 || (major === 23 && minor >= 6) || (major === 22 && minor >= 18);
}

if (stripsTypes()) {
  await import(main.href);
} else {
  const node = fileURLToPath(new URL("../node_modules/node/bin/node", import.meta.url));
  if (!existsSync(node)) {
    process.stderr.write(`agentvm needs Node 22.18 or newer to run TypeScript; this is ${process.version} and ${node} is missing (run npm install)\n`);
    process.exit(2);
  }
  const child = spawn(node, [fileURLToPath(main), ...process.argv.slice(2)], { stdio: "inherit" });
  // Ctrl-C reaches the child from the terminal itself; a signal sent to this process alone is passed on.
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(signal, () => child.kill(signal));
  child.on("error", (err) => {
    process.stderr.write(`agentvm: cannot start ${node}: ${err.message}\n`);
    process.exit(2);
  });
  child.on("exit", (code, signal) => {
    if (signal) {
      process.removeAllListeners(signal);
      process.kill(process.pid, signal);
    } else process.exit(code ?? 1);
  });
}

// Pieces of the multi-process tests: a fleet-agent in-process or as a child process, the standalone gateway as one, the Worker in workerd.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { silentLogger, createLogger } from "../../lib/log.ts";
import { parseFleetAgentConfig } from "../../fleet-agent/config.ts";
import { ProcessDriver, type ProcessImages } from "../../fleet-agent/drivers/process/driver.ts";
import type { VmDriver } from "../../fleet-agent/drivers/driver.ts";
import { startFleetAgent, type FleetAgentDaemon } from "../../compose/fleet-agent.ts";
import { defaultDbTimeouts, type Database } from "../../schema/db.ts";

export const repoRoot = fileURLToPath(new URL("../../", import.meta.url));
/** The secret gateways and hosts share in these tests (≥ 32 characters). */
export const testComponentSecret = "test-component-secret-0123456789abcdef";
export const inspectImage = [process.execPath, fileURLToPath(new URL("./workloads/inspect.ts", import.meta.url))];
/** An agent that answers `hello ` × 1000 gzip-encoded (GET /), a redirect (/redirect), or a byte every 50 ms (/drip). */
export const gzipAgentImage = [
  process.execPath,
  "-e",
  `const http = require("node:http"), zlib = require("node:zlib");
   http.createServer((req, res) => {
     if (req.url === "/redirect") { res.writeHead(302, { location: "/elsewhere" }); return res.end(); }
     if (req.url === "/drip") { res.writeHead(200, { "content-type": "text/plain" }); const t = setInterval(() => res.write("x"), 50); res.on("close", () => clearInterval(t)); return; }
     const body = zlib.gzipSync("hello ".repeat(1000));
     res.writeHead(200, { "content-type": "text/plain", "content-encoding": "gzip", "content-length": body.length });
     res.end(body);
   }).listen(Number(process.env.PORT), "127.0.0.1");`,
];

export { waitFor } from "./wait.ts";

export interface InProcessHost extends FleetAgentDaemon {
  dataDir: string;
}

/** A fleet-agent (process driver, or `driver`) in this process, serving its ingress on a loopback port, over `database`. */
export async function startHostInProcess(
  database: Database & { url: string },
  opts: { images?: ProcessImages; env?: Record<string, string>; debug?: boolean; driver?: VmDriver } = {},
): Promise<InProcessHost> {
  const dataDir = mkdtempSync(join(tmpdir(), "agentvm-host-"));
  const env = { REAPER_INTERVAL_MS: "100", DRAIN_TIMEOUT_MS: "2000", ...opts.env };
  const daemon = await startFleetAgent(
    {
      fleet: parseFleetAgentConfig(env),
      dataDir,
      databaseUrl: database.url,
      port: 0,
      hostname: "127.0.0.1",
      publicUrl: undefined,
      componentSecret: testComponentSecret,
      capacityMiB: 8192,
      heartbeatIntervalMs: 500,
      billingUrl: undefined,
      dbTimeouts: defaultDbTimeouts,
    },
    { log: opts.debug ? createLogger({ level: "debug" }) : silentLogger, driver: opts.driver ?? new ProcessDriver({ images: opts.images }), database },
  );
  const stop = daemon.stop;
  return Object.assign(daemon, {
    dataDir,
    async stop() {
      await stop();
      rmSync(dataDir, { recursive: true, force: true });
    },
  });
}

export interface Child {
  proc: ChildProcess;
  /** Everything the process wrote so far (stdout and stderr). */
  output(): string;
  /** SIGTERM, then waits for the exit code (SIGKILL after `graceMs`). */
  stop(graceMs?: number): Promise<number | null>;
}

/** Runs `node <script>` from the repository root with `env`, resolving once its output matches `ready`. */
export async function spawnNode(script: string, env: Record<string, string>, ready: RegExp, timeoutMs = 30_000): Promise<Child & { match: RegExpMatchArray }> {
  const proc = spawn(process.execPath, [join(repoRoot, script)], {
    cwd: repoRoot,
    env: { ...process.env, LOG_LEVEL: "warn", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  const exited = new Promise<number | null>((resolve) => proc.once("exit", (code) => resolve(code)));
  const match = await new Promise<RegExpMatchArray>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${script} not ready within ${timeoutMs} ms:\n${out}`)), timeoutMs);
    const onData = (d: Buffer) => {
      out += d.toString();
      const m = out.match(ready);
      if (m) {
        clearTimeout(timer);
        resolve(m);
      }
    };
    proc.stdout!.on("data", onData);
    proc.stderr!.on("data", onData);
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`${script} exited (${code}) before it was ready:\n${out}`));
    });
  });
  return {
    proc,
    match,
    output: () => out,
    async stop(graceMs = 15_000) {
      if (proc.exitCode !== null || proc.signalCode !== null) return proc.exitCode;
      proc.kill("SIGTERM");
      const timer = setTimeout(() => proc.kill("SIGKILL"), graceMs);
      const code = await exited;
      clearTimeout(timer);
      return code;
    },
  };
}

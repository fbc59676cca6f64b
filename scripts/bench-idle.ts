// `npm run bench:idle`: what a system whose agents all sleep costs its host. `npm start`'s system (process driver,
// embedded PGlite unless DATABASE_URL names a Postgres) takes one call to its demo agent, lets it hibernate, then sits
// idle for --seconds (60) beside the reference, a bare Node process listening on a port, measured over the same window:
// CPU (all threads, user + system) as % of one core, and the main thread's wake-ups a second (its voluntary context
// switches: each is the event loop going back to sleep). Options: --seconds N, --idle-timeout-ms MS (2000).
// Prints progress, then one `RESULT {json}` line.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { AppError } from "../lib/errors.ts";
import { stopChild } from "./bench/children.ts";
import { cpuSeconds } from "./bench/scale/host-process.ts";
import { printResult } from "./bench/figures.ts";
import { startSystem } from "./bench-start.ts";

const { values } = parseArgs({
  options: {
    seconds: { type: "string", default: "60" },
    "idle-timeout-ms": { type: "string", default: "2000" },
  },
});
const seconds = Number(values.seconds);
const idleTimeoutMs = Number(values["idle-timeout-ms"]);
if (!(seconds >= 5) || !(idleTimeoutMs >= 100)) throw new AppError("bad_request", "--seconds takes ≥ 5, --idle-timeout-ms ≥ 100");

const root = join(import.meta.dirname, "..");

/** CPU seconds of every thread of `pid` (user + system), and its main thread's voluntary context switches. */
function sample(pid: number): { cpuS: number; switches: number } {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  return { cpuS: cpuSeconds(pid), switches: Number(/^voluntary_ctxt_switches:\s+(\d+)/m.exec(status)![1]) };
}

const say = (line: string) => console.log(`bench:idle: ${line}`);
const dataDir = mkdtempSync(join(tmpdir(), "bench-idle-"));
const children: ChildProcess[] = [];
try {
  const system = await startSystem({
    root,
    dataDir,
    env: { ...process.env, AGENT_IDLE_TIMEOUT_MS: String(idleTimeoutMs) },
    databaseUrl: process.env.DATABASE_URL,
    onSpawn: (c) => children.push(c),
  });
  const database = process.env.DATABASE_URL ? "postgres" : "pglite";
  const agents = (await (await fetch(`${system.url}/v1/agents`, { headers: { authorization: `Bearer ${system.token}` } })).json()) as {
    agents: { id: string }[];
  };
  const agentId = agents.agents[0]?.id;
  if (!agentId) throw new AppError("internal", "the demo agent is not listed");
  const call = await fetch(`${system.url}/a/${agentId}/counter`, { method: "POST", headers: { authorization: `Bearer ${system.token}` } });
  if (call.status !== 200) throw new AppError("internal", `the demo agent answered ${call.status}`);
  await call.body?.cancel();
  // Asleep once its idle timeout and a reaper pass have gone by; then a few seconds for what the hibernation started.
  const asleepBy = Date.now() + idleTimeoutMs + 30_000;
  for (;;) {
    const res = await fetch(`${system.url}/v1/agents/${agentId}`, { headers: { authorization: `Bearer ${system.token}` } });
    const { state } = (await res.json()) as { state: string };
    if (state === "hibernated") break;
    if (Date.now() > asleepBy) throw new AppError("internal", `the demo agent is ${state}, not hibernated`);
    await new Promise((r) => setTimeout(r, 250));
  }
  say(`system up (${database}), demo agent ${agentId} called once and asleep; 5 s to settle, then ${seconds} s idle`);
  const reference = spawn(process.execPath, ["-e", "require('node:http').createServer().listen(0)"], { stdio: "ignore" });
  children.push(reference);
  await new Promise((r) => setTimeout(r, 5000));

  const pids = { system: system.child.pid!, reference: reference.pid! };
  const before = { system: sample(pids.system), reference: sample(pids.reference) };
  await new Promise((r) => setTimeout(r, seconds * 1000));
  const after = { system: sample(pids.system), reference: sample(pids.reference) };
  const cpuPct = (k: keyof typeof pids) => Math.round(((after[k].cpuS - before[k].cpuS) / seconds) * 100 * 1000) / 1000;
  const wakeups = (k: keyof typeof pids) => Math.round(((after[k].switches - before[k].switches) / seconds) * 10) / 10;
  say(`system: ${cpuPct("system")} % of a core, ${wakeups("system")} wake-ups/s; reference: ${cpuPct("reference")} %, ${wakeups("reference")}/s`);
  printResult({
    database,
    seconds,
    system_cpu_pct: cpuPct("system"),
    system_wakeups_per_s: wakeups("system"),
    reference_cpu_pct: cpuPct("reference"),
    reference_wakeups_per_s: wakeups("reference"),
  });
} finally {
  for (const c of children.reverse()) await stopChild(c, "SIGTERM", 10_000);
  rmSync(dataDir, { recursive: true, force: true });
}

// The process driver's PID namespaces (common/pid-ns.c), with real processes and real kill -9: a workload's background
// children and daemonised grandchildren end with a killed fleet-agent within 3 s, with a graceful stop, and with the
// workload's own exit (its exit code still told); a doze and a hibernation stop all of them and a wake runs them again;
// their CPU is metered; without the right to make a namespace the driver says why once and runs workloads as before.
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { bootInStandInHost } from "../helpers/stand-in-host.ts";
import { pidNamespaceSupport } from "../../fleet-agent/drivers/common/pid-namespace.ts";
import { processAlive, readCpuSeconds } from "../../fleet-agent/drivers/common/proc.ts";
import type { VmExit, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { ProcessDriver, type ProcessImages } from "../../fleet-agent/drivers/process/driver.ts";
import { createLogger } from "../../lib/log.ts";
import { waitFor } from "../helpers/wait.ts";

// Making a PID namespace needs CAP_SYS_ADMIN: root, which CI's runner is (the process driver's built images need it too).
const isRoot = process.getuid?.() === 0;
if (!isRoot) console.warn("test/e2e/process-namespace.test.ts: skipped: PID namespaces need root");

const work = mkdtempSync(join(tmpdir(), "process-ns-"));
const drivers: ProcessDriver[] = [];
afterAll(async () => {
  await Promise.all(drivers.map((d) => d.close()));
  for (const agent of started) for (const p of agentProcesses(agent)) killQuietly(p.pid); // a failed test's leftovers
  rmSync(work, { recursive: true, force: true });
});

/** A loopback HTTP server on $PORT: what the driver waits for at boot. */
const listen = `exec "${process.execPath}" -e 'require("node:http").createServer((q, s) => s.end("ok")).listen(Number(process.env.PORT), "127.0.0.1")'`;
/** A background child, and a daemon (its own session, its parent gone: neither in the workload's group nor its tree). */
const forks = "sleep 600 & (setsid sleep 601 </dev/null >/dev/null 2>&1 &);";

/** A directory of each agent's own, where a workload says what it saw and is told when to end. */
const dirOf = (agentId: string) => join(work, "said", agentId);
const dir = `"${join(work, "said")}/$AGENT_ID"`;

const images: ProcessImages = {
  forking: ["/bin/sh", "-c", `${forks} ${listen}`],
  // Takes SIGTERM (it writes `term` into its directory, then exits 42); its server runs beside it.
  graceful: ["/bin/sh", "-c", `trap 'echo term > ${dir}/term; exit 42' TERM; ${forks} (${listen}) & wait`],
  // Ends by itself when told: `exit 3`, or killed by SIGKILL, as the file `quit` in its directory says.
  quitting: [
    "/bin/sh",
    "-c",
    `${forks} (${listen}) & while [ ! -s ${dir}/quit ]; do sleep 0.05; done; [ "$(cat ${dir}/quit)" = kill ] && kill -KILL $$; exit 3`,
  ],
  // Works in a daemon: a busy loop.
  busy: ["/bin/sh", "-c", `(setsid sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 &); ${listen}`],
};

const started: string[] = [];
function spec(name: string): VmSpec {
  const agentId = `agt_ns${name}${process.pid}`;
  started.push(agentId);
  mkdirSync(dirOf(agentId), { recursive: true });
  return { vmId: `vm_ns${name}`, agentId, image: "forking", vcpus: 1, memMiB: 128, allowEgress: false, stateDir: join(work, "vms", name) };
}

function driver(extra: ConstructorParameters<typeof ProcessDriver>[0] = {}): ProcessDriver {
  const d = new ProcessDriver({ images, bootTimeoutMs: 15_000, ...extra });
  drivers.push(d);
  return d;
}

/** Every live process whose environment names this agent (the driver gives each workload AGENT_ID), with its command line. */
function agentProcesses(agentId: string): { pid: number; cmd: string }[] {
  const found: { pid: number; cmd: string }[] = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (!readFileSync(`/proc/${name}/environ`, "utf8").split("\0").includes(`AGENT_ID=${agentId}`)) continue;
      if (!processAlive(Number(name))) continue;
      found.push({ pid: Number(name), cmd: readFileSync(`/proc/${name}/cmdline`, "utf8").split("\0").join(" ").trim() });
    } catch {
      // gone meanwhile, or not ours to read
    }
  }
  return found;
}

/** The workload's processes once all are up: its server, the background sleep and the daemon (and any shell). */
async function workloadUp(agentId: string): Promise<{ pid: number; cmd: string }[]> {
  const want = [(c: string) => c === "sleep 600", (c: string) => c === "sleep 601", (c: string) => c.startsWith(`${process.execPath} -e`)];
  await waitFor(() => want.every((is) => agentProcesses(agentId).some((p) => is(p.cmd))), 5000, "the workload's processes");
  return agentProcesses(agentId);
}

const stateOf = (pid: number) => /^\d+ \(.*\) (\S)/.exec(readFileSync(`/proc/${pid}/stat`, "utf8"))?.[1];

function killQuietly(pid: number): void {
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    // gone
  }
}

describe.skipIf(!isRoot)("the process driver's PID namespaces", () => {
  it("can be made here (the probe), and not without CAP_SYS_ADMIN, saying why", () => {
    const ns = pidNamespaceSupport();
    expect(ns).toEqual({ path: expect.stringMatching(/pid-ns-[0-9a-f]{12}$/) });
    const helper = (ns as { path: string }).path;
    let refused: { status: number; stderr: string } | undefined;
    try {
      // Root without CAP_SYS_ADMIN (out of its bounding set, so not regained at the exec): as in a container that dropped it.
      execFileSync("setpriv", ["--bounding-set=-sys_admin", helper, "--probe"], { stdio: "pipe" });
    } catch (err) {
      const e = err as { status: number; stderr: Buffer };
      refused = { status: e.status, stderr: e.stderr.toString() };
    }
    expect(refused).toEqual({ status: 1, stderr: "unshare(CLONE_NEWPID): Operation not permitted\n" });
  });

  it("kill -9 of the fleet-agent: the workload, its background child and its daemon are all gone within 3 s", async () => {
    const s = spec("kill9");
    // A stand-in fleet-agent: the driver in a process of its own, which boots the workload and is then killed -9.
    const { host: parent, answer } = await bootInStandInHost<{ pid: number }>(work, { images, bootTimeoutMs: 15_000 }, s, "{ pid: vm.pid }");
    expect(answer).toEqual({ pid: expect.any(Number) });
    const before = await workloadUp(s.agentId);
    parent.kill("SIGKILL");
    const tookMs = await waitFor(() => before.every((p) => !processAlive(p.pid)), 3000, "every process of the workload gone");
    expect(agentProcesses(s.agentId)).toEqual([]);
    console.log(`kill -9 of the fleet-agent: ${before.length} processes of the workload gone ${tookMs} ms later`);
  });

  it("a graceful stop: the workload takes SIGTERM (not the grace's SIGKILL), and nothing of it is left once stop returns", async () => {
    const d = driver();
    const s = { ...spec("stop"), image: "graceful" };
    const { vm } = await d.boot(s);
    const before = await workloadUp(s.agentId);
    const t0 = performance.now();
    await d.stop(vm);
    expect(performance.now() - t0).toBeLessThan(1500);
    expect(readFileSync(join(dirOf(s.agentId), "term"), "utf8")).toBe("term\n");
    expect(before.filter((p) => processAlive(p.pid))).toEqual([]);
  });

  it("a workload that ends by itself is a crash told with its exit code or signal, and its children and daemon end with it", async () => {
    const d = driver();
    for (const [how, want] of [
      ["3", { code: 3, signal: null }],
      ["kill", { code: null, signal: "SIGKILL" }],
    ] as const) {
      const s = { ...spec(`quit${how}`), image: "quitting" };
      const { vm } = await d.boot(s);
      const exits: VmExit[] = [];
      d.onExit(vm, (e) => exits.push(e));
      const before = await workloadUp(s.agentId);
      writeFileSync(join(dirOf(s.agentId), "quit"), how);
      await waitFor(() => exits.length > 0, 5000, "the exit told");
      expect(exits).toEqual([want]);
      // Seen after the namespace was emptied: the outer process ends only once its init (and everything) is gone.
      expect(before.filter((p) => processAlive(p.pid))).toEqual([]);
    }
  });

  it("a doze and a hibernation stop every process of the workload, its daemon too; resume and wake run them again", async () => {
    const d = driver();
    const s = spec("doze");
    const { vm } = await d.boot(s);
    const procs = await workloadUp(s.agentId);
    const states = () => procs.map((p) => stateOf(p.pid));
    const settled = async (want: (st: string | undefined) => boolean) => {
      await waitFor(() => states().every(want), 2000, "every process's state").catch(() => undefined);
      return states();
    };
    await d.pause(vm);
    expect(await settled((st) => st === "T")).toEqual(procs.map(() => "T"));
    await d.resume(vm);
    expect((await settled((st) => st !== "T")).filter((st) => st === "T")).toEqual([]);
    await d.hibernate(vm);
    expect(await settled((st) => st === "T")).toEqual(procs.map(() => "T"));
    const woke = await d.wake(s);
    expect(woke.mode).toBe("restore");
    expect((await settled((st) => st !== "T")).filter((st) => st === "T")).toEqual([]);
    await d.stop(woke.vm);
    expect(procs.filter((p) => processAlive(p.pid))).toEqual([]);
  });

  it("the CPU a daemon of the workload spends is metered", async () => {
    const d = driver();
    const s = { ...spec("busy"), image: "busy" };
    const { vm } = await d.boot(s);
    let loop: number | undefined;
    await waitFor(() => (loop = agentProcesses(s.agentId).find((p) => p.cmd === "sh -c while :; do :; done")?.pid) !== undefined, 5000, "the loop");
    const metered0 = await d.cpuSeconds(vm);
    const spent0 = readCpuSeconds(loop!)!;
    await new Promise((r) => setTimeout(r, 1000));
    const metered = (await d.cpuSeconds(vm)) - metered0;
    const spent = readCpuSeconds(loop!)! - spent0;
    expect(spent).toBeGreaterThan(0.05); // it ran, however loaded the machine
    expect(metered).toBeGreaterThanOrEqual(spent * 0.9);
    await d.stop(vm);
  });

  it("where no namespace can be made: said once, with why, at the start; workloads run as before", async () => {
    const lines: { level: string; msg: string; why?: string }[] = [];
    const logger = createLogger({ level: "info", write: (l) => lines.push(JSON.parse(l) as (typeof lines)[number]) });
    const d = driver({ logger, pidNamespaces: { error: "unshare(CLONE_NEWPID): Operation not permitted" } });
    expect(lines).toEqual([
      expect.objectContaining({
        level: "warn",
        msg: expect.stringMatching(/^workloads run without a PID namespace of their own/),
        why: "unshare(CLONE_NEWPID): Operation not permitted",
      }),
    ]);
    const s = spec("nons");
    const { vm } = await d.boot(s);
    await workloadUp(s.agentId);
    // Its pid is the workload's own (its server, exec'd by the shell), in the host's namespace.
    expect(readFileSync(`/proc/${vm.pid}/cmdline`, "utf8").split("\0")[0]).toBe(process.execPath);
    expect(readFileSync(`/proc/${vm.pid}/status`, "utf8")).toMatch(new RegExp(`^NSpid:\\s+${vm.pid}$`, "m"));
    await d.stop(vm);
    for (const p of agentProcesses(s.agentId)) killQuietly(p.pid); // what it forked outlives it here, as before
    expect(lines.filter((l) => /PID namespace/.test(l.msg))).toHaveLength(1);

    const on: typeof lines = [];
    const withNs = driver({ logger: createLogger({ level: "info", write: (l) => on.push(JSON.parse(l) as (typeof lines)[number]) }) });
    expect(on).toEqual([expect.objectContaining({ level: "info", msg: expect.stringMatching(/in a PID namespace of its own/) })]);
    const s2 = spec("ns");
    const { vm: inNs } = await withNs.boot(s2);
    const server = (await workloadUp(s2.agentId)).find((p) => p.cmd.startsWith(process.execPath))!;
    // The workload is pid 2 of its namespace (its init is 1), under the helper the driver knows.
    expect(readFileSync(`/proc/${server.pid}/status`, "utf8")).toMatch(new RegExp(`^NSpid:\\s+${server.pid}\\s+2$`, "m"));
    expect(readFileSync(`/proc/${inNs.pid}/cmdline`, "utf8")).toMatch(/pid-ns-[0-9a-f]+\0--parent\0/);
    await withNs.stop(inNs);
    expect(existsSync(`/proc/${server.pid}`) && processAlive(server.pid)).toBe(false);
  });
});

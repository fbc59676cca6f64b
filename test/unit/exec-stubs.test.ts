// Exec stubs (drivers/common/exec-stubs.ts, exec-stub.c): a waiting stub becomes the command it is handed, with that
// environment and directory, as our child with its stderr piped; a failed exec says why; the pool refills and closes;
// a helper's stubs pipe its stdout; with relays, the command runs in a network namespace of its own, its port reached through a 0600 unix socket only.
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, readlinkSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { request } from "node:http";
import { ExecStubs, execStubTool, privateNetwork, stubRequest } from "../../fleet-agent/drivers/common/exec-stubs.ts";
import { freeLoopbackPort } from "../../lib/node-net.ts";
import { processAlive } from "../../fleet-agent/drivers/common/proc.ts";
import { VmProcess } from "../../fleet-agent/drivers/common/vm-process.ts";
import { silentLogger } from "../../lib/log.ts";
import { waitFor } from "../helpers/wait.ts";

const dir = mkdtempSync(join(tmpdir(), "exec-stubs-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function stderrOf(child: NonNullable<ReturnType<ExecStubs["take"]>>): Promise<{ text: string; code: number | null }> {
  let text = "";
  child.stderr!.on("data", (c: Buffer) => (text += c.toString()));
  return new Promise((resolve) => child.once("close", (code) => resolve({ text, code })));
}

describe("exec stubs", () => {
  const stubs = new ExecStubs({ log: silentLogger, size: 1, refillDelayMs: 50 });
  afterAll(() => stubs.close());

  it("builds here (gcc is part of the set-up)", () => {
    expect(stubs.available).toBe(true);
  });

  it("becomes the command, with exactly the environment and directory given", async () => {
    stubs.fill();
    const child = stubs.take({
      command: "sh",
      args: ["-c", 'echo "foo=$FOO home=${HOME:-none}" >&2; pwd >&2; read x; echo "stdin=${x:-eof}" >&2; exit 3'],
      env: { FOO: "bar baz", PATH: process.env.PATH },
      cwd: dir,
    });
    expect(child).toBeDefined();
    const pid = child!.pid;
    const out = await stderrOf(child!);
    expect(out.code).toBe(3);
    expect(out.text).toContain("foo=bar baz home=none");
    expect(out.text).toContain(dir);
    expect(out.text).toContain("stdin=eof"); // /dev/null, not our pipe
    expect(child!.pid).toBe(pid);
  });

  it("keeps its pid: the stub's process is the command's (and the pool refills)", async () => {
    const stubPid = await waiting(stubs);
    const child = stubs.take({ command: "sleep", args: ["30"], env: { PATH: process.env.PATH } })!;
    expect(child.pid).toBe(stubPid);
    await waitFor(() => readFileSync(`/proc/${child.pid}/cmdline`, "utf8").startsWith("sleep"), 5000, "the exec");
    child.kill("SIGKILL");
    await new Promise((r) => child.once("exit", r));
  });

  it("says why an exec failed, and exits 127", async () => {
    await waiting(stubs);
    const child = stubs.take({ command: join(dir, "no-such-binary"), args: [], env: {} })!;
    const out = await stderrOf(child);
    expect(out.code).toBe(127);
    expect(out.text).toMatch(/^exec-stub: .*no-such-binary: No such file or directory/);
  });

  it("refuses a NUL byte rather than split an argument", () => {
    expect(() => stubRequest({ command: "x", args: ["a\0b"], env: {} })).toThrow(/NUL/);
  });

  it("is what VmProcess.spawn starts from when given (stderr relayed to the log, exit seen)", async () => {
    const log = join(dir, "vm.log");
    const stubPid = await waiting(stubs);
    const proc = VmProcess.spawn({
      vmId: "vm_stub",
      command: "sh",
      args: ["-c", "echo from-the-vm >&2; exit 7"],
      log,
      output: "stderr",
      relayStderr: true,
      stubs,
    });
    expect(proc.pid).toBe(stubPid);
    const exit = await proc.exited;
    expect(exit.code).toBe(7);
    expect(await proc.finalOutput()).toContain("from-the-vm");
    await waitFor(() => readFileSync(log, "utf8").includes("from-the-vm"), 2000, "the log line");
  });

  it("a process started when no stub waits dies with its parent too (setpriv's parent-death signal)", async () => {
    // A stand-in fleet-agent: VmProcess.spawn with a pool that has no stub free, of a `sleep`; then it is killed -9.
    const script = join(dir, "parent.ts");
    writeFileSync(
      script,
      `import { VmProcess } from ${JSON.stringify(join(import.meta.dirname, "../../fleet-agent/drivers/common/vm-process.ts"))};
const empty = { take: () => undefined };
const p = VmProcess.spawn({ vmId: "vm_orphan", command: "sleep", args: ["600"], log: ${JSON.stringify(join(dir, "orphan.log"))}, output: "stderr", relayStderr: true, stubs: empty });
console.log(p.pid);
setInterval(() => {}, 1000);
`,
    );
    const parent = spawn(process.execPath, [script], { stdio: ["ignore", "pipe", "inherit"] });
    const pid = Number(await new Promise<string>((resolve) => parent.stdout!.once("data", (c: Buffer) => resolve(c.toString().trim()))));
    expect(processAlive(pid)).toBe(true);
    parent.kill("SIGKILL");
    await waitFor(() => !processAlive(pid), 5000, "the orphaned process gone");
  });

  it("relays: the command runs in a network namespace of its own, its port reached only through a 0600 socket", async () => {
    // Root can make the namespace (the driver's default then); another user is told why not, and its VMs use TCP.
    const can = privateNetwork(execStubTool());
    expect(can.ok).toBe(process.getuid?.() === 0);
    if (!can.ok) return;
    const port = await freeLoopbackPort();
    const socket = join(dir, "web.sock");
    // A server on the namespace's loopback, at a port that is free in the host's namespace too.
    const server = `require("node:http").createServer((q, s) => s.end("inside " + q.url)).listen(${port}, "127.0.0.1", () => console.error("listening"))`;
    const child = stubs.start({ command: process.execPath, args: ["-e", server], env: { PATH: process.env.PATH }, relays: [{ socket, port }] })!;
    let said = "";
    child.stderr!.on("data", (c: Buffer) => (said += c.toString()));
    await waitFor(() => said.includes("listening"), 10_000, "the server in the namespace");
    const st = statSync(socket);
    expect([st.isSocket(), st.mode & 0o777, st.uid]).toEqual([true, 0o600, 0]);
    expect(await getVia({ socketPath: socket }, "/a")).toBe("inside /a");
    expect(await Promise.all(Array.from({ length: 20 }, (_, i) => getVia({ socketPath: socket }, `/${i}`)))).toEqual(
      Array.from({ length: 20 }, (_, i) => `inside /${i}`),
    );
    await expect(getVia({ host: "127.0.0.1", port }, "/a")).rejects.toThrow(/ECONNREFUSED/);
    // The relay (the command's child) goes with the command.
    const relay = Number(readFileSync(`/proc/${child.pid}/task/${child.pid}/children`, "utf8").trim().split(/\s+/)[0]);
    expect(processAlive(relay)).toBe(true);
    child.kill("SIGKILL");
    await waitFor(() => !isAlive(relay), 5000, "the relay's end");
  });

  it("a namespaced host's stubs make their namespace while they wait, and refuse a command without relays", async () => {
    const can = privateNetwork(execStubTool());
    expect(can.ok).toBe(process.getuid?.() === 0);
    if (!can.ok) return;
    const pool = new ExecStubs({ log: silentLogger, size: 1, netns: true });
    try {
      pool.fill();
      const stubPid = await waiting(pool);
      // Already in a namespace of its own before it was handed anything.
      await waitFor(() => readlinkSync(`/proc/${stubPid}/ns/net`) !== readlinkSync("/proc/self/ns/net"), 5000, "the stub's namespace");
      const socket = join(dir, "pre.sock");
      const child = pool.take({ command: "sleep", args: ["30"], env: { PATH: process.env.PATH }, relays: [{ socket, port: 21080 }] })!;
      expect(child.pid).toBe(stubPid);
      await waitFor(() => readFileSync(`/proc/${child.pid}/cmdline`, "utf8").startsWith("sleep"), 5000, "the exec");
      expect(statSync(socket).mode & 0o777).toBe(0o600);
      child.kill("SIGKILL");
      await waiting(pool);
      const bare = await stderrOf(pool.take({ command: "true", args: [], env: {} })!);
      expect(bare.code).toBe(127);
      expect(bare.text).toMatch(/no port to relay/);
    } finally {
      pool.close();
    }
  });

  it("a helper's stubs pipe the command's stdout to us (stdout: pipe)", async () => {
    const helpers = new ExecStubs({ log: silentLogger, size: 1, stdout: "pipe" });
    try {
      helpers.fill();
      const stubPid = await waiting(helpers);
      const child = helpers.take({ command: "sh", args: ["-c", "echo out; echo err >&2"], env: { PATH: process.env.PATH } })!;
      expect(child.pid).toBe(stubPid);
      let out = "";
      child.stdout!.on("data", (c: Buffer) => (out += c.toString()));
      const { text, code } = await stderrOf(child);
      expect({ out, text, code }).toEqual({ out: "out\n", text: "err\n", code: 0 });
    } finally {
      helpers.close();
    }
  });

  it("close ends the waiting stubs and takes no more", async () => {
    const pool = new ExecStubs({ log: silentLogger, size: 2 });
    pool.fill();
    const pids = (pool as unknown as { idle: { pid: number }[] }).idle.map((c) => c.pid);
    expect(pids).toHaveLength(2);
    pool.close();
    await waitFor(() => pids.every((pid) => !isAlive(pid)), 3000, "the stubs' end");
    expect(pool.take({ command: "true", args: [], env: {} })).toBeUndefined();
  });
});

/** A GET's body, through a unix socket or TCP. */
function getVia(to: { socketPath: string } | { host: string; port: number }, path: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = request({ ...to, path, agent: false, timeout: 5000 }, (res) => {
      let body = "";
      res.on("data", (c: Buffer) => (body += c.toString()));
      res.on("end", () => resolve(body));
    });
    req.on("error", reject);
    req.end();
  });
}

/** The pid of a stub waiting in the pool, once the refill has made one. */
async function waiting(pool: ExecStubs): Promise<number> {
  const idle = (pool as unknown as { idle: { pid: number }[] }).idle;
  await waitFor(() => idle.length > 0, 5000, "a refilled stub");
  return idle[0]!.pid;
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return !readFileSync(`/proc/${pid}/stat`, "utf8").includes(") Z ");
  } catch {
    return false;
  }
}

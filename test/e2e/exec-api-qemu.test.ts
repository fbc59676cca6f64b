// The exec, processes and files API through the whole system on the real qemu driver: a Python image that runs as a non-root user (built in the test), one all-in-one and one agent across the cases.
//
// Output, exit codes, a signal, a timeout, stdin; 50 MiB of output and a 200 MiB file both ways through the gateway
// with its RSS sampled (bounded memory); a background process that outlives its call and a hibernation; a tree as
// tar with its modes; escapes refused; an exec holding an agent awake past its idle timeout; the scope; the audit rows.
import { spawn, spawnSync } from "node:child_process";
import { chmodSync, cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { request } from "node:http";
import { requestOptions } from "../../lib/node-net.ts";
import { Readable } from "node:stream";
import { and, eq } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { auditLog } from "../../schema/core.ts";
import { encodeSpec } from "../../contracts/exec-wire.ts";
import { makeDriver } from "../helpers/qemu.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";

const qemuPresent = spawnSync("sh", ["-c", "command -v qemu-system-x86_64"]).status === 0;
if (!qemuPresent && process.env.CI === "true") throw new Error("CI: qemu-system-x86_64 missing (npm test provisions it: scripts/provision.ts)");

const MiB = 1024 * 1024;
let sys: TestSystem;
let scratch: string;
let agentId: string;

interface ExecResult {
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean;
  durationMs: number;
  stdout: string;
  stderr: string;
  truncated: boolean;
  error: string | null;
}

/** A line of /proc/self/status in KiB (VmRSS, VmHWM). */
function statusKiB(field: string): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(readFileSync("/proc/self/status", "utf8"));
  return m ? Number(m[1]) : 0;
}

/**
 * The gateway's peak RSS while `work` runs, above its RSS at the start (this process: the all-in-one runs here; the
 * clients are other processes or stream what they read): the kernel's high-water mark, reset first (clear_refs 5,
 * this process's own), so no peak between two samples is missed.
 */
async function peakRssGrowth<T>(work: () => Promise<T>): Promise<{ result: T; growthMiB: number }> {
  let precise = true;
  try {
    writeFileSync("/proc/self/clear_refs", "5");
  } catch {
    precise = false;
  }
  const base = statusKiB("VmRSS");
  let peak = base;
  const timer = setInterval(() => {
    peak = Math.max(peak, statusKiB("VmRSS"));
  }, 20);
  try {
    const result = await work();
    peak = Math.max(peak, statusKiB("VmRSS"), precise ? statusKiB("VmHWM") : 0);
    return { result, growthMiB: (peak - base) / 1024 };
  } finally {
    clearInterval(timer);
  }
}

async function exec(body: Record<string, unknown>, id = agentId): Promise<ExecResult> {
  const res = await sys.call(`/v1/agents/${id}/exec`, { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" } });
  const json = (await res.json()) as ExecResult;
  expect(res.status, JSON.stringify(json)).toBe(200);
  return json;
}

async function post(path: string, body: unknown): Promise<Response> {
  return sys.call(path, { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" } });
}

beforeAll(async () => {
  if (!qemuPresent) return;
  // Builds on the host: this file tests what runs the image, not where it is built (image-build-vm.test.ts builds in
  // the builder VM, the default, which under TCG costs a minute more per base).
  sys = await startSystem({ driver: await makeDriver(), env: { AGENT_IDLE_TIMEOUT_MS: "600000", IMAGE_BUILDS: "host" } });
  scratch = mkdtempSync(join(tmpdir(), "exec-api-e2e-"));
}, 120_000);

afterAll(async () => {
  await sys?.stop();
  if (sys) rmSync(sys.dataDir, { recursive: true, force: true });
  if (scratch) rmSync(scratch, { recursive: true, force: true });
}, 120_000);

const title = qemuPresent ? "exec and files on QEMU" : "exec and files on QEMU — skipped: qemu-system-x86_64 is not installed (npm run setup:vm)";
describe.skipIf(!qemuPresent)(title, () => {
  it("builds a Python image that runs as a non-root user and starts an agent of it", async () => {
    const ctx = join(scratch, "ctx");
    mkdirSync(ctx);
    cpSync(join(import.meta.dirname, "..", "..", "examples", "python-agent", "server.py"), join(ctx, "server.py"));
    writeFileSync(
      join(ctx, "Containerfile"),
      [
        "FROM agentvm/python:bookworm",
        "RUN useradd -m -u 1000 -s /bin/sh app && mkdir -p /workspace && chown app:app /workspace",
        "COPY server.py /app/server.py",
        "USER app",
        "WORKDIR /home/app",
        "ENV WORKSPACE_DIR=/workspace",
        "EXPOSE 8080",
        "LABEL agentvm.ready-path=/",
        'CMD ["python3", "-u", "/app/server.py"]',
        "",
      ].join("\n"),
    );
    const tar = spawn("tar", ["-c", "-C", ctx, "."], { stdio: ["ignore", "pipe", "inherit"] });
    const res = await sys.call("/v1/images?name=exec-python", {
      method: "POST",
      body: Readable.toWeb(tar.stdout) as ReadableStream<Uint8Array>,
      duplex: "half",
    } as RequestInit);
    expect(res.status, await res.clone().text()).toBe(201);
    const agent = await sys.createAgent({ image: "exec-python", diskMiB: 512, memMiB: 384 });
    agentId = agent.id;
    const first = await sys.call(`/v1/agents/${agentId}/exec`, { method: "POST", body: JSON.stringify({ cmd: ["id"] }) });
    expect(first.status, await first.clone().text()).toBe(200);
    expect(first.headers.get("x-wake")).toBe("boot");
    const id = (await first.json()) as ExecResult;
    expect(id.stdout).toMatch(/^uid=1000\(app\) gid=1000\(app\)/);
  }, 900_000);

  it("output, exit codes, env, cwd, user, a shell string, a program that is missing", async () => {
    const py = await exec({
      cmd: ["python3", "-c", "import os,sys; print(os.getcwd(), os.environ['GREETING']); print('oops', file=sys.stderr); sys.exit(3)"],
      env: { GREETING: "hi" },
    });
    expect(py).toMatchObject({ exitCode: 3, signal: null, timedOut: false, stdout: "/home/app hi\n", stderr: "oops\n", truncated: false });
    expect((await exec({ cmd: "echo $(id -un) in $PWD", cwd: "/tmp" })).stdout).toBe("app in /tmp\n");
    expect((await exec({ cmd: ["id", "-u"], user: "root" })).stdout).toBe("0\n");
    const missing = await exec({ cmd: ["no-such-program"] });
    expect(missing.exitCode).toBe(127);
    expect(missing.error).toMatch(/no-such-program/);
  }, 120_000);

  it("a signal, a timeout, stdin", async () => {
    const killed = await exec({ cmd: ["python3", "-c", "import os,signal; os.kill(os.getpid(), signal.SIGTERM)"] });
    expect(killed).toMatchObject({ exitCode: null, signal: "TERM", timedOut: false });
    const started = Date.now();
    const slow = await exec({ cmd: ["sleep", "60"], timeoutMs: 1500 });
    expect(slow).toMatchObject({ exitCode: null, signal: "KILL", timedOut: true });
    expect(Date.now() - started).toBeLessThan(30_000);
    const upper = await exec({ cmd: ["python3", "-c", "import sys; sys.stdout.write(sys.stdin.read().upper())"], stdin: "hello from stdin" });
    expect(upper.stdout).toBe("HELLO FROM STDIN");
    const bytes = await exec({ cmd: ["od", "-An", "-tx1"], stdin: Buffer.from([0, 255, 16]).toString("base64"), stdinEncoding: "base64" });
    expect(bytes.stdout.trim()).toBe("00 ff 10");
  }, 120_000);

  it("50 MiB of output streams through the gateway as NDJSON with bounded memory; the JSON answer caps at 1 MiB", async () => {
    const size = 50 * MiB;
    // The client is curl with a line counter after it, other processes: the RSS sampled is the all-in-one's alone.
    const execBody = JSON.stringify({
      cmd: ["python3", "-c", `import sys\nb=b'x'*65536\nfor _ in range(${size / 65536}): sys.stdout.buffer.write(b)`],
      timeoutMs: 300_000,
    });
    const counter =
      "import json,sys\nn=0\nlast=''\nfor line in sys.stdin:\n  o=json.loads(line)\n  n+=len(o.get('stdout',''))\n  last=line.strip()\nprint(json.dumps({'bytes':n,'last':last}))";
    const { result, growthMiB } = await peakRssGrowth(
      () =>
        new Promise<{ bytes: number; last: string }>((resolve, reject) => {
          const child = spawn(
            "sh",
            [
              "-c",
              `curl -sS -f -N -H 'authorization: Bearer ${sys.demo.token}' -H 'accept: application/x-ndjson' -H 'content-type: application/json' --data-binary @- '${sys.url}/v1/agents/${agentId}/exec' | python3 -c "$COUNTER"`,
            ],
            { stdio: ["pipe", "pipe", "inherit"], env: { ...process.env, COUNTER: counter } },
          );
          let out = "";
          child.stdout.on("data", (d: Buffer) => (out += d.toString()));
          child.on("exit", (code) =>
            code === 0 ? resolve(JSON.parse(out) as { bytes: number; last: string }) : reject(new Error(`curl | count: exit ${code}`)),
          );
          child.stdin.end(execBody);
        }),
    );
    expect(result.bytes).toBe(size);
    expect(JSON.parse(result.last)).toMatchObject({ exit: { exitCode: 0, signal: null } });
    console.log(`50 MiB exec output through the gateway: RSS peak +${growthMiB.toFixed(1)} MiB`);
    expect(growthMiB).toBeLessThan(64);
    const capped = await exec({ cmd: ["head", "-c", String(3 * MiB), "/dev/zero"] });
    expect(capped.stdout.length).toBe(MiB);
    expect(capped.truncated).toBe(true);
    expect(capped.exitCode).toBe(0);
  }, 600_000);

  it("a background process outlives its call and is still there after hibernate and wake", async () => {
    const started = await post(`/v1/agents/${agentId}/exec`, {
      cmd: ["python3", "-u", "-c", "import sys,time\nfor line in sys.stdin: print('got', line.strip(), flush=True)\ntime.sleep(3600)"],
      background: true,
    });
    expect(started.status, await started.clone().text()).toBe(201);
    const proc = (await started.json()) as { pid: number; state: string };
    expect(proc.state).toBe("running");
    const base = `/v1/agents/${agentId}/processes/${proc.pid}`;
    expect((await post(`${base}/stdin`, { data: "one\n" })).status).toBe(204);
    const hib = await post(`/v1/agents/${agentId}/hibernate`, {});
    expect(((await hib.json()) as { state: string }).state).toBe("hibernated");
    // The next call wakes it: the process is there, with what it read before.
    const wakesBefore = await sys.wakes(agentId);
    const after = await sys.call(base);
    expect(after.status).toBe(200);
    expect(await after.json()).toMatchObject({ pid: proc.pid, state: "running" });
    expect(await sys.wakes(agentId)).toBe(wakesBefore + 1);
    expect((await post(`${base}/stdin`, { data: "two\n" })).status).toBe(204);
    let out = "";
    for (let i = 0; i < 50 && !out.includes("got two"); i++) {
      const o = (await (await sys.call(`${base}/output?stream=stdout`)).json()) as { data: string };
      out = o.data;
      if (!out.includes("got two")) await new Promise((r) => setTimeout(r, 200));
    }
    expect(out).toBe("got one\ngot two\n");
    const list = (await (await sys.call(`/v1/agents/${agentId}/processes`)).json()) as { processes: { pid: number }[] };
    expect(list.processes.map((p) => p.pid)).toContain(proc.pid);
    expect((await post(`${base}/signal`, { signal: "TERM" })).status).toBe(204);
    const waited = (await (await post(`${base}/wait`, { timeoutMs: 10_000 })).json()) as { state: string; signal: string | null };
    expect(waited).toMatchObject({ state: "exited", signal: "TERM" });
  }, 300_000);

  it("a 200 MiB file both ways through the gateway with bounded memory, its mode kept", async () => {
    // The client is curl, another process: the RSS sampled is the all-in-one's alone (gateway, host, QEMU's sockets).
    const size = 200 * MiB;
    const file = join(scratch, "big.bin");
    expect(spawnSync("sh", ["-c", `head -c ${size} /dev/urandom > ${file}`]).status).toBe(0);
    const sent = spawnSync("sha256sum", [file]).stdout.toString().split(" ")[0];
    const curl = (args: string[]) =>
      new Promise<string>((resolve, reject) => {
        const child = spawn("sh", ["-c", args.join(" ")], { stdio: ["ignore", "pipe", "inherit"] });
        let out = "";
        child.stdout.on("data", (d: Buffer) => (out += d.toString()));
        child.on("exit", (code) => (code === 0 ? resolve(out) : reject(new Error(`${args.join(" ")}: exit ${code}`))));
      });
    const auth = `-H 'authorization: Bearer ${sys.demo.token}'`;
    const url = `${sys.url}/v1/agents/${agentId}/files?path=/home/app/big.bin`;
    const up = await peakRssGrowth(() => curl(["curl", "-sS", "-f", auth, "-T", file, `'${url}&mode=0600'`]));
    expect(JSON.parse(up.result)).toMatchObject({ size, mode: "0600", uid: 1000 });
    const headers = join(scratch, "headers.txt");
    const down = await peakRssGrowth(() => curl(["curl", "-sS", "-f", auth, "-D", headers, `'${url}'`, "|", "sha256sum"]));
    expect(down.result.split(" ")[0]).toBe(sent);
    const head = spawnSync("cat", [headers]).stdout.toString().toLowerCase();
    expect(head).toContain("x-file-mode: 0600");
    expect(head).toContain(`content-length: ${size}`);
    console.log(`200 MiB file through the gateway: RSS peak +${up.growthMiB.toFixed(1)} MiB up, +${down.growthMiB.toFixed(1)} MiB down`);
    expect(up.growthMiB).toBeLessThan(64);
    expect(down.growthMiB).toBeLessThan(64);
    rmSync(file);
    const rm = await sys.call(`/v1/agents/${agentId}/files?path=/home/app/big.bin`, { method: "DELETE" });
    expect(rm.status).toBe(204);
  }, 600_000);

  it("a tree as tar both ways, modes kept; a directory listing; mkdirs", async () => {
    const tree = join(scratch, "tree");
    mkdirSync(join(tree, "sub"), { recursive: true });
    writeFileSync(join(tree, "run.sh"), "#!/bin/sh\necho ran\n");
    chmodSync(join(tree, "run.sh"), 0o750);
    writeFileSync(join(tree, "sub", "secret.txt"), "s3cret");
    chmodSync(join(tree, "sub", "secret.txt"), 0o600);
    const tarred = spawnSync("tar", ["-c", "--owner=1000", "--group=1000", "-C", tree, "."]).stdout;
    const put = await sys.call(`/v1/agents/${agentId}/files?path=/home/app/tree`, {
      method: "PUT",
      body: tarred,
      headers: { "content-type": "application/x-tar" },
    });
    expect(put.status, await put.clone().text()).toBe(201);
    expect(((await put.json()) as { entries: number }).entries).toBeGreaterThanOrEqual(3);
    expect((await exec({ cmd: "stat -c '%a %U %n' run.sh sub/secret.txt && ./run.sh", cwd: "/home/app/tree" })).stdout).toBe(
      "750 app run.sh\n600 app sub/secret.txt\nran\n",
    );
    const listing = (await (await sys.call(`/v1/agents/${agentId}/files?path=/home/app/tree`)).json()) as {
      entries: { name: string; type: string; mode: string }[];
    };
    expect(listing.entries.find((e) => e.name === "run.sh")).toMatchObject({ type: "file", mode: "0750" });
    expect(listing.entries.find((e) => e.name === "sub")).toMatchObject({ type: "dir" });
    const out = await sys.call(`/v1/agents/${agentId}/files?path=/home/app/tree`, { headers: { accept: "application/x-tar" } });
    expect(out.status).toBe(200);
    const listed = spawnSync("tar", ["-tv"], { input: Buffer.from(await out.arrayBuffer()) }).stdout.toString();
    expect(listed).toMatch(/-rwxr-x--- .*run\.sh/);
    expect(listed).toMatch(/-rw------- .*secret\.txt/);
    const made = await sys.call(`/v1/agents/${agentId}/files?path=/home/app/a/b/c.txt&mkdirs=true`, { method: "PUT", body: "deep" });
    expect(made.status).toBe(201);
    expect(await (await sys.call(`/v1/agents/${agentId}/files?path=/home/app/a/b/c.txt`)).text()).toBe("deep");
  }, 300_000);

  it("escapes are refused: .., a tar entry leaving its directory, an absolute symlink stays inside the root, the guest's own paths", async () => {
    const dotdot = await sys.call(`/v1/agents/${agentId}/files?path=/home/app/../../etc/passwd`);
    expect(dotdot.status).toBe(400);
    expect(((await dotdot.json()) as { error: { code: string } }).error.code).toBe("bad_request");
    // A tar whose second entry climbs out: refused, and nothing after it written.
    const evil = join(scratch, "evil");
    mkdirSync(join(evil, "in"), { recursive: true });
    writeFileSync(join(evil, "in", "ok.txt"), "ok");
    writeFileSync(join(evil, "after.txt"), "after");
    const tarred = spawnSync("tar", ["-c", "-P", "-C", evil, "in", "--transform=s,^in/ok.txt,../escaped.txt,", "after.txt"]).stdout;
    const refused = await sys.call(`/v1/agents/${agentId}/files?path=/home/app/evil`, {
      method: "PUT",
      body: tarred,
      headers: { "content-type": "application/x-tar" },
    });
    expect(refused.status).toBe(400);
    expect((await exec({ cmd: "ls /home/app/escaped.txt /home/app/evil/after.txt 2>&1; true" })).stdout).toMatch(/No such file[\s\S]*No such file/);
    // An absolute symlink resolves inside the agent's root, never the guest's own: the guest agent's paths are refused.
    await exec({ cmd: "ln -sfn / /home/app/rootlink" });
    const viaLink = (await (await sys.call(`/v1/agents/${agentId}/files?path=/home/app/rootlink/home/app/tree/sub`)).json()) as { entries: { name: string }[] };
    expect(viaLink.entries.map((e) => e.name)).toEqual(["secret.txt"]);
    for (const path of ["/proc/1/environ", "/run/agentvm/x", "/sys/kernel/x", "/dev/null"]) {
      const res = await sys.call(`/v1/agents/${agentId}/files?path=${path}`, { method: "PUT", body: "x" });
      expect(res.status, path).toBe(403);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe("forbidden_path");
    }
    // A symlink swapped in under a path during writes to it: each write lands inside the root or is refused.
    const swapper = await post(`/v1/agents/${agentId}/exec`, {
      cmd: "while true; do rm -rf /home/app/swap; mkdir -p /home/app/swap; rm -rf /home/app/swap; ln -s /proc/self /home/app/swap; done",
      background: true,
    });
    const swapPid = ((await swapper.json()) as { pid: number }).pid;
    const statuses = new Set<number>();
    for (let i = 0; i < 20; i++) {
      const res = await sys.call(`/v1/agents/${agentId}/files?path=/home/app/swap/f${i}`, { method: "PUT", body: "x" });
      statuses.add(res.status);
      await res.arrayBuffer();
    }
    await post(`/v1/agents/${agentId}/processes/${swapPid}/signal`, { signal: "KILL" });
    // 400: the directory was swapped away between resolving the path and writing beside it ("cannot write beside …"): refused too.
    for (const s of statuses) expect([201, 400, 403, 404]).toContain(s);
  }, 300_000);

  it("a call without agents:exec is 403; every exec, write and delete is in the audit log with its request id", async () => {
    const adminOnly = await sys.token({ scopes: ["agents:invoke", "agents:admin", "usage:read"] });
    const res = await sys.call(`/v1/agents/${agentId}/exec`, { method: "POST", body: JSON.stringify({ cmd: ["id"] }), token: adminOnly });
    expect(res.status).toBe(403);
    expect(((await res.json()) as { error: { message: string } }).error.message).toContain("agents:exec");
    await (await sys.call(`/v1/agents/${agentId}/files?path=/home/app/gone.txt`, { method: "PUT", body: "x" })).arrayBuffer();
    expect((await sys.call(`/v1/agents/${agentId}/files?path=/home/app/gone.txt`, { method: "DELETE" })).status).toBe(204);
    const ran = await sys.call(`/v1/agents/${agentId}/exec`, { method: "POST", body: JSON.stringify({ cmd: ["sh", "-c", "exit 5"], cwd: "/tmp" }) });
    const requestId = ran.headers.get("x-request-id")!;
    await ran.arrayBuffer();
    const rows = await sys.database.db
      .select()
      .from(auditLog)
      .where(and(eq(auditLog.target, agentId)));
    const row = rows.find((r) => r.requestId === requestId);
    expect(row).toMatchObject({ action: "agent.exec", actor: "demo" });
    expect(row!.detail).toMatchObject({ argv: ["sh", "-c", "exit 5"], cwd: "/tmp", exitCode: 5 });
    const actions = new Set(rows.map((r) => r.action));
    for (const a of ["agent.exec", "agent.files.write", "agent.files.untar", "agent.files.delete", "agent.process.stdin", "agent.process.signal"])
      expect(actions, a).toContain(a);
  }, 60_000);

  it("exec round trip on the warm agent through the gateway (~50 runs), against the same command straight to the VM's exec server", async () => {
    await exec({ cmd: ["true"] });
    // Straight to the VM's exec server is the host's side of the hop: the difference is what the gateway adds. The two
    // alternate, so a busy moment of the machine falls on both.
    const target = await sys.host.execTarget(agentId);
    const body = encodeSpec({ argv: ["true"] });
    const direct = () =>
      new Promise<void>((resolve, reject) => {
        const req = request(
          {
            ...requestOptions(target),
            method: "POST",
            path: "/v1/exec",
            headers: { "x-agentvm-exec-key": target.key, "content-length": body.byteLength },
            agent: false,
          },
          (res) => {
            res.resume();
            res.on("end", resolve);
          },
        );
        req.on("error", reject);
        req.end(body);
      });
    const gateway: number[] = [];
    const straight: number[] = [];
    for (let i = 0; i < 50; i++) {
      let t0 = performance.now();
      const r = await exec({ cmd: ["true"] });
      gateway.push(performance.now() - t0);
      expect(r.exitCode).toBe(0);
      t0 = performance.now();
      await direct();
      straight.push(performance.now() - t0);
    }
    const pct = (xs: number[], q: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(q * xs.length))]!.toFixed(1);
    console.log(
      `exec round trip, warm agent: through the gateway p50 ${pct(gateway, 0.5)} ms, p99 ${pct(gateway, 0.99)} ms; straight to the VM's exec server p50 ${pct(straight, 0.5)} ms, p99 ${pct(straight, 0.99)} ms (n=50 each, alternating)`,
    );
  }, 300_000);

  it("an exec holds an agent awake past its idle timeout", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 2000 });
    await exec({ cmd: ["true"] }, agent.id);
    const r = await exec({ cmd: ["sleep", "6"], timeoutMs: 30_000 }, agent.id);
    expect(r.exitCode).toBe(0);
    const res = await sys.call(`/v1/agents/${agent.id}/exec`, { method: "POST", body: JSON.stringify({ cmd: ["true"] }) });
    await res.arrayBuffer();
    expect(res.headers.get("x-wake")).toBe("warm");
    expect(await sys.wakes(agent.id)).toBe(1); // the boot only: it never slept under the command
  }, 300_000);
});

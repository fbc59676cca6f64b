// The SDKs and the command line's exec and cp against the whole system (gateway + host + Postgres over real sockets) on
// real QEMU VMs under TCG: the TypeScript SDK in-process, the Python SDK's live unittest and `agentvm` as child processes,
// each driving the API's flows: an agent of the demo image, exec (result, stream, stdin, exit codes), files both ways
// and as tar, hibernate then an exec that wakes it, a checkpoint, a fork reset to it, a pool's acquire and release.
import { execFile, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { QemuDriver } from "../../fleet-agent/drivers/qemu/driver.ts";
import { type Agent, AgentVM, AgentVMError, type ExecEvent } from "../../sdk/typescript/src/index.ts";
import { makeDriver } from "../helpers/qemu.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";

let sys: TestSystem;
let driver: QemuDriver;
let client: AgentVM;
const root = mkdtempSync(join(tmpdir(), "sdk-e2e-"));
const bin = fileURLToPath(new URL("../../bin/agentvm.js", import.meta.url));
const pythonDir = fileURLToPath(new URL("../../sdk/python/", import.meta.url));

beforeAll(async () => {
  driver = await makeDriver({ memory: "file", templates: { root: join(root, "templates") } });
  sys = await startSystem({ driver });
  client = new AgentVM({ baseUrl: sys.url, token: sys.demo.token });
}, 120_000);

afterAll(async () => {
  await driver?.templates?.settle();
  await sys?.stop();
  rmSync(root, { recursive: true, force: true });
}, 60_000);

describe("the TypeScript SDK against the system", () => {
  let agent: Agent;

  it("creates an agent of the demo image and runs commands in it: a result, a stream, stdin, exit codes, a timeout", async () => {
    agent = await client.agents.create({ name: "ts-sdk", idleTimeoutMs: 600_000 });
    expect(agent.info?.state).toBeDefined();
    const hello = await agent.exec(["echo", "hello from ts"]);
    expect(hello).toMatchObject({ exitCode: 0, stdout: "hello from ts\n", stderr: "", ok: true, timedOut: false, truncated: false });
    expect(await agent.exec("echo out; echo err >&2; exit 3")).toMatchObject({ exitCode: 3, stdout: "out\n", stderr: "err\n", ok: false });
    expect((await agent.exec(["cat"], { stdin: new Uint8Array([104, 105, 0, 255]), encoding: "base64" })).stdout).toBe(
      Buffer.from([104, 105, 0, 255]).toString("base64"),
    );
    expect((await agent.exec("pwd; echo $GREETING", { cwd: "/tmp", env: { GREETING: "hi" } })).stdout).toBe("/tmp\nhi\n");
    expect(await agent.exec(["sleep", "30"], { timeoutMs: 500 })).toMatchObject({ exitCode: null, signal: "KILL", timedOut: true });
    expect(await agent.exec(["no-such-program"])).toMatchObject({ exitCode: 127 });

    const events: ExecEvent[] = [];
    for await (const e of agent.execStream("echo one; echo two >&2; echo three; exit 5")) events.push(e);
    const joined = (k: "stdout" | "stderr") => events.map((e) => (k in e ? (e as Record<string, string>)[k] : "")).join("");
    expect(joined("stdout")).toBe("one\nthree\n");
    expect(joined("stderr")).toBe("two\n");
    expect(events.at(-1)).toMatchObject({ exit: { exitCode: 5, signal: null, timedOut: false } });
  }, 300_000);

  it("runs a background process: output later, stdin, wait, a signal", async () => {
    const proc = await agent.spawn("echo started; read line; echo got $line; sleep 600", { stdin: true });
    expect(proc.info.state).toBe("running");
    await proc.write("hello\n");
    let out = "";
    for (let i = 0; i < 100 && !out.includes("got hello"); i++) {
      out = await proc.text();
      if (!out.includes("got hello")) await new Promise((r) => setTimeout(r, 100));
    }
    expect(out).toBe("started\ngot hello\n");
    expect((await agent.processes()).map((p) => p.pid)).toContain(proc.pid);
    expect((await proc.wait({ timeoutMs: 100 })).state).toBe("running");
    await proc.kill("TERM");
    expect(await proc.wait({ timeoutMs: 10_000 })).toMatchObject({ state: "exited", signal: "TERM" });
  }, 120_000);

  it("moves files both ways (mode kept, parents made), lists and removes them, and a tree as tar", async () => {
    const data = new Uint8Array(3 * 1024 * 1024).map((_, i) => (i * 7) % 256);
    const stream = new ReadableStream<Uint8Array>({
      start(c) {
        for (let i = 0; i < data.length; i += 65536) c.enqueue(data.subarray(i, i + 65536));
        c.close();
      },
    });
    expect(await agent.files.write("/tmp/ts-sdk/deep/blob.bin", stream, { mode: 0o640, mkdirs: true })).toMatchObject({ size: data.length });
    expect(Buffer.from(await agent.files.read("/tmp/ts-sdk/deep/blob.bin")).equals(Buffer.from(data))).toBe(true);
    expect((await agent.exec("stat -c %a /tmp/ts-sdk/deep/blob.bin")).stdout).toBe("640\n");
    const listing = await agent.files.list("/tmp/ts-sdk/deep");
    expect(listing.entries).toContainEqual(expect.objectContaining({ name: "blob.bin", type: "file", size: data.length }));
    await agent.files.write("/tmp/ts-sdk/t.txt", "text ✓");
    expect(await agent.files.readText("/tmp/ts-sdk/t.txt")).toBe("text ✓");

    const tarFile = join(root, "up.tar");
    const src = join(root, "up");
    mkdirSync(join(src, "sub"), { recursive: true });
    writeFileSync(join(src, "a.txt"), "A");
    writeFileSync(join(src, "sub", "b.txt"), "BB");
    await new Promise<void>((resolve, reject) => execFile("tar", ["-C", src, "-cf", tarFile, "."], (e) => (e ? reject(e) : resolve())));
    expect((await agent.files.uploadTar("/tmp/ts-sdk/tree", readFileSync(tarFile))).entries).toBeGreaterThanOrEqual(3);
    expect((await agent.exec("cat /tmp/ts-sdk/tree/a.txt /tmp/ts-sdk/tree/sub/b.txt")).stdout).toBe("ABB");
    const down = Buffer.from(await new Response(await agent.files.downloadTar("/tmp/ts-sdk/tree")).arrayBuffer());
    const listed = await new Promise<string>((resolve, reject) => {
      const t = spawn("tar", ["-tf", "-"]);
      let o = "";
      t.stdout.on("data", (d: Buffer) => (o += d.toString()));
      t.on("close", (code) => (code === 0 ? resolve(o) : reject(new Error(`tar -t: ${code}`))));
      t.stdin.end(down);
    });
    expect(listed).toMatch(/sub\/b\.txt/);

    await agent.files.remove("/tmp/ts-sdk", { recursive: true });
    const gone = await agent.files.read("/tmp/ts-sdk/t.txt").catch((e: unknown) => e);
    expect(gone).toBeInstanceOf(AgentVMError);
    expect(gone).toMatchObject({ code: "not_found", status: 404 });
    const bad = await agent.files.read("/tmp/../etc/passwd").catch((e: unknown) => e);
    expect(bad).toMatchObject({ code: "bad_request", status: 400, requestId: expect.stringMatching(/^req_/) });
  }, 120_000);

  it("hibernates, and the next exec wakes it with its files in place; agent.fetch calls its URL", async () => {
    await agent.exec("echo kept > /tmp/ts-kept");
    expect(await agent.hibernate()).toMatchObject({ state: "hibernated" });
    expect((await agent.exec("cat /tmp/ts-kept")).stdout).toBe("kept\n");
    expect((await agent.refresh()).state).toBe("running");
    const r = await agent.fetch("/counter", { method: "POST" });
    expect(r.status).toBe(200);
    expect(await r.json()).toMatchObject({ count: expect.any(Number) });
  }, 120_000);

  it("checkpoints, forks, resets the fork to the checkpoint; a pool hands out distinct agents, reset on release", async () => {
    await agent.exec("echo clean > /tmp/ts-state");
    const ckp = await agent.checkpoint("ts-clean");
    expect(ckp.id).toMatch(/^ckp_/);
    const fork = await client.agents.create({ fromCheckpoint: ckp.id, idleTimeoutMs: 600_000 });
    expect((await fork.exec("cat /tmp/ts-state")).stdout).toBe("clean\n");
    await fork.exec("echo dirty > /tmp/ts-state; touch /tmp/ts-episode");
    const reset = await fork.reset();
    expect(reset).toMatchObject({ checkpointId: ckp.id, resetMs: expect.any(Number) });
    expect((await fork.exec("cat /tmp/ts-state; ls /tmp/ts-episode 2>/dev/null || echo gone")).stdout).toBe("clean\ngone\n");
    await fork.delete();

    const pool = await client.pools.create({ name: "ts-pool", fromCheckpoint: ckp.id, size: 1, maxSize: 2 });
    const first = await pool.acquire();
    expect(first.poolId).toBe(pool.id);
    await first.exec("touch /tmp/ts-episode");
    const second = await pool.acquire({ waitMs: 60_000 }); // the top-up may be forking the second one
    expect(second.id).not.toBe(first.id);
    const third = await pool.acquire().catch((e: unknown) => e);
    expect(third).toMatchObject({ code: "pool_exhausted", status: 409 });
    expect((await first.release()).resetMs).toBeGreaterThanOrEqual(0);
    await pool.release(second);
    const again = await pool.acquire({ waitMs: 60_000 });
    expect((await again.exec("ls /tmp/ts-episode 2>/dev/null || echo gone")).stdout).toBe("gone\n");
    await pool.release(again);
    expect((await pool.delete()).deleted).toBe(true);
  }, 300_000);
});

describe("the Python SDK against the system", () => {
  it("passes its live unittest (python3 -m unittest tests.test_live)", async () => {
    const r = await new Promise<{ code: number; out: string }>((resolve) =>
      execFile(
        "python3",
        ["-m", "unittest", "-v", "tests.test_live"],
        {
          cwd: pythonDir,
          timeout: 600_000,
          env: {
            PATH: process.env.PATH ?? "/usr/bin:/bin",
            PYTHONDONTWRITEBYTECODE: "1",
            AGENTVM_SDK_LIVE: "1",
            AGENTVM_URL: sys.url,
            AGENTVM_TOKEN: sys.demo.token,
          },
        },
        (err, stdout, stderr) => resolve({ code: err ? Number(err.code ?? 1) : 0, out: stdout + stderr }),
      ),
    );
    expect(r.code, r.out).toBe(0);
    expect(r.out).toMatch(/Ran 6 tests/);
    expect(r.out).not.toMatch(/skipped/);
  }, 600_000);
});

describe("agentvm exec and cp against the system", () => {
  let id: string;
  let home: string;

  interface Run {
    code: number;
    out: Buffer;
    err: string;
  }

  /** `node bin/agentvm.js …` with the system's URL and token; `input` its stdin (else none: /dev/null). */
  function agentvm(args: string[], input?: string | Buffer): Promise<Run> {
    const env = { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: home, AGENTVM_URL: sys.url, AGENTVM_TOKEN: sys.demo.token };
    return new Promise((resolve) => {
      const child = spawn(process.execPath, [bin, ...args], { env, stdio: ["pipe", "pipe", "pipe"] });
      const out: Buffer[] = [];
      let err = "";
      child.stdout.on("data", (d: Buffer) => out.push(d));
      child.stderr.on("data", (d: Buffer) => (err += d.toString()));
      child.on("close", (code) => resolve({ code: code ?? -1, out: Buffer.concat(out), err }));
      child.stdin.end(input ?? "");
    });
  }

  beforeAll(async () => {
    home = mkdtempSync(join(root, "home-"));
    id = (await sys.createAgent({ name: "cli-exec", idleTimeoutMs: 600_000 })).id;
  });

  it("exec streams the command's output to ours and exits with its status; stdin forwarded; 128+N for a signal", async () => {
    const r = await agentvm(["exec", id, "--", "sh", "-c", "echo to-out; echo to-err >&2; exit 7"]);
    expect(r.out.toString()).toBe("to-out\n");
    expect(r.err).toBe("to-err\n");
    expect(r.code).toBe(7);
    const cat = await agentvm(["exec", id, "--", "wc", "-c"], Buffer.alloc(100_000, 1));
    expect(cat.code, cat.err).toBe(0);
    expect(cat.out.toString().trim()).toBe("100000");
    const big = Buffer.alloc(3 * 1024 * 1024, 2); // beyond what goes inline: a file in the agent, read through /bin/sh
    const md5 = await agentvm(["exec", id, "--", "md5sum"], big);
    expect(md5.code, md5.err).toBe(0);
    expect(md5.out.toString().split(" ")[0]).toBe(createHash("md5").update(big).digest("hex"));
    expect((await agentvm(["exec", id, "--shell", "--", "wc -c | tr -d ' '"], big)).out.toString()).toBe(`${big.length}\n`);
    expect((await agentvm(["exec", id, "--shell", "--", "ls /tmp/.agentvm-stdin-* 2>/dev/null | wc -l"])).out.toString().trim()).toBe("0");
    const env = await agentvm(["exec", id, "--cwd", "/tmp", "-e", "A=1", "-e", "B=two", "--shell", "--", "pwd; echo $A$B"]);
    expect(env.out.toString()).toBe("/tmp\n1two\n");
    expect((await agentvm(["exec", id, "--", "sh", "-c", "kill -TERM $$"])).code).toBe(128 + 15);
    const slow = await agentvm(["exec", id, "--timeout", "1s", "--", "sleep", "30"]);
    expect(slow.code).toBe(124);
    expect(slow.err).toMatch(/timed out/);
    const missing = await agentvm(["exec", id, "--", "no-such-program"]);
    expect(missing.code).toBe(127);
    const unknown = await agentvm(["exec", "agt_nope", "--", "true"]);
    expect(unknown.code).toBe(1);
    expect(unknown.err).toMatch(/^error not_found: .* \(request req_\w+\)\n$/);
  }, 180_000);

  it("cp copies a file both ways (mode kept), a directory both ways as tar, and - as stdin and stdout", async () => {
    const local = mkdtempSync(join(root, "cp-"));
    writeFileSync(join(local, "f.bin"), Buffer.alloc(200_000, 7), { mode: 0o750 });
    let r = await agentvm(["cp", join(local, "f.bin"), `${id}:/tmp/cp/f.bin`]);
    expect(r.code, r.err).toBe(0);
    expect((await agentvm(["exec", id, "--", "stat", "-c", "%a %s", "/tmp/cp/f.bin"])).out.toString()).toBe("750 200000\n");
    r = await agentvm(["cp", `${id}:/tmp/cp/f.bin`, join(local, "back.bin")]);
    expect(r.code, r.err).toBe(0);
    expect(readFileSync(join(local, "back.bin")).equals(Buffer.alloc(200_000, 7))).toBe(true);
    expect(statSync(join(local, "back.bin")).mode & 0o777).toBe(0o750);

    mkdirSync(join(local, "tree", "sub"), { recursive: true });
    writeFileSync(join(local, "tree", "a.txt"), "A");
    writeFileSync(join(local, "tree", "sub", "b.txt"), "BB");
    r = await agentvm(["cp", join(local, "tree"), `${id}:/tmp/cptree`]);
    expect(r.code, r.err).toBe(0);
    expect((await agentvm(["exec", id, "--", "cat", "/tmp/cptree/a.txt", "/tmp/cptree/sub/b.txt"])).out.toString()).toBe("ABB");
    r = await agentvm(["cp", `${id}:/tmp/cptree`, join(local, "down")]);
    expect(r.code, r.err).toBe(0);
    expect(readFileSync(join(local, "down", "sub", "b.txt"), "utf8")).toBe("BB");
    r = await agentvm(["cp", `${id}:/tmp/cptree`, join(local, "down")]); // into an existing directory: it keeps its name
    expect(r.code, r.err).toBe(0);
    expect(readFileSync(join(local, "down", "cptree", "a.txt"), "utf8")).toBe("A");

    r = await agentvm(["cp", "-", `${id}:/tmp/cp/stdin.txt`], "from stdin\n");
    expect(r.code, r.err).toBe(0);
    r = await agentvm(["cp", `${id}:/tmp/cp/stdin.txt`, "-"]);
    expect(r.out.toString()).toBe("from stdin\n");
    expect((await agentvm(["cp", join(local, "f.bin"), join(local, "g.bin")])).code).toBe(2);
  }, 180_000);
});

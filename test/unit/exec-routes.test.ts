// The exec, processes and files routes against a fake of the exec server's wire protocol: the codec, validation (bad input → the envelope), the scope, the fleet's target, the audit rows.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtempSync, rmSync, statSync, writeFileSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { generateKeyPair, exportJWK, type JWK } from "jose";
import { eq } from "drizzle-orm";
import { openDatabase, type Database } from "../../schema/db.ts";
import type { createGateway } from "../../gateway/app.ts";
import { testGateway } from "../helpers/test-gateway.ts";
import { createAgentRepo } from "../../gateway/agents/repo.ts";
import type { ForwardContext } from "../../contracts/fleet.ts";
import type { Scope } from "../../contracts/caller.ts";
import { mintToken } from "../../compose/dev-keys.ts";
import { auditLog } from "../../schema/core.ts";
import { fakeFleet } from "../helpers/fake-fleet.ts";
import { startFakeExecServer, type FakeExecServer } from "../helpers/fake-exec-server.ts";
import { decodeSpec, encodeFrame, encodeSpec, frameDecoder, parseExit, type Frame } from "../../contracts/exec-wire.ts";
import { hostCallMethod, signHostCall, verifyHostCall } from "../../contracts/host-protocol.ts";

let database: Database;
let privateJwk: JWK;
let server: FakeExecServer;
let root: string;
let app: ReturnType<typeof createGateway>;
let agentId: string;
const contexts: ForwardContext[] = [];

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "exec-api-unit-"));
  server = await startFakeExecServer(root);
  database = await openDatabase({ pgliteMemory: true });
  const { privateKey } = await generateKeyPair("ES256", { extractable: true });
  privateJwk = { ...(await exportJWK(privateKey)), kid: "k1" };
  const repo = createAgentRepo(database.db);
  await repo.ensureTenant("ten_a", "A");
  await repo.ensureTenant("ten_b", "B");
  const fleet = fakeFleet({
    async forward(_agent, req, ctx) {
      contexts.push(ctx);
      if (ctx.target !== "exec") return new Response("workload");
      // What a host does: the request to the VM's exec server, with the key added on its side.
      const url = new URL(req.url);
      const headers = new Headers(req.headers);
      headers.set("x-agentvm-exec-key", server.key);
      const init: RequestInit & { duplex?: "half" } = { method: req.method, headers };
      if (req.body) {
        init.body = req.body;
        init.duplex = "half";
      }
      const res = await fetch(`${server.url}${url.pathname}${url.search}`, init);
      const out = new Headers(res.headers);
      out.set("x-wake", "warm");
      return new Response(res.body, { status: res.status, headers: out });
    },
  });
  app = testGateway({ db: database.db, agents: repo, fleet, privateJwk });
  const res = await app.request("/v1/agents", { method: "POST", body: "{}", headers: await auth() });
  agentId = ((await res.json()) as { id: string }).id;
});
afterAll(async () => {
  await server?.close();
  await database?.close();
  if (root) rmSync(root, { recursive: true, force: true });
});

const token = (tenant = "ten_a", scopes: Scope[] = ["agents:invoke", "agents:admin", "agents:exec"]) => mintToken(privateJwk, { tenant, scopes });
const auth = async (t?: string) => ({ authorization: `Bearer ${t ?? (await token())}` });

async function execCall(body: unknown, headers: Record<string, string> = {}) {
  return app.request(`/v1/agents/${agentId}/exec`, { method: "POST", body: JSON.stringify(body), headers: { ...(await auth()), ...headers } });
}

async function errorOf(res: Response) {
  return ((await res.json()) as { error: { code: string; message: string } }).error;
}

describe("exec wire codec", () => {
  it("encodes the spec as a length and NUL-terminated key=value strings, in order", () => {
    const bytes = encodeSpec({
      argv: ["python3", "-c", "print(1)"],
      env: { A: "1=2" },
      cwd: "/tmp",
      user: "1000:1000",
      timeoutMs: 0,
      background: true,
      stdin: true,
    });
    expect(new DataView(bytes.buffer).getUint32(0)).toBe(bytes.byteLength - 4);
    expect(decodeSpec(bytes).spec).toEqual([
      "arg=python3",
      "arg=-c",
      "arg=print(1)",
      "env=A=1=2",
      "cwd=/tmp",
      "user=1000:1000",
      "timeout_ms=0",
      "background=1",
      "stdin=1",
    ]);
    expect(() => encodeSpec({ argv: ["a\0b"] })).toThrow();
  });

  it("decodes frames however the bytes are cut, and refuses a stream ending inside one", async () => {
    const bytes = new Uint8Array([
      ...encodeFrame(1, new TextEncoder().encode("hello")),
      ...encodeFrame(2, new Uint8Array(0)),
      ...encodeFrame(3, new TextEncoder().encode("code=3 ms=7")),
    ]);
    const byteByByte = new ReadableStream<Uint8Array>({
      start(c) {
        for (const b of bytes) c.enqueue(new Uint8Array([b]));
        c.close();
      },
    });
    const frames: Frame[] = [];
    for await (const f of byteByByte.pipeThrough(frameDecoder())) frames.push(f);
    const joined = (type: number) => new TextDecoder().decode(new Uint8Array(frames.filter((f) => f.type === type).flatMap((f) => [...f.payload])));
    expect(joined(1)).toBe("hello");
    expect(frames.filter((f) => f.type === 2)).toEqual([{ type: 2, payload: new Uint8Array(0), last: true }]);
    expect(joined(3)).toBe("code=3 ms=7");
    expect(frames.filter((f) => f.last).length).toBe(3);
    const cut = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(bytes.subarray(0, 7));
        c.close();
      },
    });
    await expect(
      (async () => {
        for await (const _ of cut.pipeThrough(frameDecoder())) void _;
      })(),
    ).rejects.toThrow(/inside a frame/);
  });

  it("reads exit lines: a code, a signal by name, a timeout", () => {
    expect(parseExit("code=0 ms=12")).toEqual({ exitCode: 0, signal: null, timedOut: false, durationMs: 12 });
    expect(parseExit("signal=9 timeout=1 ms=100")).toEqual({ exitCode: null, signal: "KILL", timedOut: true, durationMs: 100 });
    expect(parseExit("signal=15 ms=1").signal).toBe("TERM");
    expect(() => parseExit("ms=1")).toThrow();
  });

  it("carries the exec target in the host call's signed token, and nothing else as a target", async () => {
    const key = new Uint8Array(32).fill(7);
    const agent = { id: "agt_x", tenantId: "ten_a", image: "demo", vcpus: 1, memMiB: 256, idleTimeoutMs: 1000, streamIdleMs: 1000, allowEgress: false };
    const call = { op: "forward" as const, agent, reason: "api" as const, method: "POST", path: "/v1/exec", requestId: "req_abcd", target: "exec" as const };
    const verified = await verifyHostCall(key, "hst_1", await signHostCall(key, "hst_1", call));
    expect(verified).toMatchObject({ op: "forward", target: "exec" });
    expect(hostCallMethod(verified)).toBe("POST");
    const odd = { ...call, target: "workload" } as unknown as typeof call;
    await expect(verifyHostCall(key, "hst_1", await signHostCall(key, "hst_1", odd))).rejects.toThrow(/no valid call/);
  });
});

describe("exec routes", () => {
  it("runs a command: output, exit code, the fleet called with target exec and reason api, the key never the gateway's", async () => {
    const res = await execCall({ cmd: ["echo", "hi", "there"], env: { FOO: "bar" }, cwd: "/tmp", user: "app" });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-wake")).toBe("warm");
    expect(await res.json()).toEqual({
      exitCode: 0,
      signal: null,
      timedOut: false,
      durationMs: 3,
      stdout: "hi there\n",
      stderr: "",
      truncated: false,
      encoding: "utf8",
      error: null,
    });
    const ctx = contexts.at(-1)!;
    expect(ctx.target).toBe("exec");
    expect(ctx.reason).toBe("api");
    const seen = server.seen.at(-1)!;
    expect(seen.spec).toEqual(["arg=echo", "arg=hi", "arg=there", "env=FOO=bar", "cwd=/tmp", "user=app", "timeout_ms=60000"]);
  });

  it("a string runs under /bin/sh -c; stdin (utf8 and base64) reaches the process", async () => {
    await execCall({ cmd: "echo $HOME" });
    expect(server.seen.at(-1)!.spec!.slice(0, 3)).toEqual(["arg=/bin/sh", "arg=-c", "arg=echo $HOME"]);
    const a = (await (await execCall({ cmd: ["cat"], stdin: "typed in" })).json()) as { stdout: string };
    expect(a.stdout).toBe("typed in");
    expect(server.seen.at(-1)!.spec).toContain("stdin=1");
    const b = (await (
      await execCall({ cmd: ["cat"], stdin: Buffer.from([0, 1, 2, 255]).toString("base64"), stdinEncoding: "base64", encoding: "base64" })
    ).json()) as {
      stdout: string;
    };
    expect(Buffer.from(b.stdout, "base64")).toEqual(Buffer.from([0, 1, 2, 255]));
  });

  it("exit codes, signals, timeouts and a program that cannot start", async () => {
    expect(await (await execCall({ cmd: ["exit", "3"] })).json()).toMatchObject({ exitCode: 3, signal: null, stderr: "bye\n" });
    expect(await (await execCall({ cmd: ["killed", "15"] })).json()).toMatchObject({ exitCode: null, signal: "TERM", timedOut: false });
    expect(await (await execCall({ cmd: ["timeout"], timeoutMs: 100 })).json()).toMatchObject({ exitCode: null, signal: "KILL", timedOut: true });
    expect(server.seen.at(-1)!.spec).toContain("timeout_ms=100");
    expect(await (await execCall({ cmd: ["nosuch"] })).json()).toMatchObject({ exitCode: 127, error: "not found: nosuch" });
  });

  it("caps each stream at 1 MiB with truncated, reading the rest", async () => {
    const r = (await (await execCall({ cmd: ["big", String(3 * 1024 * 1024)] })).json()) as {
      stdout: string;
      stderr: string;
      truncated: boolean;
      exitCode: number;
    };
    expect(r.stdout.length).toBe(1024 * 1024);
    expect(r.truncated).toBe(true);
    expect(r.stderr).toBe("done\n");
    expect(r.exitCode).toBe(0);
  });

  it("streams NDJSON: output objects as they come, UTF-8 whole across frames, the exit last", async () => {
    const res = await execCall({ cmd: ["utf8split"] }, { accept: "application/x-ndjson" });
    expect(res.headers.get("content-type")).toBe("application/x-ndjson");
    const lines = (await res.text())
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines.map((l) => l.stdout ?? "").join("")).toBe("é€");
    expect(lines.at(-1)).toEqual({ exit: { exitCode: 0, signal: null, timedOut: false, durationMs: 1 } });
    const big = await execCall({ cmd: ["big", String(2 * 1024 * 1024)], encoding: "base64" }, { accept: "application/x-ndjson" });
    let bytes = 0;
    let last: Record<string, unknown> = {};
    for (const l of (await big.text()).trim().split("\n")) {
      last = JSON.parse(l) as Record<string, unknown>;
      if (typeof last.stdout === "string") bytes += Buffer.from(last.stdout, "base64").byteLength;
    }
    expect(bytes).toBe(2 * 1024 * 1024);
    expect(last).toMatchObject({ exit: { exitCode: 0 } });
    const cut = await execCall({ cmd: ["cut"] }, { accept: "application/x-ndjson" });
    expect((await cut.text()).trim().split("\n").at(-1)).toMatch(/"error":"the exec server ended/);
  });

  it("a stream cut without an exit status is 502 in JSON", async () => {
    const res = await execCall({ cmd: ["cut"] });
    expect(res.status).toBe(502);
    expect((await errorOf(res)).code).toBe("bad_gateway");
  });

  it("background processes: start, list, get, output, stdin, signal, wait", async () => {
    const started = await execCall({ cmd: ["server", "--port", "1"], background: true });
    expect(started.status).toBe(201);
    const proc = (await started.json()) as { pid: number; state: string; cmd: string[]; startedAt: string };
    expect(proc).toMatchObject({ state: "running", cmd: ["server", "--port", "1"] });
    expect(server.seen.at(-1)!.spec).toEqual(["arg=server", "arg=--port", "arg=1", "timeout_ms=0", "background=1", "stdin=1"]);
    const base = `/v1/agents/${agentId}/processes`;
    const list = (await (await app.request(base, { headers: await auth() })).json()) as { processes: { pid: number; startedAt: string }[] };
    expect(list.processes.map((p) => p.pid)).toContain(proc.pid);
    expect(list.processes[0]!.startedAt).toMatch(/^\d{4}-\d\d-\d\dT/);
    expect((await app.request(`${base}/${proc.pid}`, { headers: await auth() })).status).toBe(200);
    const out = (await (await app.request(`${base}/${proc.pid}/output?stream=stdout&offset=0`, { headers: await auth() })).json()) as Record<string, unknown>;
    expect(out).toEqual({ data: "bg out\n", encoding: "utf8", offset: 0, nextOffset: 7, dropped: 0, eof: false });
    const post = async (path: string, body: unknown) =>
      app.request(`${base}/${proc.pid}/${path}`, { method: "POST", body: JSON.stringify(body), headers: await auth() });
    expect((await post("stdin", { data: "line\n", eof: true })).status).toBe(204);
    expect(server.seen.at(-1)!.path).toBe(`/v1/procs/${proc.pid}/stdin?eof=1`);
    expect((await post("signal", { signal: "INT" })).status).toBe(204);
    expect(server.seen.at(-1)!.path).toBe(`/v1/procs/${proc.pid}/signal?sig=2`);
    const waited = (await (await post("wait", { timeoutMs: 1000 })).json()) as Record<string, unknown>;
    expect(waited).toMatchObject({ pid: proc.pid, state: "exited", signal: "INT" });
    expect(server.seen.at(-1)!.path).toBe(`/v1/procs/${proc.pid}/wait?timeout_ms=1000`);
    const missing = await app.request(`${base}/99999`, { headers: await auth() });
    expect(missing.status).toBe(404);
    expect((await errorOf(missing)).code).toBe("not_found");
  });

  it("files: write (mode kept), read with its headers, list, tar both ways, delete; the exec server's refusals as the envelope", async () => {
    const base = `/v1/agents/${agentId}/files`;
    const put = await app.request(`${base}?path=/data/a/b.txt&mode=0640&mkdirs=true`, { method: "PUT", body: "file body", headers: await auth() });
    expect(put.status).toBe(201);
    expect(await put.json()).toMatchObject({ path: "/data/a/b.txt", size: 9, mode: "0640" });
    expect(statSync(join(root, "data/a/b.txt")).mode & 0o777).toBe(0o640);
    const get = await app.request(`${base}?path=/data/a/b.txt`, { headers: await auth() });
    expect(get.status).toBe(200);
    expect(await get.text()).toBe("file body");
    expect(get.headers.get("x-file-mode")).toBe("0640");
    expect(get.headers.get("last-modified")).toMatch(/GMT$/);
    const dir = (await (await app.request(`${base}?path=/data/a`, { headers: await auth() })).json()) as {
      path: string;
      entries: { name: string; mode: string }[];
    };
    expect(dir).toMatchObject({ path: "/data/a", entries: [{ name: "b.txt", type: "file", size: 9, mode: "0640" }] });
    const tarIn = await app.request(`${base}?path=/tree`, {
      method: "PUT",
      body: "TARBYTES",
      headers: { ...(await auth()), "content-type": "application/x-tar" },
    });
    expect(tarIn.status).toBe(201);
    expect(await tarIn.json()).toEqual({ path: "/tree", entries: 3 });
    const tarOut = await app.request(`${base}?path=/tree/tar.bin`, { headers: { ...(await auth()), accept: "application/x-tar" } });
    expect(tarOut.headers.get("content-type")).toBe("application/x-tar");
    expect(await tarOut.text()).toBe("TARBYTES");
    const del = await app.request(`${base}?path=/data&recursive=true`, { method: "DELETE", headers: await auth() });
    expect(del.status).toBe(204);
    const gone = await app.request(`${base}?path=/data/a/b.txt`, { headers: await auth() });
    expect(gone.status).toBe(404);
    expect((await errorOf(gone)).code).toBe("not_found");
    const refused = await app.request(`${base}?path=/proc/x`, { method: "PUT", body: "x", headers: await auth() });
    expect(refused.status).toBe(403);
    expect(await errorOf(refused)).toMatchObject({ code: "forbidden_path", message: "refused: /proc/x" });
  });

  it("a file upload is not capped by the agent's request-body limit (1000 bytes here)", async () => {
    mkdirSync(join(root, "up"), { recursive: true });
    const body = new Uint8Array(200_000).fill(7);
    const put = await app.request(`/v1/agents/${agentId}/files?path=/up/big.bin`, { method: "PUT", body, headers: await auth() });
    expect(put.status).toBe(201);
    expect(statSync(join(root, "up/big.bin")).size).toBe(200_000);
  });

  it("bad input gets the envelope before the VM is called", async () => {
    const before = server.seen.length;
    const cases: [string, RequestInit, string][] = [
      [`/v1/agents/${agentId}/exec`, { method: "POST", body: JSON.stringify({}) }, "cmd"],
      [`/v1/agents/${agentId}/exec`, { method: "POST", body: JSON.stringify({ cmd: [] }) }, "must name a program"],
      [`/v1/agents/${agentId}/exec`, { method: "POST", body: JSON.stringify({ cmd: ["a"], cwd: "rel" }) }, "absolute"],
      [`/v1/agents/${agentId}/exec`, { method: "POST", body: JSON.stringify({ cmd: ["a"], cwd: "/a/../b" }) }, ".."],
      [`/v1/agents/${agentId}/exec`, { method: "POST", body: JSON.stringify({ cmd: ["a"], timeoutMs: -1 }) }, "integer"],
      [`/v1/agents/${agentId}/exec`, { method: "POST", body: JSON.stringify({ cmd: ["a"], env: { "1X": "y" } }) }, "names"],
      [`/v1/agents/${agentId}/exec`, { method: "POST", body: JSON.stringify({ cmd: ["a"], user: "a b" }) }, "user"],
      [`/v1/agents/${agentId}/exec`, { method: "POST", body: JSON.stringify({ cmd: ["a"], stdin: "***", stdinEncoding: "base64" }) }, "base64"],
      [`/v1/agents/${agentId}/exec`, { method: "POST", body: JSON.stringify({ cmd: ["a"], surprise: 1 }) }, "unknown field"],
      [`/v1/agents/${agentId}/files?path=../etc/passwd`, { method: "GET" }, "absolute"],
      [`/v1/agents/${agentId}/files?path=/a/../../etc`, { method: "GET" }, ".."],
      [`/v1/agents/${agentId}/files`, { method: "GET" }, "path"],
      [`/v1/agents/${agentId}/files?path=/x&mode=999`, { method: "PUT", body: "x" }, "octal"],
      [`/v1/agents/${agentId}/processes/abc`, { method: "GET" }, "process id"],
      [`/v1/agents/${agentId}/processes/1/signal`, { method: "POST", body: JSON.stringify({ signal: "NOPE" }) }, "TERM"],
      [`/v1/agents/${agentId}/processes/1/output?limit=0`, { method: "GET" }, "integer"],
    ];
    for (const [path, init, message] of cases) {
      const res = await app.request(path, { ...init, headers: await auth() });
      expect(res.status, path).toBe(400);
      const err = await errorOf(res);
      expect(err.code, path).toBe("bad_request");
      expect(err.message, path).toContain(message);
    }
    expect(server.seen.length).toBe(before);
    const notId = await app.request(`/v1/agents/nope/exec`, { method: "POST", body: JSON.stringify({ cmd: ["a"] }), headers: await auth() });
    expect(notId.status).toBe(400);
    const other = await app.request(`/v1/agents/${agentId}/exec`, {
      method: "POST",
      body: JSON.stringify({ cmd: ["a"] }),
      headers: await auth(await token("ten_b")),
    });
    expect(other.status).toBe(404);
  });

  it("needs agents:exec: admin alone is 403, no token 401", async () => {
    const adminOnly = await token("ten_a", ["agents:invoke", "agents:admin", "usage:read"]);
    for (const [path, method] of [
      [`/v1/agents/${agentId}/exec`, "POST"],
      [`/v1/agents/${agentId}/processes`, "GET"],
      [`/v1/agents/${agentId}/files?path=/x`, "GET"],
      [`/v1/agents/${agentId}/files?path=/x`, "PUT"],
      [`/v1/agents/${agentId}/files?path=/x`, "DELETE"],
    ] as const) {
      const res = await app.request(path, {
        method,
        ...(method === "POST" ? { body: "{}" } : method === "PUT" ? { body: "x" } : {}),
        headers: await auth(adminOnly),
      });
      expect(res.status, `${method} ${path}`).toBe(403);
      expect((await errorOf(res)).message).toContain("agents:exec");
      expect((await app.request(path, { method })).status).toBe(401);
    }
  });

  it("records every exec, write, delete, untar, stdin and signal in the audit log, with the caller and request id", async () => {
    writeFileSync(join(root, "audit.txt"), "x");
    const res = await execCall({ cmd: ["exit", "4"], env: { SECRET: "value" } });
    const requestId = res.headers.get("x-request-id");
    const rows = await database.db.select().from(auditLog).where(eq(auditLog.tenantId, "ten_a"));
    const execRow = rows.find((r) => r.requestId === requestId)!;
    expect(execRow).toMatchObject({ action: "agent.exec", target: agentId });
    expect(execRow.detail).toMatchObject({ argv: ["exit", "4"], exitCode: 4, signal: null, env: ["SECRET"] });
    expect(JSON.stringify(execRow.detail)).not.toContain("value");
    expect(typeof (execRow.detail as { durationMs: unknown }).durationMs).toBe("number");
    const actions = new Set(rows.map((r) => r.action));
    for (const a of ["agent.exec", "agent.files.write", "agent.files.delete", "agent.files.untar", "agent.process.stdin", "agent.process.signal"])
      expect(actions, a).toContain(a);
    const write = rows.find((r) => r.action === "agent.files.write" && (r.detail as { path: string }).path === "/up/big.bin")!;
    expect(write.detail).toMatchObject({ bytes: 200_000 });
    expect(write.actor).toBeTruthy();
  });

  it("the fleet's errors (501 exec_unsupported, 409 guest_outdated) reach the caller in the envelope", async () => {
    const { AppError } = await import("../../lib/errors.ts");
    for (const [code, status] of [
      ["exec_unsupported", 501],
      ["guest_outdated", 409],
    ] as const) {
      const failing = testGateway({
        db: database.db,
        agents: createAgentRepo(database.db),
        fleet: fakeFleet({
          async forward() {
            throw new AppError(code, `${code} here`);
          },
        }),
        privateJwk,
      });
      const res = await failing.request(`/v1/agents/${agentId}/exec`, { method: "POST", body: JSON.stringify({ cmd: ["a"] }), headers: await auth() });
      expect(res.status).toBe(status);
      expect(await errorOf(res)).toMatchObject({ code, message: `${code} here` });
    }
  });
});

describe("exec audit when the caller goes away", () => {
  it("an NDJSON stream cancelled before the exit still leaves its audit row", async () => {
    const res = await execCall({ cmd: ["big", String(8 * 1024 * 1024)] }, { accept: "application/x-ndjson" });
    const requestId = res.headers.get("x-request-id");
    const reader = res.body!.getReader();
    await reader.read();
    await reader.cancel();
    let row: { detail: unknown } | undefined;
    for (let i = 0; i < 50 && !row; i++) {
      row = (await database.db.select().from(auditLog).where(eq(auditLog.requestId, requestId!)))[0];
      if (!row) await new Promise((r) => setTimeout(r, 20));
    }
    expect(row?.detail).toMatchObject({ argv: ["big", String(8 * 1024 * 1024)], exitCode: null, error: "the client went away before the command ended" });
  });
});

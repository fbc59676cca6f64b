// The TypeScript SDK against a small fake gateway over a real socket: the requests it sends, the answers it reads, the error envelope as AgentVMError.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { AgentVM, AgentVMError } from "../../sdk/typescript/src/index.ts";

interface Seen {
  method: string;
  url: string;
  headers: IncomingMessage["headers"];
  body: Buffer;
}

let server: Server;
let base: string;
const seen: Seen[] = [];
let exhaustedFor = 0; // acquires answered pool_exhausted before one succeeds
const last = () => seen[seen.length - 1]!;

const agentView = (id: string) => ({ id, name: "agent", state: "hibernated", path: `/a/${id}/` });

beforeAll(async () => {
  server = createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = Buffer.concat(chunks);
    seen.push({ method: req.method!, url: req.url!, headers: req.headers, body });
    const url = new URL(req.url!, "http://x");
    const json = (status: number, value: unknown) => {
      res.writeHead(status, { "content-type": "application/json" });
      res.end(JSON.stringify(value));
    };
    if (req.headers.authorization !== "Bearer tok") return json(401, { error: { code: "unauthorized", message: "no valid token", requestId: "req_1" } });
    const p = url.pathname;
    if (p === "/v1/agents" && req.method === "POST") return json(201, agentView("agt_new"));
    if (p === "/v1/agents/agt_gone") return json(404, { error: { code: "not_found", message: "agent agt_gone not found", requestId: "req_2" } });
    if (p === "/v1/agents/agt_1/exec") {
      const spec = JSON.parse(body.toString()) as { background?: boolean };
      if (spec.background) return json(201, { pid: 42, cmd: ["sleep", "9"], state: "running", startedAt: "2026-01-01T00:00:00.000Z" });
      if (req.headers.accept === "application/x-ndjson") {
        res.writeHead(200, { "content-type": "application/x-ndjson" });
        res.write('{"stdout":"a"}\n{"std');
        await new Promise((r) => setTimeout(r, 20));
        res.write('err":"b"}\n');
        res.end('{"exit":{"exitCode":3,"signal":null,"timedOut":false,"durationMs":5}}\n');
        return;
      }
      return json(200, { exitCode: 0, signal: null, timedOut: false, stdout: "hi\n", stderr: "", truncated: false, durationMs: 7 });
    }
    if (p === "/v1/agents/agt_1/files" && req.method === "PUT")
      return json(201, { path: url.searchParams.get("path"), size: body.length, mode: "0600", uid: 0, gid: 0 });
    if (p === "/v1/agents/agt_1/files" && req.method === "GET") {
      if (url.searchParams.get("path") === "/dir") return json(200, { path: "/dir", entries: [{ name: "f", type: "file", size: 1 }] });
      res.writeHead(200, { "content-type": "application/octet-stream", "x-file-mode": "0644" });
      return res.end(Buffer.from([0, 1, 2, 255]));
    }
    if (p === "/v1/agents/agt_1/files" && req.method === "DELETE") return res.writeHead(204).end();
    if (p === "/v1/agents/agt_1/processes/42/wait") return json(200, { pid: 42, cmd: ["sleep", "9"], state: "exited", exitCode: 0, signal: null });
    if (p === "/v1/agents/agt_1/processes/42/output") {
      const offset = Number(url.searchParams.get("offset"));
      return json(
        200,
        offset === 0
          ? { data: "abc", encoding: "utf8", offset: 0, nextOffset: 3, dropped: 0, eof: false }
          : { data: "d", encoding: "utf8", offset, nextOffset: 4, dropped: 0, eof: true },
      );
    }
    if (p === "/a/agt_1/hello") return res.writeHead(200, { "content-type": "text/plain" }).end(`hello ${req.method}`);
    if (p === "/v1/pools/pol_1/acquire") {
      if (exhaustedFor-- > 0) return json(409, { error: { code: "pool_exhausted", message: "every agent handed out", requestId: "req_3" } });
      return json(200, { agent: agentView("agt_p"), pool: "pol_1" });
    }
    if (p === "/v1/pools/pol_1/release") return json(200, { agent: agentView(JSON.parse(body.toString()).agentId) });
    if (p === "/v1/pools/pol_1")
      return json(200, { id: "pol_1", name: null, fromCheckpoint: "ckp_1", size: 2, maxSize: 4, ready: 2, inUse: 0, state: "ready" });
    res.writeHead(502, { "content-type": "text/plain" }).end("upstream gone");
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => new Promise<void>((r) => server.close(() => r())));

const client = () => new AgentVM({ baseUrl: `${base}/`, token: "tok" });

describe("the TypeScript SDK", () => {
  it("creates an agent with the token and JSON body; AgentVM.create and the environment's URL and token", async () => {
    const agent = await client().agents.create({ name: "x" });
    expect(agent.id).toBe("agt_new");
    expect(agent.url).toBe(`${base}/a/agt_new/`);
    expect(last()).toMatchObject({ method: "POST", url: "/v1/agents", headers: { authorization: "Bearer tok", "content-type": "application/json" } });
    expect(JSON.parse(last().body.toString())).toEqual({ name: "x" });
    const saved = { url: process.env.AGENTVM_URL, token: process.env.AGENTVM_TOKEN };
    process.env.AGENTVM_URL = base;
    process.env.AGENTVM_TOKEN = "tok";
    try {
      expect((await AgentVM.create()).id).toBe("agt_new");
    } finally {
      for (const [k, v] of [
        ["AGENTVM_URL", saved.url],
        ["AGENTVM_TOKEN", saved.token],
      ] as const) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  });

  it("throws the envelope as AgentVMError with code, message, status and request id; another body as http_<status>; no server as unreachable", async () => {
    const err = await client()
      .agents.get("agt_gone")
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AgentVMError);
    expect(err).toMatchObject({ code: "not_found", message: "agent agt_gone not found", status: 404, requestId: "req_2" });
    expect(String(err)).toBe("AgentVMError not_found: agent agt_gone not found (request req_2)");
    await expect(new AgentVM({ baseUrl: base }).agents.create()).rejects.toMatchObject({ code: "unauthorized", status: 401 });
    await expect(client().pools.list()).rejects.toMatchObject({ code: "http_502", message: "upstream gone" });
    await expect(new AgentVM({ baseUrl: "http://127.0.0.1:1", token: "t" }).agents.create()).rejects.toMatchObject({ code: "unreachable", status: 0 });
  });

  it("exec sends the command and its options (bytes of stdin as base64) and answers the result with ok", async () => {
    const r = await client()
      .agents.connect("agt_1")
      .exec(["echo", "hi"], { cwd: "/tmp", env: { A: "1" }, user: "1000", stdin: new Uint8Array([1, 2]), timeoutMs: 5000 });
    expect(r).toMatchObject({ exitCode: 0, stdout: "hi\n", ok: true, durationMs: 7 });
    expect(JSON.parse(last().body.toString())).toEqual({
      cmd: ["echo", "hi"],
      cwd: "/tmp",
      env: { A: "1" },
      user: "1000",
      timeoutMs: 5000,
      stdin: "AQI=",
      stdinEncoding: "base64",
    });
    await client().agents.connect("agt_1").exec("echo $A", { stdin: "text" });
    expect(JSON.parse(last().body.toString())).toEqual({ cmd: "echo $A", stdin: "text" });
  });

  it("execStream yields the ndjson events as they come, split lines joined, the exit last", async () => {
    const events = [];
    for await (const e of client().agents.connect("agt_1").execStream(["x"])) events.push(e);
    expect(events).toEqual([{ stdout: "a" }, { stderr: "b" }, { exit: { exitCode: 3, signal: null, timedOut: false, durationMs: 5 } }]);
    expect(last().headers.accept).toBe("application/x-ndjson");
  });

  it("spawn, wait and the output's pages", async () => {
    const proc = await client().agents.connect("agt_1").spawn(["sleep", "9"], { stdin: true });
    expect(JSON.parse(last().body.toString())).toEqual({ cmd: ["sleep", "9"], background: true, stdin: "" });
    expect(proc.pid).toBe(42);
    expect((await proc.wait({ timeoutMs: 100 })).state).toBe("exited");
    expect(await proc.text()).toBe("abcd");
  });

  it("files: write streams bytes with mode and mkdirs, read answers bytes, list a directory, remove recursive", async () => {
    const files = client().agents.connect("agt_1").files;
    const stream = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(new Uint8Array([1, 2]));
        c.enqueue(new Uint8Array([3]));
        c.close();
      },
    });
    expect(await files.write("/a/b", stream, { mode: 0o600, mkdirs: true })).toMatchObject({ path: "/a/b", size: 3 });
    expect(last().url).toBe("/v1/agents/agt_1/files?path=%2Fa%2Fb&mode=0600&mkdirs=true");
    await files.write("/t", "héllo");
    expect(last().body.toString()).toBe("héllo");
    expect([...(await files.read("/f"))]).toEqual([0, 1, 2, 255]);
    expect((await files.list("/dir")).entries[0]!.name).toBe("f");
    await expect(files.read("/dir")).rejects.toMatchObject({ code: "bad_request" });
    await files.remove("/dir", { recursive: true });
    expect(last()).toMatchObject({ method: "DELETE", url: "/v1/agents/agt_1/files?path=%2Fdir&recursive=true" });
  });

  it("agent.fetch calls the agent's URL with the token; pools acquire and release", async () => {
    const agent = client().agents.connect("agt_1");
    const r = await agent.fetch("/hello", { method: "POST", body: "x" });
    expect(await r.text()).toBe("hello POST");
    expect(last().headers.authorization).toBe("Bearer tok");
    const pool = await client().pools.get("pol_1");
    const got = await pool.acquire();
    expect(got).toMatchObject({ id: "agt_p", poolId: "pol_1" });
    expect((await got.release()).agent.id).toBe("agt_p");
    expect(JSON.parse(last().body.toString())).toEqual({ agentId: "agt_p" });
    exhaustedFor = 2;
    expect((await pool.acquire({ waitMs: 5000 })).id).toBe("agt_p"); // asked three times
    exhaustedFor = 1;
    await expect(pool.acquire()).rejects.toMatchObject({ code: "pool_exhausted", status: 409 });
  });
});

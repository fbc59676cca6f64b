// Exec on a terminal through the Node gateway's real server and Node's own WebSocket, the exec server a fake terminal behind a fake fleet: the route's refusals, an old guest, messages both ways, close codes, the audit row; and the CLI's choices.
import { request } from "node:http";
import { generateKeyPair, exportJWK, type JWK } from "jose";
import { eq } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openDatabase, type Database } from "../../schema/db.ts";
import type { createGateway } from "../../gateway/app.ts";
import { testGateway } from "../helpers/test-gateway.ts";
import { createAgentRepo } from "../../gateway/agents/repo.ts";
import { serveNode, type NodeServer } from "../../gateway/node/serve.ts";
import type { Scope } from "../../contracts/caller.ts";
import type { VmState } from "../../contracts/agent.ts";
import { mintToken } from "../../compose/dev-keys.ts";
import { auditLog } from "../../schema/core.ts";
import { fakeFleet } from "../helpers/fake-fleet.ts";
import { encodeFrame, frameType } from "../../contracts/exec-wire.ts";
import { AgentVM } from "../../sdk/typescript/src/index.ts";
import { TerminalGuard, exitStatus, ttyUrl, wantsTty, windowSize, type GuardProcess } from "../../cli/exec-tty.ts";

let database: Database;
let privateJwk: JWK;
let app: ReturnType<typeof createGateway>;
let server: NodeServer;
let agentId: string;
/** What the fake exec server saw of each terminal: its spec, and whether its input ended (the hangup). */
const seen: { spec: string[]; ended: boolean; cut?: boolean }[] = [];
/** The agent's state as the fake fleet reports it. */
let vmState: VmState = "running";

const enc = new TextEncoder();
const frame = (type: number, text: string) => encodeFrame(type, enc.encode(text));

/**
 * A fake exec server's terminal: the spec, then input frames. Data is echoed as output (`exit` in it ends with code 3),
 * a resize answers `size R C`, the input's end is the hangup (signal 1). An argv of `old` is a v1 server's refusal.
 */
async function fakeTerminal(body: ReadableStream<Uint8Array>): Promise<Response> {
  const reader = body.getReader();
  let buf = new Uint8Array(0);
  const more = async () => {
    const next = await reader.read();
    if (next.done) return false;
    const joined = new Uint8Array(buf.length + next.value.length);
    joined.set(buf);
    joined.set(next.value, buf.length);
    buf = joined;
    return true;
  };
  const take = async (n: number) => {
    while (buf.length < n) if (!(await more())) return undefined;
    const out = buf.slice(0, n);
    buf = buf.slice(n);
    return out;
  };
  const len = await take(4);
  const specBytes = await take(new DataView(len!.buffer).getUint32(0));
  const spec = new TextDecoder().decode(specBytes).split("\0").slice(0, -1);
  const record: (typeof seen)[number] = { spec, ended: false };
  seen.push(record);
  if (spec[0] === "arg=old") {
    void reader.cancel();
    return new Response(JSON.stringify({ code: "bad_request", message: "unknown spec entry: tty=24x80" }), { status: 400 });
  }
  const out = new ReadableStream<Uint8Array>({
    cancel() {
      record.cut = true;
    },
    async start(controller) {
      for (;;) {
        const head = await take(5);
        if (!head && spec.includes("arg=stubborn")) {
          // A command that ignores its hangup: its output stays open until the gateway cuts the connection.
          record.ended = true;
          return;
        }
        if (!head) {
          record.ended = true;
          controller.enqueue(frame(frameType.exit, "signal=1 ms=1"));
          return controller.close();
        }
        const payload = new TextDecoder().decode(await take(new DataView(head.buffer).getUint32(1)));
        if (head[0] === 5) controller.enqueue(frame(frameType.stdout, `size ${payload}`));
        else if (payload.includes("vanish")) {
          // The stream ends with no exit: the VM stopped under the command (`vanish sleep`: its host hibernates it) or broke.
          if (payload.includes("sleep")) vmState = "snapshotting";
          void reader.cancel();
          return controller.close();
        } else if (payload.includes("exit")) {
          controller.enqueue(frame(frameType.exit, "code=3 ms=5"));
          void reader.cancel();
          return controller.close();
        } else controller.enqueue(frame(frameType.stdout, payload));
      }
    },
  });
  return new Response(out, { status: 200, headers: { "x-wake": "warm" } });
}

beforeAll(async () => {
  database = await openDatabase({ pgliteMemory: true });
  const { privateKey } = await generateKeyPair("ES256", { extractable: true });
  privateJwk = { ...(await exportJWK(privateKey)), kid: "k1" };
  const repo = createAgentRepo(database.db);
  await repo.ensureTenant("ten_a", "A");
  const fleet = fakeFleet({
    async forward(_agent, req, ctx) {
      if (ctx.target !== "exec" || !req.body) return new Response("workload");
      return fakeTerminal(req.body);
    },
    async status(id) {
      return { agentId: id, vmId: "vm_x", state: vmState, inFlight: 0, leases: 0, runId: undefined, lastWakeAt: undefined, lastActivityAt: undefined };
    },
  });
  app = testGateway({ db: database.db, agents: repo, fleet, privateJwk });
  const res = await app.request("/v1/agents", { method: "POST", body: "{}", headers: { authorization: `Bearer ${await token()}` } });
  agentId = ((await res.json()) as { id: string }).id;
  server = await serveNode(app, { port: 0, hostname: "127.0.0.1" });
});

afterAll(async () => {
  await server?.close();
  await database?.close();
});

const token = (scopes: Scope[] = ["agents:invoke", "agents:admin", "agents:exec"]) => mintToken(privateJwk, { tenant: "ten_a", scopes });

interface Session {
  ws: WebSocket;
  got: string[];
  controls: Record<string, unknown>[];
  closed: Promise<{ code: number; reason: string }>;
  waitFor(text: string): Promise<void>;
}

async function open(query: string): Promise<Session> {
  const ws = new WebSocket(`ws://127.0.0.1:${server.port}/v1/agents/${agentId}/exec/tty?${query}`, {
    headers: { authorization: `Bearer ${await token()}` },
  } as unknown as string[]);
  ws.binaryType = "arraybuffer";
  const got: string[] = [];
  const controls: Record<string, unknown>[] = [];
  const closed = new Promise<{ code: number; reason: string }>((resolve) => ws.addEventListener("close", (e) => resolve({ code: e.code, reason: e.reason })));
  ws.addEventListener("message", (e) => {
    if (typeof e.data === "string") controls.push(JSON.parse(e.data) as Record<string, unknown>);
    else got.push(new TextDecoder().decode(e.data as ArrayBuffer));
  });
  await new Promise<void>((resolve, reject) => {
    ws.addEventListener("open", () => resolve(), { once: true });
    ws.addEventListener("error", () => reject(new Error("did not open")), { once: true });
  });
  return {
    ws,
    got,
    controls,
    closed,
    async waitFor(text) {
      const until = Date.now() + 5000;
      while (!got.join("").includes(text)) {
        if (Date.now() > until) throw new Error(`no ${text} in ${JSON.stringify(got)}`);
        await new Promise((r) => setTimeout(r, 5));
      }
    },
  };
}

/** An upgrade by hand: the refusal's status and envelope (or "upgraded"). */
function upgrade(
  path: string,
  headers: Record<string, string>,
): Promise<{ status: number; code?: string; message?: string; requestId?: string; accept?: string }> {
  return new Promise((resolve, reject) => {
    const req = request({
      host: "127.0.0.1",
      port: server.port,
      path,
      headers: { connection: "Upgrade", upgrade: "websocket", "sec-websocket-version": "13", "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==", ...headers },
    });
    req.on("upgrade", (res, socket) => {
      socket.destroy();
      resolve({ status: res.statusCode ?? 0, requestId: String(res.headers["x-request-id"]), accept: String(res.headers["sec-websocket-accept"]) });
    });
    req.on("response", (res) => {
      let text = "";
      res.on("data", (d: Buffer) => (text += d.toString()));
      res.on("end", () => {
        const e = (JSON.parse(text) as { error: { code: string; message: string } }).error;
        resolve({ status: res.statusCode ?? 0, code: e.code, message: e.message });
      });
    });
    req.on("error", reject);
    req.end();
  });
}

describe("exec on a terminal through the Node gateway", () => {
  it("bytes both ways, a resize, the exit message and a 1000 close; the spec and the audit row", async () => {
    const s = await open("arg=/bin/bash&arg=-l&rows=24&cols=80&env=TERM%3Dvt100&cwd=/tmp");
    s.ws.send(enc.encode("hello"));
    await s.waitFor("hello");
    s.ws.send(JSON.stringify({ resize: { rows: 40, cols: 100 } }));
    await s.waitFor("size rows=40 cols=100");
    s.ws.send(enc.encode("exit\n"));
    expect((await s.closed).code).toBe(1000);
    expect(s.controls.at(-1)).toEqual({ exit: { code: 3, signal: null, timedOut: false, durationMs: 5 } });
    expect(seen.at(-1)!.spec).toEqual(["arg=/bin/bash", "arg=-l", "env=TERM=vt100", "cwd=/tmp", "timeout_ms=0", "tty=24x80"]);
    const rows = await database.db.select().from(auditLog).where(eq(auditLog.target, agentId));
    expect(rows.find((r) => r.action === "agent.exec")?.detail).toMatchObject({
      argv: ["/bin/bash", "-l"],
      tty: true,
      rows: 24,
      cols: 80,
      exitCode: 3,
      env: ["TERM"],
    });
  });

  it("a browser's token as a subprotocol (agentvm.bearer.<token> beside agentvm.tty, which the answer selects)", async () => {
    const ws = new WebSocket(`ws://127.0.0.1:${server.port}/v1/agents/${agentId}/exec/tty?rows=2&cols=3`, ["agentvm.tty", `agentvm.bearer.${await token()}`]);
    await new Promise<void>((resolve, reject) => {
      ws.addEventListener("open", () => resolve(), { once: true });
      ws.addEventListener("error", () => reject(new Error("did not open")), { once: true });
    });
    expect(ws.protocol).toBe("agentvm.tty");
    expect(seen.at(-1)!.spec).toContain("tty=2x3");
    ws.close();
    const refused = await upgrade(`/v1/agents/${agentId}/exec/tty?rows=2&cols=3`, {
      "sec-websocket-protocol": `agentvm.tty, agentvm.bearer.${await token(["agents:invoke"])}`,
    });
    expect(refused).toMatchObject({ status: 403, code: "forbidden" });
  });

  it("the TypeScript SDK's openTty: argv, size and env in the URL, the token as a subprotocol", async () => {
    const agent = new AgentVM({ baseUrl: `http://127.0.0.1:${server.port}`, token: await token() }).agents.connect(agentId);
    const ws = agent.openTty(["top", "-b"], { rows: 7, cols: 9, env: { A: "1" }, cwd: "/srv" });
    const got: string[] = [];
    const controls: unknown[] = [];
    const closed = new Promise<number>((resolve) => ws.addEventListener("close", (e) => resolve(e.code)));
    ws.addEventListener("message", (e) =>
      typeof e.data === "string" ? controls.push(JSON.parse(e.data)) : got.push(new TextDecoder().decode(e.data as ArrayBuffer)),
    );
    await new Promise<void>((resolve) => ws.addEventListener("open", () => resolve(), { once: true }));
    expect(seen.at(-1)!.spec).toEqual(["arg=top", "arg=-b", "env=A=1", "cwd=/srv", "timeout_ms=0", "tty=7x9"]);
    ws.send(new TextEncoder().encode("exit"));
    expect(await closed).toBe(1000);
    expect(controls.at(-1)).toMatchObject({ exit: { code: 3 } });
  });

  it("the client's close ends the command's input (its hangup); a bad control message closes 1008", async () => {
    const s = await open("cmd=sleep%201000&rows=5&cols=5");
    expect(seen.at(-1)!.spec.slice(0, 3)).toEqual(["arg=/bin/sh", "arg=-c", "arg=sleep 1000"]);
    s.ws.close();
    await s.closed;
    const record = seen.at(-1)!;
    const until = Date.now() + 5000;
    while (!record.ended && Date.now() < until) await new Promise((r) => setTimeout(r, 5));
    expect(record.ended).toBe(true);
    const bad = await open("rows=5&cols=5");
    expect(seen.at(-1)!.spec[0]).toBe("arg=/bin/sh");
    bad.ws.send("not json");
    expect((await bad.closed).code).toBe(1008);
    expect(bad.controls[0]).toMatchObject({ error: expect.stringMatching(/resize/) });
  });

  it("refusals before the upgrade: the envelope for no scope, a bad size, an unknown agent, an old guest (409 guest_outdated)", async () => {
    const path = (q: string, id = agentId) => `/v1/agents/${id}/exec/tty?${q}`;
    const bearer = async (scopes?: Scope[]) => ({ authorization: `Bearer ${await token(scopes)}` });
    expect(await upgrade(path("rows=1&cols=1"), await bearer(["agents:invoke"]))).toMatchObject({ status: 403, code: "forbidden" });
    expect(await upgrade(path("rows=1&cols=1"), {})).toMatchObject({ status: 401, code: "unauthorized" });
    expect(await upgrade(path("rows=1001&cols=1"), await bearer())).toMatchObject({ status: 400, code: "bad_request" });
    expect(await upgrade(path("rows=1&cols=1&foo=1"), await bearer())).toMatchObject({ status: 400, code: "bad_request" });
    expect(await upgrade(path("rows=1&cols=1&cmd=a&arg=b"), await bearer())).toMatchObject({ status: 400, message: "give cmd or arg, not both" });
    expect(await upgrade(path("rows=1&cols=1&env=1BAD=x"), await bearer())).toMatchObject({ status: 400, code: "bad_request" });
    expect(await upgrade(path("rows=1&cols=1", "agt_0000000000000000"), await bearer())).toMatchObject({ status: 404, code: "not_found" });
    expect(await upgrade(path("rows=24&cols=80&arg=old"), await bearer())).toMatchObject({ status: 409, code: "guest_outdated" });
    expect(await upgrade(path("rows=1&cols=1"), { ...(await bearer()), "sec-websocket-version": "8" })).toMatchObject({ status: 400 });
    // Accepted: the 101 with RFC 6455's accept value for the key, and the call's request id.
    expect(await upgrade(path("rows=1&cols=1"), await bearer())).toMatchObject({
      status: 101,
      accept: "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=",
      requestId: expect.stringMatching(/^req_/),
    });
  });

  it("without a runtime that takes WebSockets: 501 for an upgrade (a Worker), 400 for a plain GET", async () => {
    const headers = { authorization: `Bearer ${await token()}` };
    const worker = await app.request(`/v1/agents/${agentId}/exec/tty?rows=1&cols=1`, { headers: { ...headers, upgrade: "websocket" } });
    expect([worker.status, ((await worker.json()) as { error: { code: string } }).error.code]).toEqual([501, "exec_unsupported"]);
    const plain = await fetch(`http://127.0.0.1:${server.port}/v1/agents/${agentId}/exec/tty?rows=1&cols=1`, { headers });
    expect(plain.status).toBe(400);
  });

  it("a command that ignores its hangup is cut 5 s after its client went away", async () => {
    const s = await open("arg=stubborn&rows=5&cols=5");
    const record = seen.at(-1)!;
    const t0 = Date.now();
    s.ws.close();
    await s.closed;
    const until = Date.now() + 10_000;
    while (!record.cut && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    expect(record.ended).toBe(true);
    expect(record.cut).toBe(true);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(4900);
  }, 15_000);

  it("a stream cut without an exit: 1001 while the agent goes to sleep, 1011 with the envelope otherwise", async () => {
    const s = await open("rows=5&cols=5");
    s.ws.send(enc.encode("vanish sleep"));
    expect((await s.closed).code).toBe(1001);
    expect(s.controls[0]).toMatchObject({ error: expect.stringMatching(/going to sleep/) });
    vmState = "running";
    const broken = await open("rows=5&cols=5");
    broken.ws.send(enc.encode("vanish"));
    const closed = await broken.closed;
    expect(closed.code).toBe(1011);
    expect(JSON.parse(closed.reason)).toMatchObject({ error: { code: "bad_gateway" } });
    expect(broken.controls[0]).toMatchObject({ error: { code: "bad_gateway", requestId: expect.stringMatching(/^req_/) } });
  });

  it("a gateway that stops closes its terminals with 1001", async () => {
    const s = await open("rows=5&cols=5");
    server.refuseNew();
    const closed = await s.closed;
    expect(closed.code).toBe(1001);
  });
});

describe("agentvm exec: the terminal's choices", () => {
  it("a terminal when both ends are terminals, unless -t or -T says", () => {
    expect(wantsTty(undefined, true, true)).toBe(true);
    expect(wantsTty(undefined, true, false)).toBe(false);
    expect(wantsTty(undefined, false, true)).toBe(false);
    expect(wantsTty(true, false, false)).toBe(true);
    expect(wantsTty(false, true, true)).toBe(false);
  });

  it("the window's size within the API's bounds; the URL with args, env and our TERM", () => {
    expect(windowSize({ isTTY: true, rows: 50, columns: 5000 })).toEqual({ rows: 50, cols: 1000 });
    expect(windowSize({ isTTY: false })).toEqual({ rows: 24, cols: 80 });
    const url = new URL(ttyUrl({ url: "https://gw.example", term: "screen" }, "agt_x", ["ls", "-la"], { env: { A: "1" }, user: "app" }, { rows: 3, cols: 4 }));
    expect(url.protocol).toBe("wss:");
    expect(url.pathname).toBe("/v1/agents/agt_x/exec/tty");
    expect(url.searchParams.getAll("arg")).toEqual(["ls", "-la"]);
    expect(url.searchParams.getAll("env")).toEqual(["TERM=screen", "A=1"]);
    expect([url.searchParams.get("rows"), url.searchParams.get("cols"), url.searchParams.get("user")]).toEqual(["3", "4", "app"]);
    const shell = new URL(
      ttyUrl({ url: "http://x", term: undefined }, "agt_x", ["echo", "$HOME"], { shell: true, env: { TERM: "dumb" } }, { rows: 1, cols: 1 }),
    );
    expect([shell.searchParams.get("cmd"), shell.searchParams.getAll("env")]).toEqual(["echo $HOME", ["TERM=dumb"]]);
    expect(exitStatus({ code: 3, signal: null })).toBe(3);
    expect(exitStatus({ code: null, signal: "HUP" })).toBe(129);
    expect(exitStatus({ code: null, signal: "KILL" })).toBe(137);
  });

  it("the terminal is raw while it runs and restored on the way out, on exit, and on a signal (then 128+N)", () => {
    const modes: boolean[] = [];
    const stdin = { isTTY: true, setRawMode: (raw: boolean) => modes.push(raw), pause: () => undefined };
    const listeners = new Map<string, Set<() => void>>();
    const exits: number[] = [];
    const proc: GuardProcess = {
      on: (event, fn) => listeners.set(event, (listeners.get(event) ?? new Set()).add(fn)),
      off: (event, fn) => listeners.get(event)?.delete(fn),
      exit: ((code: number) => {
        exits.push(code);
      }) as GuardProcess["exit"],
    };
    const normal = new TerminalGuard(stdin, proc);
    normal.enter();
    expect([normal.isRaw, modes]).toEqual([true, [true]]);
    normal.restore();
    normal.restore();
    expect([normal.isRaw, modes]).toEqual([false, [true, false]]);
    expect([...listeners.values()].every((set) => set.size === 0)).toBe(true);

    const signalled = new TerminalGuard(stdin, proc);
    let closedSocket = false;
    signalled.onSignal = () => (closedSocket = true);
    signalled.enter();
    for (const fn of [...(listeners.get("SIGTERM") ?? [])]) fn();
    expect([modes.at(-1), closedSocket, exits]).toEqual([false, true, [143]]);

    const atExit = new TerminalGuard(stdin, proc);
    atExit.enter();
    for (const fn of [...(listeners.get("exit") ?? [])]) fn();
    expect(modes.at(-1)).toBe(false);
    expect(atExit.isRaw).toBe(false);

    const notATerminal = new TerminalGuard({ pause: () => undefined }, proc);
    notATerminal.enter();
    expect(notATerminal.isRaw).toBe(false);
    notATerminal.restore();
  });
});

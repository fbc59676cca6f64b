// Exec on a terminal through the whole system on the real qemu driver (TCG here): one all-in-one, one demo agent, Node's own WebSocket as the client.
//
// `sh` on a PTY: `tty` names a /dev/pts, `stty size` follows the size given and a resize, typed input echoes, `exit 3`
// is the exit message and a 1000 close; a client that goes away hangs its command up; refusals before the upgrade
// (no scope, an unknown agent, a bad size) are plain answers with the envelope; the audit row says tty. Then
// `agentvm exec` itself under a pseudo-terminal of ours (python3's pty): it picks the terminal, follows our size, passes
// typed input, exits with the command's status and leaves our terminal as it found it.
import { execFile, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { and, eq } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { auditLog } from "../../schema/core.ts";
import { agentvmBin } from "../helpers/cli.ts";
import { makeDriver } from "../helpers/qemu.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";

const qemuPresent = spawnSync("sh", ["-c", "command -v qemu-system-x86_64"]).status === 0;
if (!qemuPresent && process.env.CI === "true") throw new Error("CI: qemu-system-x86_64 missing (npm test provisions it: scripts/provision.ts)");

let sys: TestSystem;
let agentId: string;

beforeAll(async () => {
  if (!qemuPresent) return;
  sys = await startSystem({ driver: await makeDriver(), env: { AGENT_IDLE_TIMEOUT_MS: "600000" } });
  agentId = (await sys.createAgent()).id;
}, 180_000);

afterAll(async () => {
  await sys?.stop();
}, 120_000);

/** A terminal session: what the screen got (binary messages as text), the control messages, the close. */
interface Session {
  ws: WebSocket;
  screen(): string;
  controls: unknown[];
  closed: Promise<{ code: number; reason: string }>;
  type(text: string): void;
  /** Waits until the screen (from `from` on) matches. */
  waitFor(pattern: RegExp, from?: number, timeoutMs?: number): Promise<string>;
}

function ttyUrl(query: string): string {
  return `${sys.url.replace(/^http/, "ws")}/v1/agents/${agentId}/exec/tty?${query}`;
}

async function openTty(query: string, token = sys.demo.token): Promise<Session> {
  // Node's WebSocket (undici) takes headers besides the protocols: the bearer token as on every API call.
  const ws = new WebSocket(ttyUrl(query), { headers: { authorization: `Bearer ${token}` } } as unknown as string[]);
  ws.binaryType = "arraybuffer";
  const decoder = new TextDecoder();
  let screen = "";
  const controls: unknown[] = [];
  /** Checked on every message: a wait ends the moment its text arrives (the echo times below are not a poll's). */
  const waiters = new Set<() => void>();
  const closed = new Promise<{ code: number; reason: string }>((resolve) => ws.addEventListener("close", (e) => resolve({ code: e.code, reason: e.reason })));
  ws.addEventListener("message", (e) => {
    if (typeof e.data === "string") controls.push(JSON.parse(e.data));
    else screen += decoder.decode(new Uint8Array(e.data as ArrayBuffer), { stream: true });
    for (const check of [...waiters]) check();
  });
  await new Promise<void>((resolve, reject) => {
    ws.addEventListener("open", () => resolve(), { once: true });
    ws.addEventListener("error", () => reject(new Error("the WebSocket failed to open")), { once: true });
  });
  const encoder = new TextEncoder();
  return {
    ws,
    screen: () => screen,
    controls,
    closed,
    type: (text) => ws.send(encoder.encode(text)),
    waitFor(pattern, from = 0, timeoutMs = 20_000) {
      return new Promise<string>((resolve, reject) => {
        const check = () => {
          const m = pattern.exec(screen.slice(from));
          if (!m) return;
          done();
          resolve(m[0]);
        };
        const timer = setTimeout(() => {
          done();
          reject(new Error(`no ${pattern} on the screen: ${JSON.stringify(screen.slice(from))}`));
        }, timeoutMs);
        const done = () => {
          clearTimeout(timer);
          waiters.delete(check);
        };
        waiters.add(check);
        check();
      });
    },
  };
}

/** The upgrade by hand, for a refusal: its status and envelope. */
function refusal(path: string, token: string | undefined): Promise<{ status: number; body: { error?: { code: string; message: string } } }> {
  const url = new URL(sys.url);
  return new Promise((resolve, reject) => {
    const req = request({
      host: url.hostname,
      port: url.port,
      path,
      headers: {
        connection: "Upgrade",
        upgrade: "websocket",
        "sec-websocket-version": "13",
        "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
        ...(token ? { authorization: `Bearer ${token}` } : {}),
      },
    });
    req.on("upgrade", (_res, socket) => {
      socket.destroy();
      reject(new Error("upgraded where a refusal was expected"));
    });
    req.on("response", (res) => {
      let text = "";
      res.on("data", (d: Buffer) => (text += d.toString()));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) as { error?: { code: string; message: string } } }));
    });
    req.on("error", reject);
    req.end();
  });
}

const title = qemuPresent ? "exec on a terminal on QEMU" : "exec on a terminal on QEMU — skipped: qemu-system-x86_64 is not installed (npm run setup:vm)";
describe.skipIf(!qemuPresent)(title, () => {
  it("sh on a PTY: tty, stty size and a resize, typed input echoes, exit 3 closes 1000 with its exit", async () => {
    const t0 = Date.now();
    const s = await openTty("arg=/bin/sh&rows=24&cols=80&env=PS1%3D%24%20");
    console.log(`terminal open (agent woken from cold): ${Date.now() - t0} ms`);
    s.type("tty\n");
    expect(await s.waitFor(/\/dev\/pts\/\d+/)).toMatch(/^\/dev\/pts\/\d+$/);
    let at = s.screen().length;
    s.type("stty size; echo $TERM\n");
    await s.waitFor(/24 80\r\nxterm-256color\r\n/, at);
    at = s.screen().length;
    s.ws.send(JSON.stringify({ resize: { rows: 40, cols: 132 } }));
    s.type("stty size\n");
    await s.waitFor(/40 132\r\n/, at);
    at = s.screen().length;
    s.type("echo hel");
    // The terminal echoes what is typed before any newline: the line discipline is the guest's.
    await s.waitFor(/echo hel/, at);
    // One key at a time, each after the last one's echo: the round trip a typist feels (gateway, host, QEMU, the PTY).
    const echoes: number[] = [];
    for (const key of "abcdefghijklmnopqrst") {
      const from = s.screen().length;
      const t1 = performance.now();
      s.type(key);
      await s.waitFor(new RegExp(key), from);
      echoes.push(performance.now() - t1);
    }
    echoes.sort((a, b) => a - b);
    console.log(`keystroke echo round trip over 20 keys: p50 ${echoes[10]!.toFixed(1)} ms, max ${echoes[19]!.toFixed(1)} ms`);
    at = s.screen().length;
    s.type("\n");
    await s.waitFor(/\r\nhelabcdefghijklmnopqrst\r\n/, at);
    at = s.screen().length;
    s.type("echo hel");
    await s.waitFor(/echo hel/, at);
    s.type("lo\n");
    await s.waitFor(/echo hello\r\nhello\r\n/, at);
    s.type("exit 3\n");
    const closed = await s.closed;
    expect(closed.code).toBe(1000);
    expect(s.controls.at(-1)).toMatchObject({ exit: { code: 3, signal: null } });
  }, 120_000);

  it("a client that goes away hangs its command up (SIGHUP), and the audit row says tty", async () => {
    const s = await openTty(`cmd=${encodeURIComponent("echo started; exec sleep 7777")}&rows=10&cols=20`);
    await s.waitFor(/started/);
    s.ws.close();
    await s.closed;
    let rows: (typeof auditLog.$inferSelect)[] = [];
    const until = Date.now() + 20_000;
    while (Date.now() < until) {
      rows = await sys.database.db
        .select()
        .from(auditLog)
        .where(and(eq(auditLog.target, agentId), eq(auditLog.action, "agent.exec")));
      if (rows.some((r) => (r.detail as { signal?: string }).signal === "HUP")) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const hung = rows.find((r) => (r.detail as { argv?: string[] }).argv?.[2]?.includes("sleep 7777"));
    expect(hung?.detail).toMatchObject({ tty: true, rows: 10, cols: 20, exitCode: null, signal: "HUP" });
    expect(
      rows.find((r) => (r.detail as { argv?: string[] }).argv?.[0] === "/bin/sh" && (r.detail as { exitCode?: number }).exitCode === 3)?.detail,
    ).toMatchObject({
      tty: true,
      rows: 24,
      cols: 80,
    });
    const ps = await sys.call(`/v1/agents/${agentId}/exec`, { method: "POST", body: JSON.stringify({ cmd: "ps | grep -c '[s]leep 7777' || true" }) });
    expect(((await ps.json()) as { stdout: string }).stdout.trim()).toBe("0");
  }, 60_000);

  it("refusals come before the upgrade, with the envelope: no scope 403, an unknown agent 404, a bad size 400", async () => {
    const noExec = await sys.token({ scopes: ["agents:invoke", "agents:admin"] });
    const path = (id: string, q: string) => `/v1/agents/${id}/exec/tty?${q}`;
    const forbidden = await refusal(path(agentId, "rows=24&cols=80"), noExec);
    expect([forbidden.status, forbidden.body.error?.code]).toEqual([403, "forbidden"]);
    expect((await refusal(path(agentId, "rows=24&cols=80"), undefined)).status).toBe(401);
    const missing = await refusal(path("agt_0000000000000000", "rows=24&cols=80"), sys.demo.token);
    expect([missing.status, missing.body.error?.code]).toEqual([404, "not_found"]);
    for (const q of ["rows=0&cols=80", "rows=24&cols=100000", "rows=x&cols=80", "cols=80"]) {
      const bad = await refusal(path(agentId, q), sys.demo.token);
      expect([q, bad.status, bad.body.error?.code]).toEqual([q, 400, "bad_request"]);
    }
  }, 60_000);

  it("a program that is missing: the error message, then exit 127", async () => {
    const t0 = performance.now();
    const s = await openTty("arg=no-such-program&rows=5&cols=5");
    console.log(`terminal open on an awake agent: ${(performance.now() - t0).toFixed(1)} ms`);
    const closed = await s.closed;
    expect(closed.code).toBe(1000);
    expect(s.controls[0]).toMatchObject({ error: expect.stringMatching(/no-such-program/) });
    expect(s.controls.at(-1)).toMatchObject({ exit: { code: 127 } });
  }, 60_000);

  it("agentvm exec under a pseudo-terminal: our size, typed input, the command's status, our terminal restored", async () => {
    const home = mkdtempSync(join(tmpdir(), "h-tty-cli-"));
    // The parent of the pty: size 33x99, types a line once the command asks, prints everything, exits with the child's status.
    const driver = [
      "import os, pty, sys, fcntl, termios, struct, select",
      "pid, fd = pty.fork()",
      "if pid == 0:",
      "    os.execvp('sh', ['sh', '-c', sys.argv[1]])",
      "fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack('HHHH', 33, 99, 0, 0))",
      "out = b''",
      "typed = False",
      "while True:",
      "    r, _, _ = select.select([fd], [], [], 30)",
      "    if not r: break",
      "    try:",
      "        d = os.read(fd, 4096)",
      "    except OSError:",
      "        break",
      "    if not d: break",
      "    out += d",
      "    if not typed and b'ready' in out:",
      "        os.write(fd, b'typed words\\r')",
      "        typed = True",
      "sys.stdout.write(out.decode('utf-8', 'replace'))",
      "_, status = os.waitpid(pid, 0)",
      "sys.exit(os.waitstatus_to_exitcode(status))",
    ].join("\n");
    const remote = "tty; stty size; echo ready; read x; echo got:$x; exit 5";
    const script = `before=$(stty -g); ${JSON.stringify(process.execPath)} ${JSON.stringify(agentvmBin)} exec ${agentId} -- sh -c '${remote}'; echo "status=$?"; [ "$before" = "$(stty -g)" ] && echo restored`;
    const env = { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: home, AGENTVM_URL: sys.url, AGENTVM_TOKEN: sys.demo.token, TERM: "xterm-256color" };
    try {
      const out = await new Promise<string>((resolve, reject) =>
        execFile("python3", ["-c", driver, script], { env, timeout: 60_000 }, (err, stdout, stderr) =>
          err ? reject(new Error(`${err.message}\n${stdout}\n${stderr}`)) : resolve(stdout),
        ),
      );
      expect(out).toMatch(/\/dev\/pts\/\d+/);
      expect(out).toContain("33 99");
      expect(out).toContain("got:typed words");
      expect(out).toContain("status=5");
      expect(out).toContain("restored");
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  }, 90_000);
});

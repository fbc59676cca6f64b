// Exec and files calls through the whole system (Postgres, HTTP, the host, the process driver whose exec server is the fake one): they count against the tenant's concurrent-call limit with the calls to the agent, and a hibernate right after one is not refused.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { request, type ClientRequest } from "node:http";
import { ProcessDriver } from "../../fleet-agent/drivers/process/driver.ts";
import type { ExecTarget } from "../../fleet-agent/drivers/driver.ts";
import { startFakeExecServer, type FakeExecServer } from "../helpers/fake-exec-server.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";

/** The process driver with every VM's exec server the fake one (its commands stand for behaviours: `sleep MS`, `linger MS`…). */
class FakeExecDriver extends ProcessDriver {
  target: ExecTarget | undefined;
  override async execTarget(): Promise<ExecTarget> {
    return this.target!;
  }
}

let sys: TestSystem;
let exec: FakeExecServer;
let root: string;
const driver = new FakeExecDriver();
const limit = 2;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "exec-limits-"));
  exec = await startFakeExecServer(root);
  driver.target = { host: "127.0.0.1", port: exec.port, key: exec.key };
  sys = await startSystem({ driver, env: { TENANT_MAX_CONCURRENT: String(limit), AGENT_IDLE_TIMEOUT_MS: "600000" } });
}, 60_000);

afterAll(async () => {
  await sys?.stop();
  await exec?.close();
  if (root) rmSync(root, { recursive: true, force: true });
});

const ndjson = { "content-type": "application/json", accept: "application/x-ndjson" };

/** A streamed exec whose answer's head and first line came; `stop` goes away (the client closes the call). */
async function openExec(agentId: string, cmd: string[]): Promise<{ res: Response; stop: () => void; lines: () => Promise<string[]> }> {
  const abort = new AbortController();
  const res = await sys.call(`/v1/agents/${agentId}/exec`, { method: "POST", headers: ndjson, body: JSON.stringify({ cmd }), signal: abort.signal });
  if (res.status !== 200) throw new Error(`exec answered ${res.status}: ${await res.text()}`);
  const reader = res.body!.getReader();
  const first = await reader.read();
  expect(new TextDecoder().decode(first.value)).toContain("sleeping");
  return {
    res,
    stop: () => abort.abort(),
    async lines() {
      let text = new TextDecoder().decode(first.value);
      for (;;) {
        const next = await reader.read();
        if (next.done) break;
        text += new TextDecoder().decode(next.value);
      }
      return text.trim().split("\n");
    },
  };
}

/** Reads a streamed exec as the SDK does: line by line until the exit line, then it stops reading (the call closed). */
/** A call again while the tenant's limit refuses it (429: slots still held by calls whose end is being seen), at most 5 s. */
async function untilAdmitted(call: () => Promise<Response>): Promise<Response> {
  for (let i = 0; ; i++) {
    const res = await call();
    if (res.status !== 429 || i >= 50) return res;
    await res.body?.cancel();
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function execUntilExit(agentId: string, cmd: string[]): Promise<void> {
  const res = await sys.call(`/v1/agents/${agentId}/exec`, { method: "POST", headers: ndjson, body: JSON.stringify({ cmd }) });
  expect(res.status).toBe(200);
  const reader = res.body!.getReader();
  let text = "";
  while (!text.includes('"exit"')) {
    const next = await reader.read();
    if (next.done) throw new Error(`the stream ended without its exit: ${text}`);
    text += new TextDecoder().decode(next.value);
  }
  await reader.cancel();
}

/** A streamed exec over a raw connection, read up to its exit line; the connection is left open (the caller destroys it). */
function rawExecUntilExit(agentId: string, cmd: string[]): Promise<ClientRequest> {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify({ cmd });
    const req = request(`${sys.url}/v1/agents/${agentId}/exec`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${sys.demo.token}`,
        "content-type": "application/json",
        accept: "application/x-ndjson",
        "content-length": Buffer.byteLength(body),
      },
    });
    req.on("error", (err) => (req.destroyed ? undefined : reject(err)));
    req.on("response", (res) => {
      if (res.statusCode !== 200) return reject(new Error(`exec answered ${res.statusCode}`));
      let text = "";
      res.on("data", (chunk: Buffer) => {
        text += chunk.toString();
        if (text.includes('"exit"')) {
          res.pause();
          resolve(req);
        }
      });
      res.on("error", () => undefined);
    });
    req.end(body);
  });
}

async function code(res: Response): Promise<string> {
  return ((await res.json()) as { error: { code: string } }).error.code;
}

async function until(what: string, check: () => Promise<boolean>, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

describe("exec and files count against the tenant's concurrent-call limit", () => {
  it("two running execs take the tenant's two slots: a third exec, a files read and a call to the agent get 429 with Retry-After; a client that goes away gives its slot back", async () => {
    const { id } = await sys.createAgent({ idleTimeoutMs: 600_000 });
    const a = await openExec(id, ["sleep", "30000"]);
    const b = await openExec(id, ["sleep", "1500"]);

    const third = await sys.call(`/v1/agents/${id}/exec`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ cmd: ["echo", "x"] }),
    });
    expect(third.status).toBe(429);
    expect(third.headers.get("retry-after")).toBe("1");
    expect(await code(third)).toBe("rate_limited");
    const files = await sys.call(`/v1/agents/${id}/files?path=/`);
    expect(files.status).toBe(429);
    const proxied = await sys.call(`/a/${id}/counter`);
    expect(proxied.status).toBe(429);
    expect(await code(proxied)).toBe("rate_limited");

    // The client of `a` goes away: its slot is given back (and the command's connection ends).
    a.stop();
    await until("a's slot to be given back", async () => (await sys.call(`/a/${id}/counter`)).status === 200);
    // `b` ends by itself: its slot is given back when its answer's end is sent.
    expect((await b.lines()).at(-1)).toContain('"exit"');
    const both = await Promise.all([
      sys.call(`/v1/agents/${id}/exec`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ cmd: ["echo", "y"] }) }),
      sys.call(`/v1/agents/${id}/files?path=/`),
    ]);
    expect(both.map((r) => r.status)).toEqual([200, 200]);
    await Promise.all(both.map((r) => r.arrayBuffer()));
  }, 30_000);

  it("calls to the agent in flight take the slots an exec would need; the limit is per tenant", async () => {
    const { id } = await sys.createAgent({ idleTimeoutMs: 600_000 });
    const slow = [sys.call(`/a/${id}/slow?ms=1500`), sys.call(`/a/${id}/slow?ms=1500`)];
    await new Promise((r) => setTimeout(r, 300));
    const refused = await sys.call(`/v1/agents/${id}/processes`);
    expect(refused.status).toBe(429);
    expect(await code(refused)).toBe("rate_limited");
    // Another tenant's exec is not counted with these.
    await sys.ensureTenant("ten_limits");
    const other = await sys.token({ tenant: "ten_limits", scopes: ["agents:admin", "agents:exec"] });
    const own = await sys.createAgent({}, other);
    const theirs = await sys.call(`/v1/agents/${own.id}/processes`, { token: other });
    expect(theirs.status, await theirs.clone().text()).toBe(200);
    for (const r of await Promise.all(slow)) expect(r.status).toBe(200);
    const after = await sys.call(`/v1/agents/${id}/processes`);
    expect(after.status).toBe(200);
  }, 30_000);
});

describe("hibernate right after a call", () => {
  it("an exec read to its exit line (the SDK then stops reading), then at once hibernate: hibernated every time, never 409", async () => {
    const { id } = await sys.createAgent({ idleTimeoutMs: 600_000 });
    for (let i = 0; i < 25; i++) {
      await execUntilExit(id, ["echo", String(i)]);
      const res = await sys.call(`/v1/agents/${id}/hibernate`, { method: "POST" });
      expect(res.status, `round ${i}: ${await res.clone().text()}`).toBe(200);
      expect(((await res.json()) as { state: string }).state).toBe("hibernated");
    }
  }, 60_000);

  it("a file read whole (its Content-Length), then at once hibernate: hibernated every time", async () => {
    const { id } = await sys.createAgent({ idleTimeoutMs: 600_000 });
    // The limit is 2: a slot the test before left (its streams' ends seen a little later under load) is waited out.
    const put = await untilAdmitted(() => sys.call(`/v1/agents/${id}/files?path=/note.txt`, { method: "PUT", body: "x".repeat(200_000) }));
    expect(put.status, await put.clone().text()).toBe(201);
    for (let i = 0; i < 25; i++) {
      const read = await untilAdmitted(() => sys.call(`/v1/agents/${id}/files?path=/note.txt`));
      expect(read.status, `round ${i}: ${await read.clone().text()}`).toBe(200);
      expect((await read.arrayBuffer()).byteLength).toBe(200_000);
      const res = await sys.call(`/v1/agents/${id}/hibernate`, { method: "POST" });
      expect(res.status, `round ${i}: ${await res.clone().text()}`).toBe(200);
    }
  }, 60_000);

  it("an exec whose client has its exit line while the VM's stream ends 400 ms later: hibernate waits for it and hibernates (it was 409)", async () => {
    const { id } = await sys.createAgent({ idleTimeoutMs: 600_000 });
    for (let i = 0; i < 3; i++) {
      // A client that stops reading at the exit line, its connection left open.
      const open = await rawExecUntilExit(id, ["linger", "400"]);
      const t0 = Date.now();
      const res = await sys.call(`/v1/agents/${id}/hibernate`, { method: "POST" });
      expect(res.status, `round ${i}: ${await res.clone().text()}`).toBe(200);
      expect(((await res.json()) as { state: string }).state).toBe("hibernated");
      expect(Date.now() - t0).toBeLessThan(2000);
      open.destroy();
    }
  }, 30_000);

  it("a command genuinely running keeps the 409", async () => {
    const { id } = await sys.createAgent({ idleTimeoutMs: 600_000 });
    const running = await openExec(id, ["sleep", "20000"]);
    const t0 = Date.now();
    const res = await sys.call(`/v1/agents/${id}/hibernate`, { method: "POST" });
    expect(res.status).toBe(409);
    expect(await code(res)).toBe("conflict");
    expect(Date.now() - t0).toBeLessThan(5000);
    running.stop();
  }, 30_000);
});

// Agent logs end to end over real sockets (process driver): `GET /v1/agents/{id}/logs` as text and as events, follows
// that see new lines within a second and never wake the agent, rotation under a follow, the CLI, and through a remote host.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { systemClock } from "../../lib/clock.ts";
import { componentKey } from "../../lib/host-token.ts";
import { silentLogger } from "../../lib/log.ts";
import { tenants } from "../../schema/core.ts";
import { ensureDevKeys, mintToken } from "../../compose/dev-keys.ts";
import { parseStandaloneGatewayConfig, startGateway, type StandaloneGateway } from "../../compose/standalone-gateway.ts";
import { createDbPlacement, type Placement } from "../../gateway/placement.ts";
import { createRemoteFleet } from "../../gateway/remote-fleet.ts";
import { freshDatabase } from "../helpers/db.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";
import { repoRoot, startHostInProcess, testComponentSecret, waitFor, type InProcessHost } from "../helpers/worker-stack.ts";

const LOG_LIMIT = 512 << 10;
const printer = [process.execPath, fileURLToPath(new URL("../helpers/workloads/printer.ts", import.meta.url))];

/** Reads a streaming body as it comes: `until(text)` waits for `text` and answers how long it took. */
function streamReader(res: Response) {
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  const state = { text: "", done: false };
  // biome-ignore lint/correctness/noUnusedVariables: ??= reads it: the pump starts once, at the first read
  let pump: Promise<void> | undefined;
  const read = async () => {
    for (;;) {
      const next = await reader.read();
      if (next.done) {
        state.done = true;
        return;
      }
      state.text += decoder.decode(next.value, { stream: true });
    }
  };
  return {
    state,
    start() {
      pump ??= read().catch(() => void (state.done = true));
      return this;
    },
    async until(want: string | RegExp, ms = 5000): Promise<number> {
      this.start();
      const t0 = Date.now();
      // A string is looked for only in what came since the last look (a follow's text grows to megabytes).
      let seen = 0;
      const has = () => {
        if (typeof want !== "string") return want.test(state.text);
        const found = state.text.indexOf(want, Math.max(0, seen - want.length)) >= 0;
        seen = state.text.length;
        return found;
      };
      while (!has()) {
        if (state.done) throw new Error(`stream ended before ${want}; got ${JSON.stringify(state.text.slice(-500))}`);
        if (Date.now() - t0 > ms) throw new Error(`${want} not read within ${ms} ms; got ${JSON.stringify(state.text.slice(-500))}`);
        await new Promise((r) => setTimeout(r, 5));
      }
      return Date.now() - t0;
    },
    async ended(ms = 5000): Promise<void> {
      this.start();
      await waitFor(() => state.done, ms, "the end of the stream");
    },
    cancel: () => reader.cancel().catch(() => undefined),
  };
}

/** Events of a Server-Sent Events text: each one's `data` lines joined. Comments and empty events left out. */
function parseEvents(text: string): string[] {
  const events: string[] = [];
  for (const block of text.split("\n\n")) {
    const data = block
      .split("\n")
      .filter((l) => l.startsWith("data:"))
      .map((l) => l.slice(5).replace(/^ /, ""));
    if (data.length > 0) events.push(data.join("\n"));
  }
  return events;
}

describe("agent logs in one process (gateway + host)", () => {
  let sys: TestSystem;
  let agentId: string;

  const logs = (id: string, query = "", init: RequestInit & { token?: string } = {}) => sys.call(`/v1/agents/${id}/logs${query}`, init);
  const print = async (id: string, query: string) => {
    const res = await sys.call(`/a/${id}/print?${query}`, { method: "POST" });
    expect(res.status).toBe(200);
    await res.text();
  };

  beforeAll(async () => {
    // A log limit of 512 KiB (default 4 MiB): rotation needs 10 000 lines, not 80 000, which a loaded machine streams in time.
    sys = await startSystem({ images: { printer }, env: { LOG_MAX_BYTES: String(LOG_LIMIT) } });
    agentId = (await sys.createAgent({ image: "printer" })).id;
    await print(agentId, "text=hello-log");
    await print(agentId, "text=to-stderr&stream=stderr");
  }, 60_000);
  afterAll(async () => {
    await sys?.stop();
  });

  it("GET …/logs answers the agent's output as chunked text/plain", async () => {
    const res = await logs(agentId);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("text/plain; charset=utf-8");
    expect(res.headers.get("content-length")).toBeNull();
    expect(res.headers.get("x-request-id")).toMatch(/^req_/);
    const text = await res.text();
    expect(text).toMatch(/^printer listening on 127\.0\.0\.1:\d+\nhello-log\nto-stderr\n$/);
    // ?tail cuts from the end, at a line start: the last two lines only.
    expect(await (await logs(agentId, "?tail=20")).text()).toBe("hello-log\nto-stderr\n");
    expect(await (await logs(agentId, "?tail=0")).text()).toBe("");
  });

  it("?follow=true gets a line printed after the request started within a second, and does not wake a hibernated agent", async () => {
    const res = await logs(agentId, "?follow=true&tail=0");
    expect(res.status).toBe(200);
    const reader = streamReader(res).start();
    await new Promise((r) => setTimeout(r, 200));
    const printedAt = Date.now();
    await print(agentId, "text=late-line");
    await reader.until("late-line\n", 1000);
    expect(Date.now() - printedAt).toBeLessThan(1000);
    // A few more, at times that do not line up with the host's polls: how long a line takes to reach the client.
    const latencies: number[] = [];
    for (let i = 0; i < 10; i++) {
      await new Promise((r) => setTimeout(r, 37 * i));
      const t0 = Date.now();
      await print(agentId, `text=sample-${i}`);
      await reader.until(`sample-${i}\n`, 1000);
      latencies.push(Date.now() - t0);
    }
    latencies.sort((a, b) => a - b);
    console.log(`follow latency over 10 lines, print call start → line read by the client: median ${latencies[5]} ms, max ${latencies[9]} ms`);
    reader.state.text = reader.state.text.replace(/(sample-\d\n)+/, "");

    // Hibernated: the follow waits (nothing printed, nothing woken); the next call wakes the agent and its output arrives.
    const hib = await sys.call(`/v1/agents/${agentId}/hibernate`, { method: "POST" });
    expect(((await hib.json()) as { state: string }).state).toBe("hibernated");
    const wakes = await sys.wakes(agentId);
    const other = streamReader(await logs(agentId, "?follow=true&tail=0")).start();
    await new Promise((r) => setTimeout(r, 1500));
    expect(await sys.state(agentId)).toBe("hibernated");
    expect(await sys.wakes(agentId)).toBe(wakes);
    expect(other.state.text).toBe("");
    expect(other.state.done).toBe(false);
    await print(agentId, "text=after-wake");
    await other.until("after-wake\n", 1000);
    await reader.until("after-wake\n", 1000);
    expect(reader.state.text).toBe("late-line\nafter-wake\n");
    await other.cancel();
    await reader.cancel();
  });

  it("answers Server-Sent Events when Accept asks for them: one data field per line", async () => {
    const res = await logs(agentId, "?tail=1000000", { headers: { accept: "text/event-stream" } });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("text/event-stream; charset=utf-8");
    const text = await res.text();
    expect(text.endsWith("\n\n")).toBe(true);
    const events = parseEvents(text);
    expect(events[0]).toMatch(/^printer listening on/);
    expect(events.slice(1, 3)).toEqual(["hello-log", "to-stderr"]);

    const follow = streamReader(await logs(agentId, "?follow=1&tail=0", { headers: { accept: "text/event-stream" } })).start();
    await new Promise((r) => setTimeout(r, 100));
    await print(agentId, "text=event-line");
    await follow.until("data: event-line\n\n", 1000);
    expect(parseEvents(follow.state.text)).toEqual(["event-line"]);
    await follow.cancel();
  });

  it("another tenant's agent is 404, bad parameters are 400 with the error envelope, the scope is agents:admin", async () => {
    const otherToken = await sys.token({ tenant: "ten_other" });
    await sys.database.db.insert(tenants).values({ id: "ten_other", name: "Other" }).onConflictDoNothing();
    const theirs = await sys.createAgent({ image: "printer" }, otherToken);
    const notFound = await logs(theirs.id);
    expect(notFound.status).toBe(404);
    expect(((await notFound.json()) as { error: { code: string } }).error.code).toBe("not_found");
    expect((await logs(theirs.id, "", { token: otherToken })).status).toBe(200); // it exists for its own tenant

    for (const query of ["?tail=abc", "?tail=-1", "?tail=1.5", "?tail=99999999999", "?follow=maybe"]) {
      const res = await logs(agentId, query);
      expect(res.status, query).toBe(400);
      const body = (await res.json()) as { error: { code: string; message: string; requestId: string } };
      expect(body.error.code).toBe("bad_request");
      expect(body.error.requestId).toMatch(/^req_/);
    }
    const badId = await logs("agt_../../etc");
    expect([400, 404]).toContain(badId.status);
    expect((await logs("not-an-id")).status).toBe(400);
    const invokeOnly = await sys.token({ scopes: ["agents:invoke"] });
    expect((await logs(agentId, "", { token: invokeOnly })).status).toBe(403);
    expect((await logs(agentId, "", { token: "" })).status).toBe(401);
  });

  it("an agent that never ran has an empty log; a follow waits for its first run", async () => {
    const fresh = (await sys.createAgent({ image: "printer" })).id;
    const res = await logs(fresh);
    expect(res.status).toBe(200);
    expect(await res.text()).toBe("");
    const follow = streamReader(await logs(fresh, "?follow=true")).start();
    await new Promise((r) => setTimeout(r, 300));
    expect(await sys.state(fresh)).toBe("creating"); // the follow woke nothing
    await print(fresh, "text=first-words");
    await follow.until("first-words\n", 3000); // the route asks the fleet again every second
    expect(follow.state.text).toMatch(/^printer listening on .*\nfirst-words\n$/);
    await follow.cancel();
  });

  it("a log past its limit is rotated on read and by the host's timer under a follow: the tail spans both files, the follow loses and repeats nothing", async () => {
    const id = (await sys.createAgent({ image: "printer" })).id;
    const logPath = join(sys.dataDir, "hosts", sys.host.hostId, "vms", id, "workload.log");
    const line = (i: number) => `line ${i} ${"x".repeat(64 - `line ${i} `.length - 1)}`;
    const n = 10_000; // 10 000 lines × 64 bytes = 640 kB, past LOG_LIMIT
    await print(id, `lines=${n}&width=64`);
    expect(existsSync(`${logPath}.1`)).toBe(false);
    // Read at once (before the host's next look, at most 2 s away): the read rotates it, and the tail spans both files.
    expect(await (await logs(id, "?tail=130")).text()).toBe(`${line(n - 1)}\n${line(n)}\n`); // 2 bytes of line n-2 cut off
    expect(existsSync(`${logPath}.1`)).toBe(true);
    expect(statSync(logPath).size).toBe(0);
    await print(id, "text=after-first-rotation");
    expect(await (await logs(id, "?tail=150")).text()).toBe(`${line(n - 1)}\n${line(n)}\nafter-first-rotation\n`);

    const follow = streamReader(await logs(id, "?follow=true&tail=0")).start();
    await new Promise((r) => setTimeout(r, 100));
    const firstGeneration = statSync(`${logPath}.1`).ino;
    await print(id, `lines=${n}&width=64&from=${n + 1}`);
    await follow.until(`line ${2 * n} `, 20_000);
    await waitFor(() => statSync(`${logPath}.1`).ino !== firstGeneration, 5000, "the host's rotation"); // its timer: every 2 s by default
    await print(id, "text=after-rotation");
    await follow.until("after-rotation\n", 2000);
    const got = follow.state.text.split("\n").filter(Boolean);
    expect(got.length).toBe(n + 1);
    for (let i = 0; i < n; i++) if (got[i] !== line(n + 1 + i)) throw new Error(`line ${n + 1 + i} is ${got[i]!.slice(0, 20)}`);
    expect(got[n]).toBe("after-rotation");
    await follow.cancel();
  }, 60_000);

  it("a follow ends when the agent is deleted", async () => {
    const id = (await sys.createAgent({ image: "printer" })).id;
    await print(id, "text=doomed");
    const follow = streamReader(await logs(id, "?follow=true")).start();
    await follow.until("doomed\n");
    expect((await sys.call(`/v1/agents/${id}`, { method: "DELETE" })).status).toBe(200);
    await follow.ended(3000);
  });

  describe("npm run logs", () => {
    const cli = (args: string[], env: Record<string, string>) => {
      const child = spawn(process.execPath, ["scripts/logs.ts", ...args], {
        cwd: repoRoot,
        env: { ...process.env, ...env },
        stdio: ["ignore", "pipe", "pipe"],
      });
      const out = { stdout: "", stderr: "" };
      child.stdout.on("data", (d: Buffer) => (out.stdout += d.toString()));
      child.stderr.on("data", (d: Buffer) => (out.stderr += d.toString()));
      const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
      return { child, out, exited };
    };

    it("prints the log and exits 0; refuses a bad token with the envelope's message and exit 1", async () => {
      await print(agentId, "text=for-the-cli");
      const ok = cli([agentId, "--tail", "20"], { AGENTVM_URL: sys.url, AGENTVM_TOKEN: sys.demo.token });
      expect(await ok.exited).toBe(0);
      expect(ok.out.stdout).toBe("for-the-cli\n");
      const all = cli([agentId, "--tail", "1000000"], { AGENTVM_URL: sys.url, AGENTVM_TOKEN: sys.demo.token });
      expect(await all.exited).toBe(0);
      expect(all.out.stdout).toMatch(/^printer listening on .*\nhello-log\nto-stderr\n(.*\n)*for-the-cli\n$/);
      const bad = cli([agentId], { AGENTVM_URL: sys.url, AGENTVM_TOKEN: "nope" });
      expect(await bad.exited).toBe(1);
      expect(bad.out.stderr).toMatch(/logs: 401 unauthorized/);
      const none = cli([agentId], { AGENTVM_URL: sys.url, AGENTVM_TOKEN: "" });
      expect(await none.exited).toBe(2);
      expect(none.out.stderr).toMatch(/AGENTVM_TOKEN is not set/);
    });

    it("--follow prints new lines as they come and exits 0 on Ctrl-C", async () => {
      const run = cli([agentId, "--follow", "--tail", "0"], { AGENTVM_URL: sys.url, AGENTVM_TOKEN: sys.demo.token });
      await new Promise((r) => setTimeout(r, 800)); // the CLI starts and connects
      await print(agentId, "text=cli-follow");
      await waitFor(() => run.out.stdout.includes("cli-follow\n"), 3000, "the CLI printing the line");
      expect(run.out.stdout).toBe("cli-follow\n");
      run.child.kill("SIGINT");
      expect(await run.exited).toBe(0);
    });
  });
});

describe("a follow at shutdown", () => {
  it("does not hold up the stop of the whole system: it is cut, and ends", async () => {
    const sys = await startSystem({ images: { printer } });
    const id = (await sys.createAgent({ image: "printer" })).id;
    await (await sys.call(`/a/${id}/print?text=bye`, { method: "POST" })).text();
    const follow = streamReader(await sys.call(`/v1/agents/${id}/logs?follow=true`)).start();
    await follow.until("bye\n");
    const started = Date.now();
    await sys.stop();
    const stopMs = Date.now() - started;
    console.log(`stop with a follow open: ${stopMs} ms`);
    expect(stopMs).toBeLessThan(5000);
    await follow.ended(2000);
  }, 60_000);
});

describe("agent logs through a remote host (gateway → host ingress)", () => {
  let database: Awaited<ReturnType<typeof freshDatabase>>;
  let host: InProcessHost;
  let gateway: StandaloneGateway;
  let token: string;
  let gatewayDir: string;

  beforeAll(async () => {
    database = await freshDatabase();
    await database.db.insert(tenants).values({ id: "ten_logs", name: "logs" });
    host = await startHostInProcess(database, { images: { printer } });
    gatewayDir = mkdtempSync(join(tmpdir(), "agentvm-gw-"));
    const keys = await ensureDevKeys(gatewayDir);
    gateway = await startGateway(
      parseStandaloneGatewayConfig({
        DATABASE_URL: database.url,
        COMPONENT_SECRET: testComponentSecret,
        DATA_DIR: gatewayDir,
        PORT: "0",
        AGENT_IMAGES: "printer",
        PLACEMENT_CACHE_MS: "0",
      }),
      { log: silentLogger, database },
    );
    token = await mintToken(keys.privateJwk, { tenant: "ten_logs", scopes: ["agents:invoke", "agents:admin"] });
  }, 60_000);
  afterAll(async () => {
    await gateway?.stop();
    await host?.stop();
    await database?.close();
    if (gatewayDir) rmSync(gatewayDir, { recursive: true, force: true });
  });

  const call = (path: string, init: RequestInit = {}) =>
    fetch(gateway.url + path, { ...init, headers: { authorization: `Bearer ${token}`, ...(init.headers as Record<string, string>) } });

  it("reads and follows the agent's log on its host, over undici and over fetch", async () => {
    const created = await call("/v1/agents", { method: "POST", body: JSON.stringify({ image: "printer" }), headers: { "content-type": "application/json" } });
    expect(created.status).toBe(201);
    const id = ((await created.json()) as { id: string }).id;
    expect(await (await call(`/v1/agents/${id}/logs`)).text()).toBe(""); // not placed yet: no host has it

    expect((await call(`/a/${id}/print?text=remote-hello`, { method: "POST" })).status).toBe(200);
    const res = await call(`/v1/agents/${id}/logs`);
    expect(res.status).toBe(200);
    expect(await res.text()).toMatch(/^printer listening on .*\nremote-hello\n$/);

    const follow = streamReader(await call(`/v1/agents/${id}/logs?follow=true&tail=0`)).start();
    await new Promise((r) => setTimeout(r, 200));
    const printedAt = Date.now();
    await (await call(`/a/${id}/print?text=remote-late`, { method: "POST" })).text();
    await follow.until("remote-late\n", 1000);
    console.log(`remote follow latency: ${Date.now() - printedAt} ms (gateway → ingress → host)`);
    await follow.cancel();

    // The web remote fleet (fetch, as on Workers) against the same ingress.
    const fleet = createRemoteFleet({
      placement: createDbPlacement(database.db, { liveWindowMs: 30_000, cacheTtlMs: 0, clock: systemClock }),
      key: componentKey(testComponentSecret),
      log: silentLogger,
    });
    const body = await fleet.logs(id, { tailBytes: 13, follow: false });
    expect(await new Response(body).text()).toBe("remote-late\n");
    const abort = new AbortController();
    const followed = streamReader(new Response(await fleet.logs(id, { tailBytes: 0, follow: true, signal: abort.signal }))).start();
    await (await call(`/a/${id}/print?text=via-fetch`, { method: "POST" })).text();
    await followed.until("via-fetch\n", 1000);
    abort.abort();
    await followed.ended(2000);
    expect(await fleet.logs("agt_neverplaced1234", { tailBytes: 10, follow: false })).toBeUndefined();
  });

  it("the host ingress answers 204 for an agent it does not have, and a 404 for another tenant's agent at the gateway", async () => {
    const here = { id: host.hostId, url: host.url, live: true, generation: 0 };
    const placement: Placement = {
      hostFor: async () => here,
      currentHost: async () => here,
      currentHosts: async (ids) => new Map(ids.map((id) => [id, here])),
      forget: () => undefined,
    };
    const fleet = createRemoteFleet({ placement, key: componentKey(testComponentSecret), log: silentLogger });
    expect(await fleet.logs("agt_notonthishost99", { tailBytes: 10, follow: true })).toBeUndefined();
    await database.db.insert(tenants).values({ id: "ten_logs_other", name: "other" }).onConflictDoNothing();
    const keys = await ensureDevKeys(gatewayDir);
    const otherToken = await mintToken(keys.privateJwk, { tenant: "ten_logs_other", scopes: ["agents:admin"] });
    const created = await fetch(`${gateway.url}/v1/agents`, {
      method: "POST",
      body: JSON.stringify({ image: "printer" }),
      headers: { "content-type": "application/json", authorization: `Bearer ${otherToken}` },
    });
    const theirs = ((await created.json()) as { id: string }).id;
    expect((await call(`/v1/agents/${theirs}/logs`)).status).toBe(404);
    // A bad parameter is refused before the agent is looked up: the same 400 for theirs and for one that does not exist.
    const bad = await call(`/v1/agents/${theirs}/logs?tail=abc`);
    const none = await call(`/v1/agents/agt_doesnotexist00000/logs?tail=abc`);
    expect([bad.status, none.status]).toEqual([400, 400]);
    expect(((await bad.json()) as { error: { message: string } }).error.message).toBe(((await none.json()) as { error: { message: string } }).error.message);
  });
});

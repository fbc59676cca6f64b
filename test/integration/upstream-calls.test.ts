// The egress proxy's upstream path over real sockets and real Postgres: a fake model server on loopback (plain HTTP,
// reachable only because EGRESS_ALLOW names it; TLS is not exercised here), a client speaking to the VM's unix socket
// as the guest's relay does. The secret header reaches the model and never the client; every call is an operation
// row (timings, bytes, model, tokens) with an audit entry; an Idempotency-Key replay answers the recorded body without
// a second call; a different request under the same key is 409; bad input gets its status and the envelope; a VM
// without egress reaches its upstreams and nothing else.
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, request, type IncomingMessage, type Server } from "node:http";
import { connect, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eq } from "drizzle-orm";
import { systemClock } from "../../lib/clock.ts";
import { createLogger } from "../../lib/log.ts";
import { importSealKey } from "../../lib/seal.ts";
import { createDbAuditLog } from "../../schema/audit-log.ts";
import { auditLog } from "../../schema/core.ts";
import { operations } from "../../schema/operations.ts";
import { parseEgressConfig } from "../../fleet-agent/egress/config.ts";
import type { ExchangeObserver } from "../../fleet-agent/egress/exchanges.ts";
import { EgressProxy } from "../../fleet-agent/egress/proxy.ts";
import { type BodyKeeper, UpstreamCalls } from "../../fleet-agent/egress/upstreams.ts";
import { createBodyKeeper } from "../../fleet-agent/upstreams/bodies.ts";
import { createUpstreamDirectory } from "../../fleet-agent/upstreams/directory.ts";
import { createOperationJournal } from "../../fleet-agent/upstreams/journal.ts";
import { createUpstreamStore } from "../../gateway/upstreams/store.ts";
import { freshDatabase } from "../helpers/db.ts";

const SECRET = "sk-host-only-0123456789";
const dir = mkdtempSync(join(tmpdir(), "upstream-calls-"));
let database: Awaited<ReturnType<typeof freshDatabase>>;
let model: Server;
let modelPort: number;
let closedPort: number;
let proxy: EgressProxy;
const seen: { method: string; url: string; headers: IncomingMessage["headers"]; body: string }[] = [];
const events: string[] = [];
/** Every line the upstream path and the proxy log, at debug: a secret must be in none. */
const logLines: string[] = [];
const log = createLogger({ level: "debug", write: (line) => void logLines.push(line) });

/** The fake model: an OpenAI-style JSON completion, an Anthropic-style SSE stream (chunks 20 ms apart), a big body, one that never answers. */
function modelServer(): Server {
  return createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString();
      seen.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body });
      if (req.url === "/v1/never") return; // never answers
      if (req.url === "/v1/big") return res.end("z".repeat(40_000));
      if (req.url === "/v1/messages") {
        res.writeHead(200, { "content-type": "text/event-stream", "x-model-server": "yes" });
        const ev = (type: string, data: unknown) => `event: ${type}\ndata: ${JSON.stringify(data)}\n\n`;
        const parts = [
          ev("message_start", { type: "message_start", message: { model: "claude-test", usage: { input_tokens: 11, output_tokens: 1 } } }),
          ev("content_block_delta", { type: "content_block_delta", delta: { text: "Hel" } }),
          ev("content_block_delta", { type: "content_block_delta", delta: { text: "lo" } }),
          ev("message_delta", { type: "message_delta", usage: { output_tokens: 22 } }),
          ev("message_stop", { type: "message_stop" }),
        ];
        let i = 0;
        const next = () => (i < parts.length ? (res.write(parts[i++]), setTimeout(next, 20)) : res.end());
        return next();
      }
      const n = seen.length;
      res.writeHead(200, { "content-type": "application/json", "x-call": String(n) });
      res.end(JSON.stringify({ id: `cmpl-${n}`, model: "gpt-test", echo: body, usage: { prompt_tokens: 5, completion_tokens: 7 } }));
    });
  });
}

const recorder: ExchangeObserver = {
  waiting: (vm, id) => void events.push(`waiting ${vm} ${id}`),
  answer: (vm, id) => void events.push(`answer ${vm} ${id}`),
  ended: (vm, id) => void events.push(`ended ${vm} ${id}`),
};

beforeAll(async () => {
  database = await freshDatabase();
  model = modelServer();
  modelPort = await new Promise<number>((r) => model.listen(0, "127.0.0.1", () => r((model.address() as AddressInfo).port)));
  const closed = createServer();
  closedPort = await new Promise<number>((r) => closed.listen(0, "127.0.0.1", () => r((closed.address() as AddressInfo).port)));
  closed.close();
  const rawKey = crypto.getRandomValues(new Uint8Array(32));
  const key = () => importSealKey(rawKey);
  const store = createUpstreamStore(database.db, createDbAuditLog(database.db), key);
  const by = { actor: "test", requestId: null };
  await store.create("ten_a", { name: "model", baseUrl: `http://127.0.0.1:${modelPort}`, headers: { Authorization: `Bearer ${SECRET}` } }, by, new Date());
  await store.create("ten_a", { name: "refused", baseUrl: `http://127.0.0.1:${closedPort + 1}`, headers: {} }, by, new Date());
  await store.create("ten_b", { name: "other", baseUrl: `http://127.0.0.1:${modelPort}`, headers: {} }, by, new Date());
  const config = parseEgressConfig({
    EGRESS_ALLOW: `127.0.0.1:${modelPort}`,
    // Short for the test of an upstream that never answers, yet not so short that a loaded machine trips it.
    UPSTREAM_TIMEOUT_MS: "2000",
    UPSTREAM_MAX_BODY_BYTES: "65536",
    UPSTREAM_KEEP_BODY_BYTES: "16384",
  });
  const owners: Record<string, { agentId: string; tenantId: string; runId: string }> = {
    vm_a: { agentId: "agt_a", tenantId: "ten_a", runId: "run_1" },
    vm_out: { agentId: "agt_out", tenantId: "ten_a", runId: "run_2" },
  };
  const calls = new UpstreamCalls({
    config: config.upstreams,
    owner: (vmId) => owners[vmId],
    directory: createUpstreamDirectory({ db: database.db, key, clock: systemClock, cacheMs: 1000 }),
    journal: createOperationJournal(database.db),
    bodies: keeping(createBodyKeeper({ store: undefined, dataDir: dir, scratchDir: join(dir, "scratch") })),
    spoolDir: join(dir, "spool"),
    hostId: "host_t",
    clock: systemClock,
    log,
  });
  proxy = new EgressProxy(config, { upstreams: calls, exchanges: recorder, log });
  await proxy.listen("vm_a", join(dir, "a.sock"), { egress: false });
  await proxy.listen("vm_out", join(dir, "out.sock"), { egress: true });
});

afterAll(async () => {
  await proxy?.close();
  model?.close();
  // A body is kept after its answer has gone to the agent: one still being written would land in a removed directory.
  await Promise.allSettled(keeps);
  await database?.close();
  rmSync(dir, { recursive: true, force: true });
});

/** Bodies being kept, for afterAll to wait on. */
const keeps = new Set<Promise<unknown>>();
function keeping(bodies: BodyKeeper): BodyKeeper {
  return {
    ...bodies,
    keep(file) {
      const kept = bodies.keep(file);
      keeps.add(kept);
      return kept;
    },
  };
}

interface Answer {
  status: number;
  headers: IncomingMessage["headers"];
  raw: string;
  body: string;
}

/** One HTTP request on the VM's socket, as the guest's relay hands it over. */
function guestCall(vm: string, path: string, opts: { method?: string; body?: string; headers?: Record<string, string> } = {}): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request(
      { socketPath: join(dir, `${vm}.sock`), path, method: opts.method ?? "POST", headers: { host: "10.0.2.100:3128", ...opts.headers } },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          const body = Buffer.concat(chunks).toString();
          resolve({ status: res.statusCode ?? 0, headers: res.headers, raw: JSON.stringify(res.rawHeaders) + body, body });
        });
      },
    );
    req.on("error", reject);
    req.end(opts.body);
  });
}

const json = { "content-type": "application/json", authorization: "Bearer agent-own-token" };
const opRow = async (id: string) => (await database.db.select().from(operations).where(eq(operations.id, id)))[0]!;
const errorOf = (a: Answer) => (JSON.parse(a.body) as { error: { code: string; message: string; requestId: string } }).error;

describe("a call through an upstream", () => {
  it("adds the secret header (the agent's own of that name dropped), never shows it to the guest, and records the operation", async () => {
    const before = seen.length;
    const a = await guestCall("a", "/u/model/v1/chat/completions?x=1", { body: '{"q":1}', headers: json });
    expect(a.status, a.body).toBe(200);
    const upstreamSaw = seen[before]!;
    expect(upstreamSaw.url).toBe("/v1/chat/completions?x=1");
    expect(upstreamSaw.headers.authorization).toBe(`Bearer ${SECRET}`);
    expect(upstreamSaw.headers.host).toBe(`127.0.0.1:${modelPort}`);
    expect(upstreamSaw.body).toBe('{"q":1}');
    expect(a.raw).not.toContain(SECRET);
    expect(JSON.parse(a.body)).toMatchObject({ model: "gpt-test", echo: '{"q":1}' });
    const opId = a.headers["x-agentvm-operation"] as string;
    expect(opId).toMatch(/^op_/);

    // The row is finished just after the answer's end.
    await waitFor(async () => (await opRow(opId)).state !== "in_flight");
    const row = await opRow(opId);
    expect(row).toMatchObject({
      tenantId: "ten_a",
      agentId: "agt_a",
      runId: "run_1",
      hostId: "host_t",
      upstream: "model",
      method: "POST",
      path: "/v1/chat/completions?x=1",
      mode: "sync",
      state: "succeeded",
      status: 200,
      requestBytes: 7,
      responseBytes: Buffer.byteLength(a.body),
      model: "gpt-test",
      inputTokens: 5,
      outputTokens: 7,
      idempotencyKey: null,
    });
    expect(row.requestHash).toMatch(/^[0-9a-f]{64}$/);
    expect(row.sentAt!.getTime()).toBeLessThanOrEqual(row.firstByteAt!.getTime());
    expect(row.firstByteAt!.getTime()).toBeLessThanOrEqual(row.endedAt!.getTime());
    expect(row.requestBody).toMatch(/^sha256:/);
    expect(row.responseBody).toMatch(/^sha256:/);
    expect(JSON.stringify(row)).not.toContain(SECRET);

    const audit = await database.db.select().from(auditLog).where(eq(auditLog.target, opId));
    expect(audit).toHaveLength(1);
    expect(audit[0]).toMatchObject({ actor: "agt_a", action: "upstream.call", tenantId: "ten_a" });
    expect(audit[0]!.detail).toEqual({ upstream: "model", method: "POST", path: "/v1/chat/completions?x=1", state: "succeeded", status: 200 });

    // The exchange observer saw it wait, answer and end.
    const mine = events.filter((e) => e.endsWith(opId));
    expect(mine[0]).toBe(`waiting vm_a ${opId}`);
    expect(mine.filter((e) => e.startsWith("answer")).length).toBeGreaterThanOrEqual(2); // the head and the body
    expect(mine.at(-1)).toBe(`ended vm_a ${opId}`);
  });

  it("streams an SSE answer chunk by chunk and reads an Anthropic-style usage from it", async () => {
    const t0 = performance.now();
    const arrivals: number[] = [];
    const opId = await new Promise<string>((resolve, reject) => {
      const req = request({ socketPath: join(dir, "a.sock"), path: "/u/model/v1/messages", method: "POST", headers: json }, (res) => {
        res.on("data", () => arrivals.push(performance.now() - t0));
        res.on("end", () => resolve(res.headers["x-agentvm-operation"] as string));
      });
      req.on("error", reject);
      req.end("{}");
    });
    expect(arrivals.length).toBeGreaterThanOrEqual(3); // not gathered into one write: it streamed
    expect(arrivals.at(-1)! - arrivals[0]!).toBeGreaterThan(40);
    await waitFor(async () => (await opRow(opId)).state !== "in_flight");
    expect(await opRow(opId)).toMatchObject({ state: "succeeded", model: "claude-test", inputTokens: 11, outputTokens: 22 });
  });
});

describe("Idempotency-Key", () => {
  it("a repeat with the same key and request is answered from the record (the model saw one call); another request under it is 409", async () => {
    const before = seen.length;
    const headers = { ...json, "idempotency-key": "turn-42" };
    const first = await guestCall("a", "/u/model/v1/chat/completions", { body: '{"q":"once"}', headers });
    expect(first.status).toBe(200);
    const opId = first.headers["x-agentvm-operation"] as string;
    await waitFor(async () => (await opRow(opId)).state === "succeeded");
    const again = await guestCall("a", "/u/model/v1/chat/completions", { body: '{"q":"once"}', headers });
    expect(again.status).toBe(200);
    expect(again.body).toBe(first.body);
    expect(again.headers["x-agentvm-replayed"]).toBe(opId);
    expect(again.headers["x-call"]).toBe(first.headers["x-call"]); // the recorded headers
    expect(seen.length - before).toBe(1);

    const other = await guestCall("a", "/u/model/v1/chat/completions", { body: '{"q":"different"}', headers });
    expect(other.status).toBe(409);
    expect(errorOf(other).code).toBe("idempotency_conflict");
    expect(seen.length - before).toBe(1);
    expect(await opRow(opId)).toMatchObject({ idempotencyKey: "turn-42", attempts: 1 });
  });

  it("while the first is in flight: 409 idempotency_in_flight with Retry-After; a first whose body was not kept: 409 saying so", async () => {
    const headers = { ...json, "idempotency-key": "slow-1" };
    const slow = guestCall("a", "/u/model/v1/never", { body: "{}", headers });
    await waitFor(async () => (await database.db.select().from(operations).where(eq(operations.idempotencyKey, "slow-1"))).length === 1);
    const during = await guestCall("a", "/u/model/v1/never", { body: "{}", headers });
    expect(during.status).toBe(409);
    expect(errorOf(during).code).toBe("idempotency_in_flight");
    expect(during.headers["retry-after"]).toBe("1");
    expect((await slow).status).toBe(504);

    const big = { ...json, "idempotency-key": "big-1" };
    const first = await guestCall("a", "/u/model/v1/big", { body: "{}", headers: big });
    expect(first.body).toHaveLength(40_000);
    await waitFor(async () => (await opRow(first.headers["x-agentvm-operation"] as string)).state === "succeeded");
    expect((await opRow(first.headers["x-agentvm-operation"] as string)).responseBody).toBeNull();
    const again = await guestCall("a", "/u/model/v1/big", { body: "{}", headers: big });
    expect(again.status).toBe(409);
    expect(errorOf(again).message).toMatch(/not kept/);
  });
});

describe("bad input: a clear status and the envelope", () => {
  it.each([
    ["an unknown upstream", "/u/nope/v1/x", {}, undefined, 404, "upstream_not_found"],
    ["another tenant's upstream", "/u/other/v1/x", {}, undefined, 404, "upstream_not_found"],
    ["a malformed Idempotency-Key", "/u/model/v1/x", { "idempotency-key": "" }, undefined, 400, "bad_request"],
    ["a path that climbs out", "/u/model/v1/../../admin", {}, undefined, 400, "bad_request"],
    ["a body over UPSTREAM_MAX_BODY_BYTES", "/u/model/v1/x", {}, "x".repeat(70_000), 413, "payload_too_large"],
    ["an upstream policy refuses (not in EGRESS_ALLOW)", "/u/refused/v1/x", {}, undefined, 403, "forbidden"],
  ])("%s", async (_what, path, headers, body, status, code) => {
    const before = seen.length;
    const a = await guestCall("a", path, { headers: { ...json, ...headers }, ...(body !== undefined ? { body } : {}) });
    expect(a.status, a.body).toBe(status);
    expect(errorOf(a).code).toBe(code);
    expect(errorOf(a).requestId).toMatch(/^req_/);
    expect(seen.length).toBe(before);
  });

  it("an upstream that never answers: 504 after UPSTREAM_TIMEOUT_MS, the operation failed", async () => {
    const t0 = performance.now();
    const a = await guestCall("a", "/u/model/v1/never", { body: "{}", headers: json });
    expect(a.status).toBe(504);
    expect(errorOf(a).code).toBe("gateway_timeout");
    expect(performance.now() - t0).toBeGreaterThan(1900);
    const rows = await database.db.select().from(operations).where(eq(operations.path, "/v1/never"));
    await waitFor(async () => (await database.db.select().from(operations).where(eq(operations.state, "failed"))).length >= rows.length);
    const failed = (await database.db.select().from(operations).where(eq(operations.state, "failed"))).find((r) => r.idempotencyKey === null);
    expect(failed).toMatchObject({ status: null, error: { code: "gateway_timeout" } });
  });
});

describe("a VM without egress", () => {
  it("is refused CONNECT and absolute-form (403, pointing at /u/<name>), and reaches its upstream", async () => {
    const connectAnswer = await new Promise<string>((resolve) => {
      const s = connect(join(dir, "a.sock"));
      let got = "";
      s.on("data", (d) => (got += d.toString()));
      s.on("close", () => resolve(got));
      s.write(`CONNECT 127.0.0.1:${modelPort} HTTP/1.1\r\nHost: x\r\n\r\n`);
    });
    expect(connectAnswer).toMatch(/^HTTP\/1\.1 403/);
    expect(connectAnswer).toContain("http://10.0.2.100:3128/u/<name>");
    const absolute = await guestCall("a", `http://127.0.0.1:${modelPort}/v1/chat/completions`, { body: "{}", headers: json });
    expect(absolute.status).toBe(403);
    expect(errorOf(absolute).message).toMatch(/no egress/);
    // Absolute form naming the proxy itself (a client that went through HTTP_PROXY anyway) is the upstream path.
    const viaProxyName = await guestCall("a", "http://10.0.2.100:3128/u/model/v1/chat/completions", { body: "{}", headers: json });
    expect(viaProxyName.status).toBe(200);
  });

  it("a VM with egress still tunnels (where policy allows) and reaches its upstreams too", async () => {
    const answer = await new Promise<string>((resolve) => {
      const s = connect(join(dir, "out.sock"));
      let got = "";
      s.on("data", (d) => {
        got += d.toString();
        if (got.includes("\r\n\r\n")) s.destroy();
      });
      s.on("close", () => resolve(got));
      s.write(`CONNECT 127.0.0.1:${modelPort} HTTP/1.1\r\nHost: x\r\n\r\n`);
    });
    expect(answer).toMatch(/^HTTP\/1\.1 200/);
    expect((await guestCall("out", "/u/model/v1/chat/completions", { body: "{}", headers: json })).status).toBe(200);
  });
});

async function waitFor(check: () => Promise<boolean>, ms = 5000): Promise<void> {
  const until = performance.now() + ms;
  while (!(await check())) {
    if (performance.now() > until) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe("the log", () => {
  it("says what each call did and never holds a secret header's value", () => {
    expect(logLines.length).toBeGreaterThan(5);
    expect(logLines.some((l) => l.includes("upstream call"))).toBe(true);
    expect(logLines.filter((l) => l.includes(SECRET))).toEqual([]);
  });
});

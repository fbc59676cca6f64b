// `Prefer: respond-async` through the egress proxy's upstream path on real sockets and real Postgres: answered 202 at
// once, made by the host's runner (the secret added then), delivered to the agent's callback path by the webhook
// worker and readable at /operations/<id>; an Idempotency-Key queues once; and a runner killed with SIGKILL in the
// middle of an upstream's answer loses nothing: another takes the calls over, repeating only what may be repeated.
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, request, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eq } from "drizzle-orm";
import { systemClock, type Clock } from "../../lib/clock.ts";
import { silentLogger } from "../../lib/log.ts";
import { importSealKey } from "../../lib/seal.ts";
import { createDbAuditLog } from "../../schema/audit-log.ts";
import { operations } from "../../schema/operations.ts";
import { parseEgressConfig } from "../../fleet-agent/egress/config.ts";
import { EgressProxy } from "../../fleet-agent/egress/proxy.ts";
import { UpstreamSlot } from "../../fleet-agent/egress/upstreams.ts";
import { serveUpstreams } from "../../fleet-agent/upstreams/serve.ts";
import { createDbAsyncOperationStore } from "../../fleet-agent/operations/async-store.ts";
import { createDeliveryWorker } from "../../gateway/webhooks/worker.ts";
import { defaultWebhookConfig } from "../../gateway/webhooks/types.ts";
import { createUpstreamStore } from "../../gateway/upstreams/store.ts";
import { freshDatabase } from "../helpers/db.ts";
import { fetchForward, seedAgent, startAgentServer, type AgentServer } from "../helpers/webhook-fixtures.ts";
import { spawnNode } from "../helpers/worker-stack.ts";

const SECRET = "sk-async-host-only-42";
const dir = mkdtempSync(join(tmpdir(), "upstream-async-"));
const rawKey = crypto.getRandomValues(new Uint8Array(32));
let database: Awaited<ReturnType<typeof freshDatabase>>;
let model: Server;
let modelPort: number;
let proxy: EgressProxy;
let agentServer: AgentServer;
let agent: { tenantId: string; agentId: string };
let stopRunner: () => Promise<void>;
const seen: { url: string; headers: IncomingMessage["headers"]; body: string }[] = [];
/** Calls to /v1/hold answer their head and a first chunk, then hold the rest until released. */
const held: (() => void)[] = [];

beforeAll(async () => {
  database = await freshDatabase({ maxConnections: 8 });
  model = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      seen.push({ url: req.url ?? "", headers: req.headers, body: Buffer.concat(chunks).toString() });
      res.writeHead(200, { "content-type": "application/json" });
      const answer = JSON.stringify({ model: "gpt-test", echo: Buffer.concat(chunks).toString(), usage: { prompt_tokens: 3, completion_tokens: 4 } });
      if (req.url === "/v1/hold" && held.length < 2) {
        res.write(answer.slice(0, 5));
        held.push(() => res.end(answer.slice(5)));
        return;
      }
      res.end(answer);
    });
  });
  modelPort = await new Promise<number>((r) => model.listen(0, "127.0.0.1", () => r((model.address() as AddressInfo).port)));
  agent = await seedAgent(database.db);
  const store = createUpstreamStore(database.db, createDbAuditLog(database.db), () => importSealKey(rawKey));
  await store.create(
    agent.tenantId,
    { name: "model", baseUrl: `http://127.0.0.1:${modelPort}`, headers: { Authorization: `Bearer ${SECRET}` } },
    { actor: "test", requestId: null },
    new Date(),
  );
  const config = parseEgressConfig({ EGRESS_ALLOW: `127.0.0.1:${modelPort}`, UPSTREAM_KEEP_BODY_BYTES: "4096" });
  const slot = new UpstreamSlot();
  proxy = new EgressProxy(config, { upstreams: slot });
  await proxy.listen("vm_a", join(dir, "a.sock"), { egress: false });
  const { runner } = serveUpstreams(
    { slot, config: config.upstreams, key: rawKey, destination: (h, p) => proxy.destination(h, p) },
    {
      db: database.db,
      owner: (vmId) => (vmId === "vm_a" ? { ...agent, runId: "run_1" } : undefined),
      hostId: "host_a",
      dataDir: dir,
      artifactStoreDir: undefined,
      clock: systemClock,
      log: silentLogger,
    },
  );
  runner.start();
  stopRunner = () => runner.stop();
  agentServer = await startAgentServer([200]);
});

afterAll(async () => {
  await stopRunner?.();
  await proxy?.close();
  await agentServer?.close();
  model?.close();
  await database?.close();
  rmSync(dir, { recursive: true, force: true });
});

/** A request from the guest, over the VM's unix socket as its relay sends it. */
function guest(
  method: string,
  path: string,
  headers: Record<string, string> = {},
  body?: string,
): Promise<{ status: number; headers: IncomingMessage["headers"]; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ socketPath: join(dir, "a.sock"), method, path, headers: { host: "10.0.2.100:3128", ...headers } }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() }));
    });
    req.once("error", reject);
    req.end(body);
  });
}

async function outcome(id: string, timeoutMs = 10_000): Promise<{ status: number; headers: IncomingMessage["headers"]; body: string }> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const r = await guest("GET", `/operations/${id}`);
    if (r.status !== 202 || Date.now() > until) return r;
    await new Promise((res) => setTimeout(res, 50));
  }
}

describe("async upstream calls", () => {
  it("answers 202 at once, makes the call with the secret, and gives the outcome at /operations/<id> and to the callback path", async () => {
    const queued = await guest("POST", "/u/model/v1/chat", { prefer: "respond-async", "content-type": "application/json" }, '{"q":1}');
    expect(queued.status).toBe(202);
    expect(queued.headers["preference-applied"]).toBe("respond-async");
    const { operationId } = JSON.parse(queued.body) as { operationId: string };
    expect(operationId).toMatch(/^op_/);
    const done = await outcome(operationId);
    expect(done.status).toBe(200);
    expect(JSON.parse(done.body)).toMatchObject({ echo: '{"q":1}' });
    expect(done.headers["x-agentvm-operation-id"]).toBe(operationId);
    const call = seen.find((s) => s.body === '{"q":1}')!;
    expect(call.headers.authorization).toBe(`Bearer ${SECRET}`);
    expect(call.headers.prefer).toBeUndefined();
    const row = (await database.db.select().from(operations).where(eq(operations.id, operationId)))[0]!;
    expect(row).toMatchObject({ mode: "async", state: "succeeded", status: 200, model: "gpt-test", inputTokens: 3, outputTokens: 4 });
    expect(JSON.stringify(row)).not.toContain(SECRET);

    const worker = createDeliveryWorker({
      db: database.db,
      clock: systemClock,
      log: silentLogger,
      forward: fetchForward(agentServer.url),
      config: defaultWebhookConfig,
    });
    expect(await worker.runOnce()).toBe(1);
    const delivered = agentServer.seen.at(-1)!;
    expect(delivered.url).toBe(`/.agentvm/operations/${operationId}`);
    expect(JSON.parse(new TextDecoder().decode(delivered.body))).toMatchObject({ echo: '{"q":1}' });
  });

  it("an Idempotency-Key queues once; another request under it is 409; bad input is refused", async () => {
    const headers = { prefer: "respond-async", "idempotency-key": "async-1", "content-type": "application/json" };
    const a = await guest("POST", "/u/model/v1/chat", headers, '{"q":2}');
    const b = await guest("POST", "/u/model/v1/chat", headers, '{"q":2}');
    expect(a.status).toBe(202);
    expect(b.status).toBe(202);
    expect(JSON.parse(b.body).operationId).toBe(JSON.parse(a.body).operationId);
    const c = await guest("POST", "/u/model/v1/chat", headers, '{"q":"other"}');
    expect(c.status).toBe(409);
    expect(JSON.parse(c.body).error.code).toBe("idempotency_conflict");
    const big = await guest("POST", "/u/model/v1/chat", { prefer: "respond-async" }, "x".repeat(5000));
    expect(big.status).toBe(413);
    expect((await guest("GET", "/operations/op_doesnotexist1")).status).toBe(404);
    expect((await guest("POST", "/u/nosuch/v1", { prefer: "respond-async" }, "{}")).status).toBe(404);
    await outcome(JSON.parse(a.body).operationId);
    expect(seen.filter((s) => s.body === '{"q":2}')).toHaveLength(1);
  });

  it("a runner killed with SIGKILL mid-answer loses nothing: the keyed call is made again, the unkeyed POST fails as interrupted", async () => {
    await stopRunner(); // only the child makes calls now
    const store = createDbAsyncOperationStore(database.db);
    const base = {
      tenantId: agent.tenantId,
      agentId: agent.agentId,
      runId: null,
      hostId: "host_a",
      upstream: "model",
      method: "POST",
      path: "/v1/hold",
      requestHeaders: [["content-type", "application/json"]] as [string, string][],
      requestBody: null,
      requestBytes: 0,
      deadlineAt: new Date(Date.now() + 600_000),
      createdAt: new Date(),
    };
    const keyed = (await store.enqueue({ ...base, requestHash: "k", idempotencyKey: "crash-1" })).row;
    const bare = (await store.enqueue({ ...base, requestHash: "b", idempotencyKey: null })).row;
    const before = seen.length;
    const child = await spawnNode(
      "test/helpers/async-runner-child.ts",
      { DB_URL: database.url, DATA_DIR: dir, EGRESS_ALLOW: `127.0.0.1:${modelPort}`, KEY_HEX: Buffer.from(rawKey).toString("hex") },
      /runner ready/,
    );
    const until = Date.now() + 10_000;
    while (held.length < 2 && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    expect(held, child.output()).toHaveLength(2); // both calls reached the model, which has started answering
    const exited = new Promise((r) => child.proc.once("exit", r));
    child.proc.kill("SIGKILL");
    await exited;
    for (const release of held) release();
    expect((await store.read(agent.agentId, keyed.id))?.row.state).toBe("in_flight");

    // Another host, once the dead one's claims have lapsed (its clock 31 s on).
    const later: Clock = { ...systemClock, now: () => Date.now() + 31_000 };
    const slot = new UpstreamSlot();
    const { runner } = serveUpstreams(
      { slot, config: parseEgressConfig({ EGRESS_ALLOW: `127.0.0.1:${modelPort}` }).upstreams, key: rawKey, destination: (h, p) => proxy.destination(h, p) },
      { db: database.db, owner: () => undefined, hostId: "host_b", dataDir: dir, artifactStoreDir: undefined, clock: later, log: silentLogger },
    );
    expect(await runner.runOnce()).toBe(2);
    expect(seen.length - before).toBe(3); // the two the dead host made, and the keyed one again
    expect((await store.read(agent.agentId, keyed.id))?.row).toMatchObject({ state: "succeeded", status: 200, attempts: 2 });
    const failed = (await store.read(agent.agentId, bare.id))!;
    expect(failed.row).toMatchObject({ state: "failed", attempts: 2 });
    expect(failed.row.error?.message).toMatch(/interrupted/);
    expect(failed.outcome).toBeDefined(); // its delivery is queued: the agent is told
  });
});

// At-least-once across gateway crashes: intake + worker in a child process, kill -9 at the worst moments, start another.
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { eq } from "drizzle-orm";
import { webhookAttempts, webhookDeliveries } from "../../schema/webhooks.ts";
import { freshDatabase } from "../helpers/db.ts";
import { seedAgent, seedEndpoint, standardHeaders, startAgentServer, type AgentServer } from "../helpers/webhook-fixtures.ts";

const script = fileURLToPath(new URL("../helpers/webhook-process.ts", import.meta.url));
let database: Awaited<ReturnType<typeof freshDatabase>>;
const children: ChildProcess[] = [];
const servers: AgentServer[] = [];

beforeAll(async () => {
  database = await freshDatabase();
});
afterEach(async () => {
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  for (const s of servers.splice(0)) await s.close();
});
afterAll(async () => {
  await database?.close();
});

/** Starts the webhook process and resolves with its port once it listens. */
function startGateway(env: Record<string, string>): Promise<{ child: ChildProcess; port: number; workerId: string }> {
  const child = spawn(process.execPath, [script], { env: { ...process.env, DATABASE_URL: database.url, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  return new Promise((resolve, reject) => {
    let out = "";
    let err = "";
    child.stderr!.on("data", (d: Buffer) => (err += d.toString()));
    child.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
      const m = /LISTENING (\d+) (\S+)/.exec(out);
      if (m) resolve({ child, port: Number(m[1]), workerId: m[2]! });
    });
    child.once("exit", (code, signal) => reject(new Error(`webhook process exited (${code ?? signal}) before listening: ${err}`)));
  });
}

function kill9(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    child.once("exit", () => resolve());
    child.kill("SIGKILL");
  });
}

async function postWebhook(port: number, agentId: string, endpoint: { name: string; secret: string }, body: string) {
  const headers = await standardHeaders(endpoint.secret, body, { timestampS: Math.floor(Date.now() / 1000) });
  const res = await fetch(`http://127.0.0.1:${port}/hooks/${agentId}/${endpoint.name}`, { method: "POST", headers, body });
  expect(res.status).toBe(202);
  return ((await res.json()) as { deliveryId: string }).deliveryId;
}

async function waitFor(what: string, check: () => Promise<boolean>, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const status = async (id: string) => (await database.db.select().from(webhookDeliveries).where(eq(webhookDeliveries.id, id)))[0]?.status;

describe("crash between storing and delivering", () => {
  it("a delivery stored by a process killed before its worker ran is delivered, once, by the next process", async () => {
    const agentSrv = await startAgentServer([200]);
    servers.push(agentSrv);
    const agent = await seedAgent(database.db);
    const endpoint = await seedEndpoint(database.db, agent, { name: "crash1" });

    const first = await startGateway({ AGENT_URL: agentSrv.url, WEBHOOK_WORKER: "off" });
    const deliveryId = await postWebhook(first.port, agent.agentId, endpoint, '{"before":"crash"}');
    await kill9(first.child);
    expect(agentSrv.seen).toHaveLength(0);
    expect(await status(deliveryId)).toBe("pending");

    await startGateway({ AGENT_URL: agentSrv.url, WEBHOOK_WORKER: "on", WEBHOOK_POLL_INTERVAL_MS: "100" });
    await agentSrv.received(1, 15_000);
    await waitFor("delivered", async () => (await status(deliveryId)) === "delivered");
    await new Promise((r) => setTimeout(r, 300)); // time for a duplicate to show up, if there were one
    expect(agentSrv.seen).toHaveLength(1);
    expect(agentSrv.seen[0]!.headers["x-webhook-delivery-id"]).toBe(deliveryId);
    expect(Buffer.from(agentSrv.seen[0]!.body).toString()).toBe('{"before":"crash"}');
  });

  it("a process killed mid-attempt leaves a lease that expires; the next process delivers the same delivery id", async () => {
    // The first call hangs (the agent is slow and the process dies meanwhile); later calls succeed.
    const agentSrv = await startAgentServer(["hang", 200]);
    servers.push(agentSrv);
    const agent = await seedAgent(database.db);
    const endpoint = await seedEndpoint(database.db, agent, { name: "crash2" });
    const limits = { WEBHOOK_ATTEMPT_TIMEOUT_MS: "1000", WEBHOOK_LEASE_MS: "1500", WEBHOOK_POLL_INTERVAL_MS: "100" };

    const first = await startGateway({ AGENT_URL: agentSrv.url, ...limits });
    const deliveryId = await postWebhook(first.port, agent.agentId, endpoint, '{"mid":"attempt"}');
    await agentSrv.received(1);
    await kill9(first.child);
    expect(await status(deliveryId)).toBe("in_flight");

    const second = await startGateway({ AGENT_URL: agentSrv.url, ...limits });
    await waitFor("delivered", async () => (await status(deliveryId)) === "delivered");
    expect(agentSrv.seen.length).toBeGreaterThanOrEqual(2);
    for (const s of agentSrv.seen) expect(s.headers["x-webhook-delivery-id"]).toBe(deliveryId);

    const log = await database.db.select().from(webhookAttempts).where(eq(webhookAttempts.deliveryId, deliveryId)).orderBy(webhookAttempts.attempt);
    expect(log[0]).toMatchObject({ worker: first.workerId, outcome: "lease_expired" });
    expect(log.at(-1)).toMatchObject({ worker: second.workerId, outcome: "ok", statusCode: 200 });
  });
});

// The proxy's timeouts leave out the time an agent's VM dozes (fleet-agent/host/doze.ts), on real sockets: a host core
// whose fake driver "pauses" a VM served by a real HTTP server on loopback, the local fleet's forward (what the host
// ingress runs for a remote gateway, with the gateway's limits) and the Node fast path over it. An answer later than the
// response timeout is cut when the VM ran all along, and delivered when the VM dozed while its outbound call waited.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loopbackDriver } from "../helpers/loopback-driver.ts";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { generateKeyPair, exportJWK, type JWK } from "jose";
import { systemClock } from "../../lib/clock.ts";
import { silentLogger } from "../../lib/log.ts";
import { openDatabase, type Database } from "../../schema/db.ts";
import { createDbAuditLog } from "../../schema/audit-log.ts";
import { createGateway } from "../../gateway/app.ts";
import { createAgentRepo } from "../../gateway/agents/repo.ts";
import { createJwtAuthenticator } from "../../gateway/auth.ts";
import { createAgentSettingsStore } from "../../gateway/proxy/agents.ts";
import { createProxyCore, defaultProxyConfig } from "../../gateway/proxy/core.ts";
import { createNodeProxy } from "../../gateway/node/fast-path/handler.ts";
import { fromPrivateJwk, mintToken } from "../../compose/dev-keys.ts";
import { Host, vmIdFor } from "../../fleet-agent/host.ts";
import { createLocalFleet, type LocalFleet } from "../../fleet-agent/local-fleet.ts";
import { createMemoryHostStore } from "../../fleet-agent/store.ts";
import type { VmDriver } from "../../fleet-agent/drivers/driver.ts";
import type { AgentSpec } from "../../contracts/agent.ts";

const RESPONSE_TIMEOUT_MS = 400;
const ANSWER_AFTER_MS = 1200;

let agentServer: Server;
let agentPort: number;
let host: Host;
let fleet: LocalFleet;
const pauses: string[] = [];

/** A driver whose VMs are one HTTP server on loopback; pause and resume only count (the server answers regardless). */
const countingDriver = (): VmDriver =>
  loopbackDriver(() => agentPort, {
    pause: async (v) => void pauses.push(`pause ${v.spec.vmId}`),
    resume: async (v) => {
      pauses.push(`resume ${v.spec.vmId}`);
      return { clockFixMs: 0 };
    },
  });

beforeAll(async () => {
  agentServer = createServer((req, res) => {
    const ms = Number(new URL(req.url ?? "/", "http://x").searchParams.get("ms") ?? 0);
    setTimeout(() => res.end("done"), ms);
  });
  await new Promise<void>((r) => agentServer.listen(0, "127.0.0.1", r));
  agentPort = (agentServer.address() as AddressInfo).port;
  host = new Host({
    config: {
      hostId: "host_dt",
      vmsDir: "/nonexistent/agentvm-doze-timeouts",
      wakeQueueLimit: 10,
      wakeDeadlineMs: 5000,
      reaperIntervalMs: 60_000,
      cpuBusyThreshold: 0.2,
      drainTimeoutMs: 0,
      doze: { afterMs: 100, maxMs: 60_000 },
    },
    driver: countingDriver(),
    store: createMemoryHostStore(),
    clock: systemClock,
    log: silentLogger,
    activity: { active: () => {}, inactive: () => {} },
  });
  fleet = createLocalFleet(host, silentLogger);
});

afterAll(async () => {
  await fleet?.close();
  await host?.stop();
  await new Promise<void>((r) => agentServer.close(() => r()));
});

const spec = (id: string): AgentSpec => ({
  id,
  tenantId: "ten_a",
  image: "demo",
  vcpus: 1,
  memMiB: 256,
  idleTimeoutMs: 60_000,
  streamIdleMs: 60_000,
  allowEgress: true,
});

/** While `call` runs, the agent makes an outbound call that stays unanswered (its VM dozes), ended when the call is over. */
async function withModelCallWaiting<T>(agentId: string, call: () => Promise<T>): Promise<T> {
  const vmId = vmIdFor(agentId);
  const started = call();
  // The call has its hold once the VM is running: then the agent's outbound call goes out.
  for (let i = 0; i < 100 && host.status(agentId)?.state !== "running"; i++) await new Promise((r) => setTimeout(r, 5));
  host.exchanges.waiting(vmId, "model");
  try {
    return await started;
  } finally {
    await host.exchanges.answer(vmId, "model");
    host.exchanges.ended(vmId, "model");
  }
}

describe("the local fleet's forward with the gateway's limits (what a host's ingress runs)", () => {
  const limits = { responseTimeoutMs: RESPONSE_TIMEOUT_MS, proxyIdleTimeoutMs: 60_000 };
  const forward = (agentId: string) =>
    fleet.forward(spec(agentId), new Request(`http://agent/slow?ms=${ANSWER_AFTER_MS}`), { requestId: "req_dt1", reason: "request", limits });

  it("cuts an answer later than the response timeout when the VM ran all along (504)", async () => {
    await expect(forward("agt_dtlocal01")).rejects.toMatchObject({ code: "gateway_timeout" });
  });

  it("delivers it when the VM dozed while its outbound call waited: dozed time is not waiting time", async () => {
    const agentId = "agt_dtlocal02";
    const res = await withModelCallWaiting(agentId, () => forward(agentId));
    expect(res.status).toBe(200);
    expect(await res.text()).toBe("done");
    expect(pauses).toContain(`pause ${vmIdFor(agentId)}`);
  });
});

describe("the Node fast path beside the host", () => {
  let database: Database;
  let privateJwk: JWK;
  let server: Server;
  let base: string;
  let token: string;

  beforeAll(async () => {
    database = await openDatabase({ pgliteMemory: true });
    const { privateKey } = await generateKeyPair("ES256", { extractable: true });
    privateJwk = { ...(await exportJWK(privateKey)), kid: "k1" };
    const repo = createAgentRepo(database.db);
    await repo.ensureTenant("ten_a", "A");
    const auth = createJwtAuthenticator({ keys: { jwks: fromPrivateJwk(privateJwk).jwks }, issuer: "agentvm-dev", audience: "agentvm", algorithms: ["ES256"] });
    const proxyConfig = { ...defaultProxyConfig, responseTimeoutMs: RESPONSE_TIMEOUT_MS };
    const settings = createAgentSettingsStore(database.db);
    const app = createGateway({
      agents: repo,
      fleet,
      audit: createDbAuditLog(database.db),
      auth,
      log: silentLogger,
      config: {
        domain: undefined,
        maxBodyBytes: 1000,
        maxApiBodyBytes: 10_000,
        images: ["demo"],
        agentDefaults: { vcpus: 1, memMiB: 256, idleTimeoutMs: 60_000, streamIdleMs: 60_000 },
        proxy: proxyConfig,
      },
      settings,
    });
    token = await mintToken(privateJwk, { tenant: "ten_a", scopes: ["agents:invoke", "agents:admin"] });
    const core = createProxyCore({ agents: repo, fleet, log: silentLogger, maxBodyBytes: 1000, proxy: proxyConfig, settings });
    const proxy = createNodeProxy({ core, fleet, auth, domain: undefined, log: silentLogger });
    server = createServer((req, res) => {
      if (!proxy.handle(req, res, false)) res.writeHead(404).end();
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const created = await app.request("/v1/agents", { method: "POST", body: JSON.stringify({ public: true }), headers: { authorization: `Bearer ${token}` } });
    expect(created.status).toBe(201);
    agentIds.push(((await created.json()) as { id: string }).id);
    const second = await app.request("/v1/agents", { method: "POST", body: JSON.stringify({ public: true }), headers: { authorization: `Bearer ${token}` } });
    agentIds.push(((await second.json()) as { id: string }).id);
  });
  afterAll(async () => {
    await new Promise<void>((r) => server.close(() => r()));
    await database?.close();
  });
  const agentIds: string[] = [];

  it("504 when the VM ran all along", async () => {
    const res = await fetch(`${base}/a/${agentIds[0]}/slow?ms=${ANSWER_AFTER_MS}`);
    expect(res.status).toBe(504);
  });

  it("the answer when the VM dozed meanwhile", async () => {
    const agentId = agentIds[1]!;
    const res = await withModelCallWaiting(agentId, () => fetch(`${base}/a/${agentId}/slow?ms=${ANSWER_AFTER_MS}`));
    expect(res.status).toBe(200);
    expect(await res.text()).toBe("done");
    expect(pauses).toContain(`pause ${vmIdFor(agentId)}`);
  });
});

// GET /metrics scraped over real sockets (process driver, real Postgres): the all-in-one's one registry, then a host
// daemon's ingress and a standalone gateway over it, each behind its own METRICS_TOKEN; a wake moves the histograms.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { and, eq } from "drizzle-orm";
import { silentLogger } from "../../lib/log.ts";
import { vmEvents, tenants } from "../../schema/core.ts";
import { ProcessDriver } from "../../fleet-agent/drivers/process/driver.ts";
import { parseDaemonConfig, startFleetAgent, type FleetAgentDaemon } from "../../compose/fleet-agent.ts";
import { parseStandaloneGatewayConfig, startGateway, type StandaloneGateway } from "../../compose/standalone-gateway.ts";
import { ensureDevKeys, mintToken } from "../../compose/dev-keys.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";
import { freshDatabase } from "../helpers/db.ts";
import { testComponentSecret } from "../helpers/worker-stack.ts";
import { waitFor } from "../helpers/wait.ts";
import { openWebSocket } from "../helpers/streams.ts";

type Sample = (series: string) => number | undefined;

/** One scrape: the answer, and the value of a sample line (`name{labels}` exactly as rendered). */
async function scrape(url: string, token: string | undefined): Promise<{ res: Response; text: string; m: Sample }> {
  const res = await fetch(`${url}/metrics`, { headers: token === undefined ? {} : { authorization: `Bearer ${token}` } });
  const text = await res.text();
  const m: Sample = (series) => {
    const line = text.split("\n").find((l) => l.startsWith(`${series} `));
    return line === undefined ? undefined : Number(line.slice(series.length + 1));
  };
  return { res, text, m };
}

/** Refusals are the one error envelope. */
async function expectRefused(url: string, token: string | undefined, status: number, code: string): Promise<{ message: string }> {
  const { res, text } = await scrape(url, token);
  expect(res.status).toBe(status);
  const body = JSON.parse(text) as { error: { code: string; message: string; requestId: string } };
  expect(body.error.code).toBe(code);
  expect(body.error.requestId).toMatch(/^req_/);
  return body.error;
}

const num = (v: number | undefined) => v ?? 0;

describe("the all-in-one: one registry and one /metrics for its gateway and host", () => {
  const metricsToken = "all-in-one-metrics-token-0123";
  let sys: TestSystem;

  beforeAll(async () => {
    sys = await startSystem({ env: { METRICS_TOKEN: metricsToken } });
  });
  afterAll(async () => {
    await sys?.stop();
  });

  it("401 without the token, with another one or with a tenant's token; 200 Prometheus text with it", async () => {
    await expectRefused(sys.url, undefined, 401, "unauthorized");
    await expectRefused(sys.url, "not-the-metrics-token-at-all", 401, "unauthorized");
    await expectRefused(sys.url, sys.demo.token, 401, "unauthorized"); // tenant auth does not open it
    const { res, text, m } = await scrape(sys.url, metricsToken);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/^text\/plain; version=0\.0\.4/);
    expect(text).toContain("# TYPE agentvm_wake_seconds histogram");
    expect(text).toMatch(/^process_resident_memory_bytes \d+/m);
    // States read at scrape time, from the host, its meter and the webhook worker's queue in Postgres.
    expect(m("agentvm_vms_awake")).toBe(0);
    expect(m("agentvm_meter_spool_segments")).toBeGreaterThanOrEqual(0);
    expect(m("agentvm_meter_shipping_lag_seconds")).toBeGreaterThanOrEqual(0);
    expect(m("agentvm_webhook_queue_depth")).toBe(0);
  });

  it("a call that boots its agent moves the wake counters and histograms, the 2xx calls and the awake gauge; hibernating and waking again too", async () => {
    const before = (await scrape(sys.url, metricsToken)).m;
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    const first = await sys.call(`/a/${agent.id}/counter`, { method: "POST" });
    expect(first.status).toBe(200);
    expect(first.headers.get("x-wake")).toBe("boot");
    await first.text();

    // The first byte is recorded as the answer goes out: wait for it rather than race it.
    await waitFor(
      async () =>
        num((await scrape(sys.url, metricsToken)).m('agentvm_wake_first_byte_seconds_count{mode="boot"}')) >
        num(before('agentvm_wake_first_byte_seconds_count{mode="boot"}')),
      5000,
      "first byte observed",
    );
    let m = (await scrape(sys.url, metricsToken)).m;
    const moved = (series: string) => num(m(series)) - num(before(series));
    expect(moved('agentvm_wakes_total{mode="boot",reason="request"}')).toBe(1);
    expect(moved('agentvm_wake_seconds_count{mode="boot"}')).toBe(1);
    expect(moved("agentvm_wake_boot_seconds_count")).toBe(1);
    expect(moved('agentvm_wake_queue_seconds_count{mode="boot"}')).toBe(1);
    expect(moved('agentvm_wake_first_byte_seconds_count{mode="boot"}')).toBe(1);
    expect(m('agentvm_wake_first_byte_seconds_sum{mode="boot"}')).toBeGreaterThan(0);
    expect(moved('agentvm_proxied_calls_total{status_class="2xx"}')).toBe(1);
    expect(m("agentvm_vms_awake")).toBe(1);

    // A 404 of the gateway's own (no such agent) is a proxied call of class 4xx, and wakes nothing.
    expect((await sys.call("/a/agt_doesnotexist0/", {})).status).toBe(404);
    m = (await scrape(sys.url, metricsToken)).m;
    expect(moved('agentvm_proxied_calls_total{status_class="4xx"}')).toBe(1);

    const hib = await sys.call(`/v1/agents/${agent.id}/hibernate`, { method: "POST" });
    expect(await hib.json()).toMatchObject({ state: "hibernated" });
    m = (await scrape(sys.url, metricsToken)).m;
    expect(moved('agentvm_snapshot_seconds_count{reason="api"}')).toBe(1);
    // The bytes the event log says the snapshot wrote (what billing prices; a frozen process writes none).
    await sys.host.flush();
    const [event] = await sys.database.db
      .select()
      .from(vmEvents)
      .where(and(eq(vmEvents.agentId, agent.id), eq(vmEvents.toState, "hibernated")));
    expect(event?.timings?.snapshotBytes).toBeTypeOf("number");
    expect(moved("agentvm_snapshot_bytes_total")).toBe(event!.timings!.snapshotBytes);
    expect(m("agentvm_vms_awake")).toBe(0);
    expect(m("agentvm_vms_hibernated")).toBe(1);

    const woke = await sys.call(`/a/${agent.id}/counter`, { method: "POST" });
    expect(woke.headers.get("x-wake")).toBe("restore");
    expect(await woke.json()).toEqual({ count: 2 });
    m = (await scrape(sys.url, metricsToken)).m;
    expect(moved('agentvm_wakes_total{mode="restore",reason="request"}')).toBe(1);
    expect(moved("agentvm_wake_restore_seconds_count")).toBe(1);
    expect(moved("agentvm_wake_clock_fix_seconds_count")).toBe(1);
    expect(moved('agentvm_proxied_calls_total{status_class="2xx"}')).toBe(2);
    expect(m("agentvm_vms_awake")).toBe(1);
    expect(m("agentvm_vms_hibernated")).toBe(0);
  });

  it("a WebSocket upgrade is counted once it closes, by the status it was answered (101, or a refusal)", async () => {
    const before = (await scrape(sys.url, metricsToken)).m;
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    const wsUrl = `${sys.url.replace(/^http/, "ws")}/a/${agent.id}/ws/echo`;
    const { ws, response } = await openWebSocket(wsUrl, { authorization: `Bearer ${sys.demo.token}` });
    expect(response.statusCode).toBe(101);
    const refused = await openWebSocket(wsUrl, { authorization: "Bearer not-a-jwt" }).then(
      () => undefined,
      (err: { status?: number }) => err.status,
    );
    expect(refused).toBe(401);
    const closed = new Promise((done) => ws.once("close", done));
    ws.close(1000, "done");
    await closed;
    const moved = async (series: string) => num((await scrape(sys.url, metricsToken)).m(series)) - num(before(series));
    await waitFor(async () => (await moved('agentvm_proxied_calls_total{status_class="1xx"}')) === 1, 5000, "the 101 counted");
    expect(await moved('agentvm_proxied_calls_total{status_class="4xx"}')).toBe(1);
    expect(await moved('agentvm_wakes_total{mode="boot",reason="request"}')).toBe(1);
  });
});

describe("a host daemon's ingress and a standalone gateway over it: each its own /metrics and token", () => {
  const hostToken = "host-metrics-token-0123456789";
  const gatewayToken = "gateway-metrics-token-0123456";
  let database: Awaited<ReturnType<typeof freshDatabase>>;
  let host: FleetAgentDaemon;
  let gateway: StandaloneGateway;
  let quiet: StandaloneGateway;
  const dirs: string[] = [];
  let tenantToken: string;
  const dir = () => {
    const d = mkdtempSync(join(tmpdir(), "agentvm-metrics-"));
    dirs.push(d);
    return d;
  };

  beforeAll(async () => {
    database = await freshDatabase();
    await database.db.insert(tenants).values({ id: "ten_metrics", name: "metrics" });
    const hostEnv = {
      DATABASE_URL: database.url,
      COMPONENT_SECRET: testComponentSecret,
      DATA_DIR: dir(),
      INGRESS_PORT: "0",
      REAPER_INTERVAL_MS: "100",
      DRAIN_TIMEOUT_MS: "2000",
      METRICS_TOKEN: hostToken,
    };
    host = await startFleetAgent(parseDaemonConfig(hostEnv), { log: silentLogger, driver: new ProcessDriver({}), database });
    const gatewayDir = dir();
    const gatewayEnv = { DATABASE_URL: database.url, COMPONENT_SECRET: testComponentSecret, DATA_DIR: gatewayDir, PORT: "0", PLACEMENT_CACHE_MS: "0" };
    gateway = await startGateway(parseStandaloneGatewayConfig({ ...gatewayEnv, METRICS_TOKEN: gatewayToken }), { log: silentLogger, database });
    quiet = await startGateway(parseStandaloneGatewayConfig({ ...gatewayEnv, DATA_DIR: dir() }), { log: silentLogger, database });
    const keys = await ensureDevKeys(gatewayDir);
    tenantToken = await mintToken(keys.privateJwk, { tenant: "ten_metrics", scopes: ["agents:invoke", "agents:admin"] });
  });
  afterAll(async () => {
    await quiet?.stop();
    await gateway?.stop();
    await host?.stop();
    await database?.close();
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  it("each listener takes its own token only; without METRICS_TOKEN /metrics is off (404)", async () => {
    await expectRefused(host.url, undefined, 401, "unauthorized");
    await expectRefused(host.url, gatewayToken, 401, "unauthorized");
    await expectRefused(gateway.url, hostToken, 401, "unauthorized");
    expect((await scrape(host.url, hostToken)).res.status).toBe(200);
    expect((await scrape(gateway.url, gatewayToken)).res.status).toBe(200);
    expect((await expectRefused(quiet.url, gatewayToken, 404, "not_found")).message).toBe("metrics are off: set METRICS_TOKEN");
  });

  it("a call through the gateway: the host counts the wake and the awake VM, the gateway the 2xx call", async () => {
    const hostBefore = (await scrape(host.url, hostToken)).m;
    const gatewayBefore = (await scrape(gateway.url, gatewayToken)).m;
    const auth = { authorization: `Bearer ${tenantToken}` };
    const created = await fetch(`${gateway.url}/v1/agents`, {
      method: "POST",
      headers: { ...auth, "content-type": "application/json" },
      body: JSON.stringify({ idleTimeoutMs: 60_000 }),
    });
    expect(created.status).toBe(201);
    const { id } = (await created.json()) as { id: string };
    const res = await fetch(`${gateway.url}/a/${id}/counter`, { method: "POST", headers: auth });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-wake")).toBe("boot");
    await res.text();

    await waitFor(
      async () =>
        num((await scrape(host.url, hostToken)).m('agentvm_wake_first_byte_seconds_count{mode="boot"}')) ===
        num(hostBefore('agentvm_wake_first_byte_seconds_count{mode="boot"}')) + 1,
      5000,
      "first byte on the host",
    );
    const h = (await scrape(host.url, hostToken)).m;
    expect(num(h('agentvm_wakes_total{mode="boot",reason="request"}')) - num(hostBefore('agentvm_wakes_total{mode="boot",reason="request"}'))).toBe(1);
    expect(num(h('agentvm_wake_seconds_count{mode="boot"}')) - num(hostBefore('agentvm_wake_seconds_count{mode="boot"}'))).toBe(1);
    expect(h("agentvm_vms_awake")).toBe(1);
    expect(h("agentvm_meter_spool_segments")).toBeGreaterThanOrEqual(0);

    const g = (await scrape(gateway.url, gatewayToken)).m;
    expect(num(g('agentvm_proxied_calls_total{status_class="2xx"}')) - num(gatewayBefore('agentvm_proxied_calls_total{status_class="2xx"}'))).toBe(1);
    // The gateway holds no VMs: its registry has no host's wakes, and its awake gauge has nobody to read.
    expect(g('agentvm_wakes_total{mode="boot",reason="request"}')).toBeUndefined();
    expect(g("agentvm_vms_awake")).toBe(0);
    // The host counts no proxied calls (the gateway did), so nothing is counted twice.
    expect(h('agentvm_proxied_calls_total{status_class="2xx"}') ?? 0).toBe(0);
  });
});

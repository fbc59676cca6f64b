// The remote Fleet against a real host ingress: both HTTP clients (Workers-style fetch, Node undici), fidelity, aborts, failures.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { gunzipSync } from "node:zlib";
import { sql } from "drizzle-orm";
import { systemClock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import { componentKey } from "../../lib/host-token.ts";
import { newId } from "../../lib/ids.ts";
import { silentLogger } from "../../lib/log.ts";
import { agents, hosts, tenants } from "../../schema/core.ts";
import type { Fleet } from "../../contracts/fleet.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import { createDbPlacement } from "../../gateway/placement.ts";
import { createRemoteFleet, type HostFetch } from "../../gateway/remote-fleet.ts";
import { createNodeHostFetch } from "../../gateway/node/remote-fleet.ts";
import { freshDatabase } from "../helpers/db.ts";
import { gzipAgentImage as gzipAgent, inspectImage, startHostInProcess, testComponentSecret, waitFor, type InProcessHost } from "../helpers/worker-stack.ts";

let database: Awaited<ReturnType<typeof freshDatabase>>;
let host: InProcessHost;
const nodeFetch = createNodeHostFetch({ connectTimeoutMs: 2000, headersTimeoutMs: 30_000 });
const fetchFetch: HostFetch = (req) => fetch(req);

beforeAll(async () => {
  database = await freshDatabase();
  await database.db.insert(tenants).values({ id: "ten_r", name: "r" });
  host = await startHostInProcess(database, { images: { inspect: inspectImage, gzip: gzipAgent } });
});
afterAll(async () => {
  await nodeFetch.close();
  await host?.stop();
  await database?.close();
});

function fleetWith(hostFetch: HostFetch, secret = testComponentSecret): Fleet {
  return createRemoteFleet({
    placement: createDbPlacement(database.db, { liveWindowMs: 30_000, cacheTtlMs: 0, clock: systemClock }),
    key: componentKey(secret),
    log: silentLogger,
    fetch: hostFetch,
  });
}

async function agent(image: string): Promise<AgentSpec> {
  const id = newId("agent");
  await database.db.insert(agents).values({ id, tenantId: "ten_r", name: "a", image });
  return { id, tenantId: "ten_r", image, vcpus: 1, memMiB: 256, idleTimeoutMs: 60_000, streamIdleMs: 60_000, allowEgress: false };
}

const ctx = () => ({ requestId: newId("request"), reason: "request" as const });

for (const [name, hostFetch] of [
  ["undici (Node gateway)", nodeFetch],
  ["fetch (as on Workers)", fetchFetch],
] as const) {
  describe(`remote fleet over ${name}`, () => {
    it("forwards method, path, query, headers and body; keeps x-wake and server-timing", async () => {
      const a = await agent("inspect");
      const req = new Request("http://agent/some/path?q=1&r=2", {
        method: "PUT",
        headers: { "x-forwarded-for": "203.0.113.9", "x-request-id": "req_abcdefgh1234", authorization: "Basic agent-own", "content-type": "text/plain" },
        body: "y".repeat(70_000),
      });
      const res = await fleetWith(hostFetch).forward(a, req, ctx());
      expect(res.status).toBe(200);
      expect(res.headers.get("x-wake")).toBe("boot");
      expect(res.headers.get("server-timing")).toMatch(/boot;dur=/);
      expect(res.headers.get("x-custom")).toBe("yes");
      const seen = (await res.json()) as { method: string; url: string; headers: Record<string, string>; bytes: number };
      expect(seen).toMatchObject({ method: "PUT", url: "/some/path?q=1&r=2", bytes: 70_000 });
      expect(seen.headers).toMatchObject({
        "x-forwarded-for": "203.0.113.9",
        "x-request-id": "req_abcdefgh1234",
        authorization: "Basic agent-own",
        "content-type": "text/plain",
      });
      expect(Object.keys(seen.headers).filter((h) => h.startsWith("x-agentvm"))).toEqual([]);
    });

    it("HEAD and body-less methods keep their shape across the hop", async () => {
      const a = await agent("inspect");
      const fleet = fleetWith(hostFetch);
      const head = await fleet.forward(a, new Request("http://agent/h", { method: "HEAD" }), ctx());
      expect(head.status).toBe(200);
      expect(head.headers.get("x-wake")).toBe("boot");
      expect(await head.text()).toBe("");
      const del = await fleet.forward(a, new Request("http://agent/d", { method: "DELETE" }), ctx());
      expect(await del.json()).toMatchObject({ method: "DELETE", url: "/d", bytes: 0 });
      await waitFor(() => host.host.status(a.id)?.inFlight === 0, 2000, "both released");
    });

    it("passes an agent's redirect through instead of following it", async () => {
      const a = await agent("gzip");
      const res = await fleetWith(hostFetch).forward(a, new Request("http://agent/redirect"), ctx());
      expect(res.status).toBe(302);
      expect(res.headers.get("location")).toBe("/elsewhere");
    });

    it("a client abort mid-stream reaches the host and releases the agent", async () => {
      const a = await agent("gzip");
      const abort = new AbortController();
      const res = await fleetWith(hostFetch).forward(a, new Request("http://agent/drip"), { ...ctx(), signal: abort.signal });
      const reader = res.body!.getReader();
      await reader.read();
      expect(host.host.status(a.id)?.inFlight).toBe(1);
      abort.abort();
      await reader.cancel().catch(() => undefined);
      await waitFor(() => host.host.status(a.id)?.inFlight === 0, 5000, "release on the host");
    });

    it("the host applies the agent's response timeout the gateway hands it (it alone sees the VM doze): 504 from the host", async () => {
      const fleet = fleetWith(hostFetch);
      expect(fleet.appliesLimits).toBe(true);
      const a = await agent("inspect");
      const started = Date.now();
      const err = await fleet
        .forward(a, new Request("http://agent/hang"), { ...ctx(), limits: { responseTimeoutMs: 300, proxyIdleTimeoutMs: 60_000 } })
        .catch((e: unknown) => e);
      expect(err).toMatchObject({ code: "gateway_timeout", message: expect.stringMatching(/sent no response within 300 ms/) });
      expect(Date.now() - started).toBeLessThan(5000);
      await waitFor(() => host.host.status(a.id)?.inFlight === 0, 5000, "release on the host");
    });

    it("a gateway with another secret gets 502, not the caller's 401", async () => {
      const a = await agent("inspect");
      const err = await fleetWith(hostFetch, "a-different-secret-of-32-characters-or-more")
        .forward(a, new Request("http://agent/"), ctx())
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(AppError);
      expect(err).toMatchObject({ code: "bad_gateway", message: expect.stringMatching(/refused the gateway's component token/) });
      expect(host.host.status(a.id)).toBeUndefined();
    });
  });
}

describe("remote fleet specifics", () => {
  it("the Node client leaves an agent's gzip body encoded, so Content-Encoding stays true", async () => {
    const a = await agent("gzip");
    const res = await fleetWith(nodeFetch).forward(a, new Request("http://agent/", { headers: { "accept-encoding": "gzip" } }), ctx());
    expect(res.headers.get("content-encoding")).toBe("gzip");
    const raw = new Uint8Array(await res.arrayBuffer());
    expect(res.headers.get("content-length")).toBe(String(raw.byteLength));
    expect(gunzipSync(raw).toString()).toBe("hello ".repeat(1000));
  });

  it("an unreachable host: forward fails 503 host_unavailable with Retry-After, status degrades to unknown, remove of a non-live host is skipped", async () => {
    await database.db.insert(hosts).values({ id: "host_gone", url: "http://127.0.0.1:9", driver: "process", capacityMiB: 1024 });
    const a = await agent("inspect");
    await database.db.execute(sql`update agents set host_id = 'host_gone', state = 'hibernated' where id = ${a.id}`);
    const fleet = fleetWith(nodeFetch);
    await expect(fleet.forward(a, new Request("http://agent/"), ctx())).rejects.toMatchObject({
      code: "host_unavailable",
      status: 503,
      retryAfterS: 2,
      message: expect.stringMatching(/host host_gone unreachable/),
    });
    expect(await fleet.status(a.id)).toBeUndefined();
    await expect(fleet.hibernate(a.id)).rejects.toMatchObject({ code: "host_unavailable" });
    await database.db.execute(sql`update hosts set last_heartbeat_at = now() - interval '1 hour' where id = 'host_gone'`);
    await expect(fleet.remove(a.id)).resolves.toBeUndefined();
  });

  it("statuses: a page's agents in one call per host, each as status answers it; an unreachable host costs only its own", async () => {
    const fleet = fleetWith(nodeFetch);
    const awake = await agent("inspect");
    await fleet.wake(awake, "api");
    const asleep = await agent("inspect");
    await fleet.wake(asleep, "api");
    expect(await fleet.hibernate(asleep.id)).toBe("hibernated");
    const never = await agent("inspect");
    await database.db.insert(hosts).values({ id: "host_down", url: "http://127.0.0.1:9", driver: "process", capacityMiB: 1024 }).onConflictDoNothing();
    const lost = await agent("inspect");
    await database.db.execute(sql`update agents set host_id = 'host_down', state = 'hibernated' where id = ${lost.id}`);
    const statuses = await fleet.statuses([awake.id, asleep.id, never.id, lost.id]);
    expect([...statuses.keys()].sort()).toEqual([awake.id, asleep.id].sort());
    expect(statuses.get(awake.id)).toEqual(await fleet.status(awake.id));
    expect(statuses.get(asleep.id)?.state).toBe("hibernated");
    await fleet.remove(awake.id);
    await fleet.remove(asleep.id);
  });

  it("an agent that never ran anywhere: status unknown, hibernate is a no-op, no lease to drop", async () => {
    const a = await agent("inspect");
    const fleet = fleetWith(fetchFetch);
    expect(await fleet.status(a.id)).toBeUndefined();
    expect(await fleet.hibernate(a.id)).toBe("hibernated");
    expect(await fleet.dropLease(a.id, "lse_nothing000")).toBe(false);
    await expect(fleet.remove(a.id)).resolves.toBeUndefined();
  });
});

// Fleet.statuses, the one status read a page of GET /v1/agents makes: the remote fleet looks the agents' hosts up once,
// asks each host for its agents in batches, and a host that is down costs only its agents' live state.
import { describe, expect, it } from "vitest";
import { createRemoteFleet } from "../../gateway/remote-fleet.ts";
import type { PlacedHost, Placement } from "../../gateway/placement.ts";
import type { VmStatus } from "../../contracts/agent.ts";
import { hostOpPaths, hostTokenHeader, maxStatusesPerCall, verifyHostCall } from "../../contracts/host-protocol.ts";
import { silentLogger } from "../../lib/log.ts";

describe("remote fleet statuses", () => {
  it("looks the hosts up once, asks each host in batches of ids, and survives a host that is down", async () => {
    const key = new Uint8Array(32).fill(7);
    const ids = Array.from({ length: 250 }, (_, i) => `agt_${String(i).padStart(16, "0")}`);
    const hosts: PlacedHost[] = ["a", "b", "c"].map((h) => ({ id: `host_${h}`, url: `http://${h}.hosts.test/`, live: true, generation: 0 }));
    // Every fifth agent never ran anywhere; the others are spread over three hosts, and host_b does not answer.
    const hostOf = (i: number) => (i % 5 === 0 ? undefined : hosts[i % 3]!);
    let lookups = 0;
    const placement: Placement = {
      hostFor: () => Promise.reject(new Error("not used")),
      currentHost: () => Promise.reject(new Error("a page must not look hosts up one agent at a time")),
      currentHosts: async (asked) => {
        lookups++;
        const out = new Map<string, PlacedHost>();
        for (const id of asked) {
          const host = hostOf(ids.indexOf(id));
          if (host) out.set(id, host);
        }
        return out;
      },
      forget: () => undefined,
    };
    const calls: { host: string; ids: string[] }[] = [];
    const fleet = createRemoteFleet({
      placement,
      key,
      log: silentLogger,
      fetch: async (req) => {
        const url = new URL(req.url);
        const host = hosts.find((h) => h.url === `${url.origin}/`)!;
        expect(url.pathname).toBe(hostOpPaths.statuses);
        const call = await verifyHostCall(key, host.id, req.headers.get(hostTokenHeader) ?? undefined);
        if (call.op !== "statuses") throw new Error(`unexpected ${call.op}`);
        calls.push({ host: host.id, ids: call.agentIds });
        if (host.id === "host_b") throw new TypeError("fetch failed");
        const statuses = Object.fromEntries(
          call.agentIds.map((agentId): [string, VmStatus] => [
            agentId,
            { agentId, vmId: "vm_x", state: "running", inFlight: 0, leases: 0, runId: undefined, lastWakeAt: undefined, lastActivityAt: undefined },
          ]),
        );
        return Response.json({ statuses });
      },
    });
    const statuses = await fleet.statuses(ids);
    const expected = ids.filter((_, i) => hostOf(i) !== undefined && hostOf(i)!.id !== "host_b");
    expect([...statuses.keys()].sort()).toEqual(expected.sort());
    expect(statuses.get(expected[0]!)?.state).toBe("running");
    expect(lookups).toBe(1);
    // 200 agents with a host, ~67 per host: one call per host (each batch ≤ maxStatusesPerCall ids, each its own host's).
    expect(calls.map((c) => c.host).sort()).toEqual(["host_a", "host_b", "host_c"]);
    for (const c of calls) {
      expect(c.ids.length).toBeLessThanOrEqual(maxStatusesPerCall);
      expect(c.ids.every((id) => hostOf(ids.indexOf(id))?.id === c.host)).toBe(true);
    }
    expect((await fleet.statuses([])).size).toBe(0);
  });

  it("splits a host's agents into batches of at most maxStatusesPerCall ids", async () => {
    const key = new Uint8Array(32).fill(9);
    const ids = Array.from({ length: maxStatusesPerCall * 2 + 5 }, (_, i) => `agt_${String(i).padStart(16, "0")}`);
    const host: PlacedHost = { id: "host_one", url: "http://one.hosts.test/", live: true, generation: 0 };
    const sizes: number[] = [];
    const fleet = createRemoteFleet({
      placement: {
        hostFor: () => Promise.reject(new Error("not used")),
        currentHost: () => Promise.reject(new Error("not used")),
        currentHosts: async (asked) => new Map(asked.map((id) => [id, host])),
        forget: () => undefined,
      },
      key,
      log: silentLogger,
      fetch: async (req) => {
        const call = await verifyHostCall(key, host.id, req.headers.get(hostTokenHeader) ?? undefined);
        if (call.op !== "statuses") throw new Error(`unexpected ${call.op}`);
        sizes.push(call.agentIds.length);
        return Response.json({ statuses: {} });
      },
    });
    expect((await fleet.statuses(ids)).size).toBe(0);
    expect(sizes.sort((a, b) => b - a)).toEqual([maxStatusesPerCall, maxStatusesPerCall, 5]);
  });
});

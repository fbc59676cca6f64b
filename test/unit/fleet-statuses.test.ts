// Fleet.statuses, the one status read a page of GET /v1/agents makes: the remote fleet asks a few hosts at a time and a host that is down costs only its agents' live state.
import { describe, expect, it } from "vitest";
import { createRemoteFleet } from "../../gateway/remote-fleet.ts";
import type { PlacedHost, Placement } from "../../gateway/placement.ts";
import type { VmStatus } from "../../contracts/agent.ts";
import { silentLogger } from "../../lib/log.ts";

describe("remote fleet statuses", () => {
  it("answers the agents their hosts know, asks at most 16 at once, and survives a host that is down", async () => {
    const ids = Array.from({ length: 60 }, (_, i) => `agt_${String(i).padStart(16, "0")}`);
    // Every third agent never ran anywhere; agent 1's host does not answer.
    const placement: Placement = {
      hostFor: () => Promise.reject(new Error("not used")),
      currentHost: async (agentId): Promise<PlacedHost | undefined> => (ids.indexOf(agentId) % 3 === 0 ? undefined : { id: `host_${agentId}`, url: `http://${agentId}.hosts.test/`, live: true }),
      forget: () => undefined,
    };
    let inFlight = 0;
    let most = 0;
    const fleet = createRemoteFleet({
      placement,
      key: new Uint8Array(32),
      log: silentLogger,
      fetch: async (req) => {
        const agentId = new URL(req.url).hostname.split(".")[0]!;
        inFlight++;
        most = Math.max(most, inFlight);
        await new Promise((r) => setTimeout(r, 5));
        inFlight--;
        if (agentId === ids[1]) throw new TypeError("fetch failed");
        const status: VmStatus = { agentId, vmId: "vm_x", state: "running", inFlight: 0, leases: 0, runId: undefined, lastWakeAt: undefined, lastActivityAt: undefined };
        return Response.json({ status });
      },
    });
    const statuses = await fleet.statuses(ids);
    const expected = ids.filter((id, i) => i % 3 !== 0 && id !== ids[1]);
    expect([...statuses.keys()].sort()).toEqual(expected.sort());
    expect(statuses.get(ids[2]!)?.state).toBe("running");
    expect(most).toBeGreaterThan(1);
    expect(most).toBeLessThanOrEqual(16);
    expect((await fleet.statuses([])).size).toBe(0);
  });
});

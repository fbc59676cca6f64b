// A Fleet for tests of the gateway's own logic: every call answers "nothing happened" unless the test overrides it.
import type { VmStatus } from "../../contracts/agent.ts";
import type { Fleet } from "../../contracts/fleet.ts";

export function fakeFleet(overrides: Partial<Fleet> = {}): Fleet {
  const fleet: Fleet = {
    async forward(agent) {
      return new Response(`hello from ${agent.id}`, { headers: { "x-wake": "warm", connection: "close" } });
    },
    async wake() {
      return { wake: "boot", runId: "run_x", timings: { bootMs: 1 } };
    },
    async hibernate() {
      return "hibernated";
    },
    async status() {
      return undefined;
    },
    async statuses(agentIds) {
      const out = new Map<string, VmStatus>();
      for (const id of agentIds) {
        const status = await fleet.status(id);
        if (status) out.set(id, status);
      }
      return out;
    },
    async addLease() {
      return { leaseId: "lse_1", expiresAt: 0 };
    },
    async dropLease() {
      return false;
    },
    async remove() {},
    async logs() {
      return undefined;
    },
    ...overrides,
  };
  return fleet;
}

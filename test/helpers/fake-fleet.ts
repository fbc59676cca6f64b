// A Fleet for tests of the gateway's own logic: every call answers "nothing happened" unless the test overrides it.
import type { Fleet } from "../../contracts/fleet.ts";

export function fakeFleet(overrides: Partial<Fleet> = {}): Fleet {
  return {
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
}

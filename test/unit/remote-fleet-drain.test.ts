// A gateway's call to an agent on a draining host: refused before it reaches the agent (`host_draining`), a call that
// can be sent twice is placed and sent again, the offer to hand off on its first try only, three tries in all.
import { describe, expect, it } from "vitest";
import { createRemoteFleet } from "../../gateway/remote-fleet.ts";
import type { PlacedHost } from "../../gateway/placement.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import { hostErrorHeader, hostTokenHeader, verifyHostCall } from "../../contracts/host-protocol.ts";
import { AppError } from "../../lib/errors.ts";
import { silentLogger } from "../../lib/log.ts";

const key = new Uint8Array(32).fill(3);
const spec: AgentSpec = {
  id: "agt_0000000000000001",
  tenantId: "ten_a",
  image: "demo",
  vcpus: 1,
  memMiB: 128,
  idleTimeoutMs: 60_000,
  streamIdleMs: 30_000,
  allowEgress: false,
};
const draining: PlacedHost = { id: "host_d", url: "http://d.hosts.test/", live: true, generation: 1 };
const other: PlacedHost = { id: "host_o", url: "http://o.hosts.test/", live: true, generation: 2 };

/** A fleet whose placement answers `placed` in turn (the last one from then on), and whose hosts refuse `refusals` calls. */
function fleetWith(placed: PlacedHost[], refusals: number) {
  const sent: { host: string; handOff: boolean }[] = [];
  let forgotten = 0;
  let placements = 0;
  const fleet = createRemoteFleet({
    placement: {
      hostFor: async () => placed[Math.min(placements++, placed.length - 1)]!,
      currentHost: () => Promise.reject(new Error("not used")),
      currentHosts: () => Promise.reject(new Error("not used")),
      forget: () => void forgotten++,
    },
    key,
    log: silentLogger,
    fetch: async (req) => {
      const host = [draining, other].find((h) => req.url.startsWith(h.url))!;
      const call = await verifyHostCall(key, host.id, req.headers.get(hostTokenHeader) ?? undefined);
      sent.push({ host: host.id, handOff: "handOff" in call && call.handOff === true });
      if (sent.length <= refusals) {
        const error = { code: "host_draining", message: "host is draining", requestId: "req_x" };
        return Response.json({ error }, { status: 503, headers: { [hostErrorHeader]: "host_draining", "retry-after": "1" } });
      }
      return new Response("ok");
    },
  });
  return { fleet, sent, forgotten: () => forgotten };
}

const forward = (fleet: ReturnType<typeof createRemoteFleet>, init: RequestInit = {}) =>
  fleet.forward(spec, new Request("http://gw.test/a/x/counter", { method: "POST", ...init }), { requestId: "req_0000000000000001", reason: "request" });

describe("a call to an agent on a draining host", () => {
  it("offers the hand-off, then goes where the agent is placed next", async () => {
    const { fleet, sent, forgotten } = fleetWith([draining, other], 1);
    expect(await (await forward(fleet)).text()).toBe("ok");
    expect(sent).toEqual([
      { host: "host_d", handOff: true },
      { host: "host_o", handOff: false },
    ]);
    expect(forgotten()).toBe(1);
  });

  it("is sent a third time when the draining host could not claim the agent in time, and no more", async () => {
    const twice = fleetWith([draining], 2);
    expect(await (await forward(twice.fleet)).text()).toBe("ok");
    expect(twice.sent).toEqual([
      { host: "host_d", handOff: true },
      { host: "host_d", handOff: false },
      { host: "host_d", handOff: false },
    ]);
    const always = fleetWith([draining], 10);
    const err = await forward(always.fleet).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AppError);
    expect((err as AppError).code).toBe("host_draining");
    expect((err as AppError).retryAfterS).toBe(1);
    expect(always.sent.length).toBe(3);
  });

  it("with a streamed body of unknown length goes once, without the offer", async () => {
    const { fleet, sent } = fleetWith([draining], 10);
    const body = new ReadableStream({ start: (c) => (c.enqueue(new Uint8Array([1])), c.close()) });
    const err = await forward(fleet, { body, duplex: "half" } as RequestInit).catch((e: unknown) => e);
    expect((err as AppError).code).toBe("host_draining");
    expect(sent).toEqual([{ host: "host_d", handOff: false }]);
  });
});

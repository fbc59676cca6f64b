// A viewer's hold (gateway/desktop/hold.ts): a lease taken at once and renewed with the session, one lease at a time, everything given back at release, a lease that lands after release dropped.
import { afterEach, describe, expect, it, vi } from "vitest";
import type { AgentSpec } from "../../contracts/agent.ts";
import { holdForViewer } from "../../gateway/desktop/hold.ts";
import { memoryDesktopSessions, sessionRenewMs, sessionTtlMs, type DesktopSession } from "../../gateway/desktop/sessions.ts";
import { silentLogger } from "../../lib/log.ts";

const spec = { id: "agt_d" } as AgentSpec;

function fakeFleet(opts: { slowAdd?: () => Promise<void> } = {}) {
  let n = 0;
  const live = new Set<string>();
  const ttls: number[] = [];
  return {
    live,
    ttls,
    async addLease(_s: AgentSpec, ttlMs: number) {
      await opts.slowAdd?.();
      const leaseId = `lse_${++n}`;
      live.add(leaseId);
      ttls.push(ttlMs);
      return { leaseId, agentId: "agt_d", expiresAt: Date.now() + ttlMs };
    },
    async dropLease(_agentId: string, leaseId: string) {
      return live.delete(leaseId);
    },
  };
}

async function openSession(sessions: ReturnType<typeof memoryDesktopSessions>): Promise<DesktopSession> {
  const now = new Date();
  const s: DesktopSession = {
    id: "dsk_1",
    tenantId: "ten_d",
    agentId: "agt_d",
    mode: "control",
    actor: "alice",
    requestId: "req_1",
    startedAt: now,
    expiresAt: new Date(now.getTime() + sessionTtlMs),
  };
  await sessions.open(s);
  return s;
}

afterEach(() => vi.useRealTimers());

describe("holdForViewer", () => {
  it("takes a lease at once, renews it with the session (one at a time), gives both back at release", async () => {
    vi.useFakeTimers();
    const sessions = memoryDesktopSessions();
    const fleet = fakeFleet();
    const session = await openSession(sessions);
    const hold = holdForViewer({ sessions, fleet, log: silentLogger }, session, async () => spec, "req_1");
    await vi.advanceTimersByTimeAsync(1);
    expect([...fleet.live]).toEqual(["lse_1"]);
    expect(fleet.ttls).toEqual([sessionTtlMs]);
    await vi.advanceTimersByTimeAsync(sessionRenewMs * 5);
    expect(fleet.live.size).toBe(1); // renewed: the previous lease dropped each time
    expect((await sessions.live("agt_d", new Date(Date.now() + sessionTtlMs - 10))).map((s) => s.id)).toEqual(["dsk_1"]); // the session lives on
    hold.release(new Date());
    await vi.advanceTimersByTimeAsync(1);
    expect(fleet.live.size).toBe(0);
    expect(await sessions.live("agt_d", new Date())).toEqual([]);
    hold.release(new Date()); // idempotent
    await vi.advanceTimersByTimeAsync(sessionRenewMs * 2);
    expect(fleet.live.size).toBe(0); // nothing renewed after release
  });

  it("a lease that lands after the viewer left is dropped at once", async () => {
    let landed!: () => void;
    const fleet = fakeFleet({ slowAdd: () => new Promise<void>((r) => (landed = r)) });
    const sessions = memoryDesktopSessions();
    const hold = holdForViewer({ sessions, fleet, log: silentLogger }, await openSession(sessions), async () => spec, "req_1");
    await new Promise((r) => setTimeout(r, 0));
    hold.release(new Date());
    landed();
    await new Promise((r) => setTimeout(r, 0));
    expect(fleet.live.size).toBe(0);
  });
});

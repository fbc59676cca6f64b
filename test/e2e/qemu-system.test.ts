// The whole system (gateway + host + Postgres) on the real qemu driver: concurrent calls to a hibernated agent wake it once.
import { and, eq } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { vmEvents } from "../../schema/core.ts";
import { makeDriver } from "../helpers/qemu.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";

let sys: TestSystem;

beforeAll(async () => {
  sys = await startSystem({ driver: await makeDriver() });
}, 60_000);

afterAll(async () => {
  await sys?.stop();
}, 60_000);

async function events(agentId: string, toState: string) {
  await sys.host.flush();
  return sys.database.db
    .select()
    .from(vmEvents)
    .where(and(eq(vmEvents.agentId, agentId), eq(vmEvents.toState, toState)));
}

describe("qemu driver behind the gateway", () => {
  it("50 concurrent calls to a hibernated agent: exactly one restore, 50 successes, all x-wake: restore, guest clock fixed", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 600_000 });
    const first = await sys.call(`/a/${agent.id}/counter`, { method: "POST" });
    expect(first.status).toBe(200);
    expect(first.headers.get("x-wake")).toBe("boot");
    expect(await first.json()).toEqual({ count: 1 });

    const hib = await sys.call(`/v1/agents/${agent.id}/hibernate`, { method: "POST" });
    expect(await hib.json()).toMatchObject({ state: "hibernated" });
    await new Promise((r) => setTimeout(r, 2000)); // long enough for a frozen guest clock to be visibly wrong

    const results = await Promise.all(
      Array.from({ length: 50 }, () =>
        sys
          .call(`/a/${agent.id}/counter`, { method: "POST" })
          .then(async (r) => ({ status: r.status, wake: r.headers.get("x-wake"), body: (await r.json()) as { count: number } })),
      ),
    );
    expect(results.filter((r) => r.status === 200)).toHaveLength(50);
    expect(results.map((r) => r.wake)).toEqual(Array(50).fill("restore"));
    expect(new Set(results.map((r) => r.body.count))).toEqual(new Set(Array.from({ length: 50 }, (_, i) => i + 2))); // state survived

    const restores = await events(agent.id, "running");
    expect(restores).toHaveLength(2); // the boot and one restore
    const restore = restores.find((e) => e.fromState === "restoring");
    expect(restore).toBeDefined();
    const t = restore!.timings ?? {};
    expect(t.skewBeforeMs).toBeLessThan(-1500);
    expect(Math.abs(t.skewAfterMs ?? Infinity)).toBeLessThan(50);

    // The guest read its clock somewhere between sending and answering: bracket it by the call (the midpoint would
    // count the call's own latency as skew, and a first call to a path after a restore is slow under TCG: CI saw 236 ms).
    const t0 = Date.now();
    const clock = (await (await sys.call(`/a/${agent.id}/clock`)).json()) as { nowMs: number };
    const t1 = Date.now();
    const seen = { t0, guest: clock.nowMs, t1 };
    expect(clock.nowMs, JSON.stringify(seen)).toBeGreaterThanOrEqual(t0 - 50);
    expect(clock.nowMs, JSON.stringify(seen)).toBeLessThanOrEqual(t1 + 50);
    console.log(`guest clock through the gateway: ${clock.nowMs - t0} ms after the call was sent, ${t1 - clock.nowMs} ms before its answer`);
  }, 180_000);
});

// `x-wake-rollback` on every path a wake answers through in the Node gateway beside its host (all-in-one, process
// driver): the fast path's HTTP response and the WebSocket relay's 101. The process driver's restore (a thawed
// process) never loses anything, so the test writes the run record a lost run would have left (host/rollbacks.ts: a
// run that woke after the process was frozen, without a hibernation after it); the QEMU test rollback-qemu.test.ts
// derives them from real crashes. Only the first wake that restores carries it, and the run's timings and the event
// log keep it.
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startSystem, type TestSystem } from "../helpers/system.ts";
import { openWebSocket } from "../helpers/streams.ts";
import { waitFor } from "../helpers/wait.ts";
import { fileRunRecords } from "../../fleet-agent/host/rollbacks.ts";

let sys: TestSystem;

beforeAll(async () => {
  sys = await startSystem();
});
afterAll(async () => {
  await sys?.stop();
});

/** The agent's state directory under the all-in-one's one host. */
function stateDirOf(agentId: string): string {
  const hosts = join(sys.dataDir, "hosts");
  const dir = readdirSync(hosts)
    .map((h) => join(hosts, h, "vms", agentId))
    .find((d) => existsSync(d));
  if (!dir) throw new Error(`no state directory of ${agentId}`);
  return dir;
}

async function hibernatedWithRollback(lostMs: number): Promise<string> {
  const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
  expect((await sys.call(`/a/${agent.id}/`)).headers.get("x-wake-rollback")).toBeNull();
  expect((await (await sys.call(`/v1/agents/${agent.id}/hibernate`, { method: "POST" })).json()) as object).toMatchObject({ state: "hibernated" });
  const wokeAt = Date.now() + 1; // after the freeze
  fileRunRecords.write(stateDirOf(agent.id), { runId: "run_lost", wokeAt, endedAt: wokeAt + lostMs });
  return agent.id;
}

describe("x-wake-rollback", () => {
  it("on the fast path's response of the first wake that restores, in the run's timings and the running transition", async () => {
    const id = await hibernatedWithRollback(4321);
    const woke = await sys.call(`/a/${id}/counter`, { method: "POST" });
    expect(woke.headers.get("x-wake")).toBe("restore");
    expect(woke.headers.get("x-wake-rollback")).toBe("4321");
    await woke.arrayBuffer();
    const warm = await sys.call(`/a/${id}/`);
    expect(warm.headers.get("x-wake")).toBe("warm");
    expect(warm.headers.get("x-wake-rollback")).toBeNull();

    await sys.host.flush();
    const events = (
      (await (await sys.call(`/v1/agents/${id}/events`)).json()) as {
        events: { toState: string; timings: Record<string, number> | null; detail: Record<string, unknown> | null }[];
      }
    ).events;
    const running = events.find((e) => e.toState === "running")!; // newest first
    expect(running.timings?.rollbackMs).toBe(4321);
    expect(running.detail).toMatchObject({ wake: "restore", rollback: { rollbackMs: 4321, lostRunId: "run_lost" } });
    await waitFor(
      async () => {
        const runs = ((await (await sys.call(`/v1/agents/${id}/runs`)).json()) as { runs: { timings: Record<string, number> }[] }).runs;
        return runs[0]?.timings.rollbackMs === 4321 && runs[1]?.timings.rollbackMs === undefined;
      },
      3000,
      "rollbackMs in the run's timings",
    );

    expect((await (await sys.call(`/v1/agents/${id}/hibernate`, { method: "POST" })).json()) as object).toMatchObject({ state: "hibernated" });
    const again = await sys.call(`/a/${id}/`);
    expect(again.headers.get("x-wake")).toBe("restore");
    expect(again.headers.get("x-wake-rollback")).toBeNull();
  });

  it("on the WebSocket relay's 101", async () => {
    const id = await hibernatedWithRollback(987);
    const { ws, response } = await openWebSocket(`${sys.url.replace(/^http/, "ws")}/a/${id}/ws/echo`, { authorization: `Bearer ${sys.demo.token}` });
    expect(response.headers["x-wake"]).toBe("restore");
    expect(response.headers["x-wake-rollback"]).toBe("987");
    ws.close(1000);
  });
});

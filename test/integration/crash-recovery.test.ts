// kill -9 of a fleet-agent process (process driver) with agents awake, mid-stream, just woken, mid-boot and asleep,
// then a restart: the runs the crash cut off end at the last metered instant with reason `crash`, the event log says
// `crash`, the agents' rows say what the host has, and the runs API shows no open run for a VM that is not awake.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eq } from "drizzle-orm";
import { vmIdFor } from "../../fleet-agent/host.ts";
import { agents } from "../../schema/core.ts";
import { startCrashStack, type CrashStack, type RunJson } from "../helpers/host-crash.ts";
import { waitFor } from "../helpers/wait.ts";

const heartbeatMs = 300;
/** Timers fire late under load: how far before the kill the last heartbeat may lie beyond one interval. */
const slackMs = 700;

let stack: CrashStack;

beforeAll(async () => {
  stack = await startCrashStack({ hostEnv: { DRIVER: "process", REAPER_INTERVAL_MS: "100", METER_HEARTBEAT_MS: String(heartbeatMs), LOG_LEVEL: "warn" } });
}, 120_000);

afterAll(async () => {
  await stack?.close();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const at = (iso: string | null) => (iso === null ? NaN : Date.parse(iso));

async function onlyRun(agentId: string): Promise<RunJson> {
  const runs = await stack.runs(agentId);
  expect(runs).toHaveLength(1);
  return runs[0]!;
}

/** No run without an end unless its agent is awake right now. */
async function noOpenRunUnlessAwake(ids: string[]): Promise<void> {
  for (const id of ids) {
    const open = (await stack.runs(id)).filter((r) => r.sleptAt === null);
    if (open.length > 0) expect(await stack.agentState(id), `agent ${id} has an open run`).toBe("running");
    expect(open.length).toBeLessThanOrEqual(1);
  }
}

async function rowState(id: string): Promise<string | undefined> {
  return (await stack.database.db.select({ state: agents.state }).from(agents).where(eq(agents.id, id)))[0]?.state;
}

describe("host crash (kill -9) and restart", () => {
  const ids: Record<"idle" | "streaming" | "fresh" | "booting" | "asleep", string> = { idle: "", streaming: "", fresh: "", booting: "", asleep: "" };

  it("closes the cut-off runs at the last metered instant (reason crash), writes crash events, sets the agents' state", async () => {
    for (const k of Object.keys(ids) as (keyof typeof ids)[]) ids[k] = await stack.createAgent({ idleTimeoutMs: 600_000 });
    expect(((await (await stack.call(`/a/${ids.idle}/counter`, { method: "POST" })).json()) as { count: number }).count).toBe(1);
    expect((await stack.call(`/a/${ids.asleep}/`)).status).toBe(200);
    expect((await (await stack.call(`/v1/agents/${ids.asleep}/hibernate`, { method: "POST" })).json()) as object).toMatchObject({ state: "hibernated" });

    const stream = await stack.call(`/a/${ids.streaming}/sse?n=100000&intervalMs=50`);
    const reader = stream.body!.getReader();
    for (let i = 0; i < 3; i++) await reader.read();
    const streamEnded = (async () => {
      try {
        while (!(await reader.read()).done);
      } catch {
        // cut by the kill
      }
    })();

    await sleep(4 * heartbeatMs); // the awake ones have been metered for a few heartbeats
    expect((await stack.call(`/a/${ids.fresh}/`)).status).toBe(200);
    // The host writes a run's start through its event spool: on a loaded machine that can lag the wake. What is under
    // test is what recovery does with the runs the database had, so the kill waits until it has them.
    const inDb = async () =>
      (await Promise.all((["idle", "streaming", "fresh"] as const).map(async (k) => (await stack.runs(ids[k])).length === 1))).every(Boolean);
    await waitFor(inDb, 15_000, "the awake agents' runs in the database");
    const booting = stack.call(`/a/${ids.booting}/`).catch(() => undefined); // killed mid-wake
    await sleep(40);
    const killAt = await stack.killHost();
    await streamEnded;
    await booting;

    // What the meter spool knew when the host died, and what the database said before the restart.
    const metered = new Map<string, number | undefined>();
    const before = new Map<string, RunJson>();
    for (const k of ["idle", "streaming", "fresh"] as const) {
      const run = await onlyRun(ids[k]);
      expect(run.sleptAt, `${k}: open while the host is down`).toBeNull();
      before.set(k, run);
      metered.set(k, stack.lastMeteredEnd(vmIdFor(ids[k]), run.runId));
    }
    expect(metered.get("idle"), "the idle agent was metered").toBeDefined();
    expect(metered.get("streaming"), "the streaming agent was metered").toBeDefined();

    await stack.startHost();

    for (const k of ["idle", "streaming", "fresh"] as const) {
      const run = await onlyRun(ids[k]);
      expect(run.runId).toBe(before.get(k)!.runId);
      expect(run.sleepReason, k).toBe("crash");
      const sleptAt = at(run.sleptAt);
      expect(sleptAt, `${k}: ended no later than the kill`).toBeLessThanOrEqual(killAt);
      // at its last meter heartbeat; a run the meter never cut (killed within its first heartbeat) at its wake
      expect(sleptAt, `${k}: ended at the last metered instant`).toBe(metered.get(k) ?? at(run.wokeAt));
      expect(sleptAt).toBeGreaterThanOrEqual(at(run.wokeAt));
      if (k !== "fresh") expect(killAt - sleptAt, `${k}: at most a heartbeat lost`).toBeLessThanOrEqual(heartbeatMs + slackMs);

      const events = await stack.events(ids[k]);
      expect(events.at(-1), k).toMatchObject({ fromState: "running", toState: "stopped", reason: "crash", runId: run.runId });
      expect(events.at(-1)!.detail).toMatchObject({ lastAwakeAt: run.sleptAt, runsClosed: [run.runId] });
      expect(await stack.agentState(ids[k])).toBe("stopped");
      expect(await rowState(ids[k])).toBe("stopped");
    }

    // Killed mid-boot: no run was opened; if the row saw the boot (its event, or the host's claim of the row before it:
    // fleet-agent/store.ts `claimWake`), it is told of the crash too.
    expect(await stack.runs(ids.booting)).toEqual([]);
    const bootEvents = await stack.events(ids.booting);
    if (bootEvents.some((e) => e.toState === "booting" || e.fromState === "booting")) {
      expect(bootEvents.at(-1)).toMatchObject({ fromState: "booting", toState: "stopped", reason: "crash", runId: null });
      expect(await rowState(ids.booting)).toBe("stopped");
    } else expect(await rowState(ids.booting)).toBe("creating");

    // Asleep at the kill: nothing to close, nothing said.
    const asleepEvents = await stack.events(ids.asleep);
    expect(asleepEvents.some((e) => e.reason === "crash")).toBe(false);
    expect(await stack.agentState(ids.asleep)).toBe("hibernated");
    expect((await onlyRun(ids.asleep)).sleepReason).toBe("api");

    await noOpenRunUnlessAwake(Object.values(ids));

    // The next call wakes the agent afresh (the process driver keeps nothing across a host restart): no rollback to report.
    const again = await stack.call(`/a/${ids.idle}/counter`, { method: "POST" });
    expect(again.headers.get("x-wake")).toBe("boot");
    expect(again.headers.get("x-wake-rollback")).toBeNull();
    expect(await again.json()).toEqual({ count: 1 });
    // the host writes its event log off the request path: the new run may land just after the answer
    await waitFor(async () => (await stack.runs(ids.idle)).length === 2, 3000, "the new run");
    expect((await stack.runs(ids.idle))[0]!.sleptAt).toBeNull();
    expect(await stack.agentState(ids.idle)).toBe("running");
    await noOpenRunUnlessAwake(Object.values(ids));
  }, 60_000);

  it("a second crash mid-stream closes the new run and leaves the first one as it was", async () => {
    const first = (await stack.runs(ids.idle)).find((r) => r.sleepReason === "crash")!;
    const stream = await stack.call(`/a/${ids.idle}/sse?n=100000&intervalMs=50`);
    const reader = stream.body!.getReader();
    for (let i = 0; i < 3; i++) await reader.read();
    await sleep(3 * heartbeatMs);
    const killAt = await stack.killHost();
    await reader.read().catch(() => undefined);
    const open = (await stack.runs(ids.idle))[0]!;
    expect(open.sleptAt).toBeNull();
    const metered = stack.lastMeteredEnd(vmIdFor(ids.idle), open.runId);
    expect(metered).toBeDefined();
    await stack.startHost();

    const runs = await stack.runs(ids.idle);
    expect(runs).toHaveLength(2);
    expect(runs[1]).toMatchObject({ runId: first.runId, wokeAt: first.wokeAt, sleptAt: first.sleptAt, sleepReason: "crash" });
    expect(runs[0]).toMatchObject({ runId: open.runId, sleepReason: "crash", sleptAt: new Date(metered!).toISOString() });
    expect(killAt - metered!).toBeLessThanOrEqual(heartbeatMs + slackMs);
    expect((await stack.events(ids.idle)).filter((e) => e.reason === "crash").map((e) => e.runId)).toEqual([first.runId, open.runId]);
    expect(await stack.agentState(ids.idle)).toBe("stopped");
    await noOpenRunUnlessAwake(Object.values(ids));
  }, 60_000);
});

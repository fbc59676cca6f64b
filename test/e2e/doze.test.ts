// The doze end to end (issue 30) on real QEMU VMs under TCG, through the whole system (gateway → host → VM → egress
// proxy → a slow model on loopback): an inbound call whose agent makes model calls of ~3 s (in a CONNECT tunnel, and
// plain) is answered right, no connection breaks, the VM dozes through each wait (the API, the event log and QEMU's
// query-status say so), the guest clock is right after each resume, and the meter bills the waits as dozing, not
// active; a token stream with 50 ms gaps never dozes; with DOZE_AFTER_MS=0 nothing dozes and the wait is billed active.
import { and, asc, eq, gte } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningVm } from "../../fleet-agent/drivers/driver.ts";
import type { QemuDriver } from "../../fleet-agent/drivers/qemu/driver.ts";
import { parseEgressConfig } from "../../fleet-agent/egress/config.ts";
import { LateExchangeObserver } from "../../fleet-agent/egress/exchanges.ts";
import { EgressProxy } from "../../fleet-agent/egress/proxy.ts";
import { vmEvents } from "../../schema/core.ts";
import { billedOver, meteredUntil } from "../../scripts/bench/doze/billed.ts";
import { SlowModel } from "../../scripts/bench/slow-model.ts";
import { makeDriver } from "../helpers/qemu.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";
import { waitFor } from "../helpers/wait.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** What the demo agent's `/fetch?…&times=N` answers (fleet-agent/guest/demo-agent/fetch.c). */
interface FetchSummary {
  times: number;
  ok: number;
  ms: number;
  calls: { status: number; bytes: number; fnv: string; ms: number; sentAt: number; firstByteAt: number; endAt: number; error?: string }[];
}

/** A system on the qemu driver whose egress proxy lets the slow model through and tells the host's doze what it sees. */
async function qemuSystem(model: SlowModel, env: Record<string, string>): Promise<{ sys: TestSystem; driver: QemuDriver }> {
  const exchanges = new LateExchangeObserver();
  const egress = new EgressProxy(parseEgressConfig({ EGRESS_ALLOW: `127.0.0.1:${model.port}` }), { exchanges });
  const driver = await makeDriver({ egress });
  // The meter cuts segments every second, so billing has the calls' time soon after they end.
  const sys = await startSystem({ driver, exchanges, env: { METER_HEARTBEAT_MS: "1000", ...env } });
  return { sys, driver };
}

/** Polls the agent's state in the API and its QEMU's `query-status` while a call runs: every value either took. */
class StateWatch {
  readonly api = new Set<string>();
  readonly qemu = new Set<string>();
  private stopped = false;
  private readonly done: Promise<void>;

  constructor(sys: TestSystem, driver: QemuDriver, agentId: string) {
    const vmId = sys.host.status(agentId)!.vmId;
    const vm = { spec: { vmId } } as RunningVm; // the driver finds its VM by id
    this.done = (async () => {
      while (!this.stopped) {
        const [api, qemu] = await Promise.all([sys.state(agentId).catch(() => "unreadable"), driver.runState(vm).catch(() => "unreadable")]);
        this.api.add(api);
        this.qemu.add(qemu);
        await sleep(100);
      }
    })();
  }

  async stop(): Promise<this> {
    this.stopped = true;
    await this.done;
    return this;
  }
}

/** The agent's transitions into or out of `dozing` since `since`, oldest first (after the host flushed its event log). */
async function dozeEvents(sys: TestSystem, agentId: string, since: Date) {
  await sys.host.flush();
  const rows = await sys.database.db
    .select()
    .from(vmEvents)
    .where(and(eq(vmEvents.agentId, agentId), gte(vmEvents.at, since)))
    .orderBy(asc(vmEvents.id));
  return rows.filter((e) => e.toState === "dozing" || e.fromState === "dozing");
}

/** One inbound call through the gateway to the agent's `/fetch`: its answer and the wall-clock window it took. */
async function inbound(sys: TestSystem, agentId: string, query: string) {
  const from = Date.now();
  const res = await sys.call(`/a/${agentId}/fetch?${query}`, { signal: AbortSignal.timeout(120_000) });
  const text = await res.text();
  return { status: res.status, text, from, to: Date.now() };
}

/** Billing has every segment of the agent up to `toMs` (the agent was put to sleep after it: its run is closed). */
async function billedUntil(sys: TestSystem, agentId: string, toMs: number) {
  await waitFor(async () => (await meteredUntil(sys.database.db, [agentId])) >= toMs, 20_000, "meter segments up to the end of the calls");
}

/** The guest's wall clock against the host's, bracketed by the call (a call's own latency is not skew). */
async function guestClockBracket(sys: TestSystem, agentId: string) {
  const t0 = Date.now();
  const { nowMs } = (await (await sys.call(`/a/${agentId}/clock`)).json()) as { nowMs: number };
  const t1 = Date.now();
  return { t0, guest: nowMs, t1 };
}

describe("doze through the whole system (qemu, TCG)", () => {
  let model: SlowModel;
  let sys: TestSystem | undefined;
  let driver: QemuDriver;

  beforeAll(async () => {
    model = await SlowModel.start({ firstByteMs: 3000, tokens: 5, gapMs: 50 });
  });

  afterAll(async () => {
    await sys?.stop();
    await model?.close();
  }, 60_000);

  it("an inbound call whose agent waits ~3 s on each model call: answered right, no connection broken, the VM dozing through each wait, the clock right after, the waits billed as dozing", async () => {
    ({ sys, driver } = await qemuSystem(model, {}));
    const agent = await sys.createAgent({ allowEgress: true, idleTimeoutMs: 600_000 });
    // Boot, then warm both ways out under TCG (a first exchange's code is cold), with models that answer at once.
    expect((await sys.call(`/a/${agent.id}/`)).status).toBe(200);
    for (const via of ["", "&via=connect"]) {
      const warm = await inbound(sys, agent.id, `url=${model.url(SlowModel.path({ firstByteMs: 0, tokens: 2, gapMs: 10 }))}${via}`);
      expect(warm.status, warm.text).toBe(200);
      expect(warm.text).toContain("data: [DONE]");
    }
    const callsBefore = model.calls.length;
    const since = new Date();

    // Two model calls in a CONNECT tunnel (as HTTPS_PROXY is used), then one plain, each answering after 3 s.
    const watch = new StateWatch(sys, driver, agent.id);
    const tunnelled = await inbound(sys, agent.id, `url=${model.url()}&via=connect&times=2`);
    const plain = await inbound(sys, agent.id, `url=${model.url()}&times=1`);
    await watch.stop();
    const afterResume = await guestClockBracket(sys, agent.id);

    // The inbound caller got the right answer: every model call's whole body, as the model sent it.
    const made = model.calls.slice(callsBefore);
    expect(made).toHaveLength(3);
    const answers: FetchSummary[] = [JSON.parse(tunnelled.text), JSON.parse(plain.text)];
    expect([tunnelled.status, plain.status], `${tunnelled.text} ${plain.text}`).toEqual([200, 200]);
    const guestCalls = answers.flatMap((a) => a.calls);
    expect(guestCalls.map((c) => [c.status, c.bytes, c.fnv])).toEqual(made.map((m) => [200, m.bytes, m.fnv]));
    // No connection broke: the model saw every answer through to its end.
    expect(made.map((m) => [m.closedEarly, m.endedAt !== undefined])).toEqual(made.map(() => [false, true]));

    // The VM dozed during the waits: the API said `dozing`, QEMU said `paused`; the event log has a doze and an
    // upstream resume per model call (a call's answer resumed it), with the doze's length and the clock fix.
    expect([...watch.api]).toContain("dozing");
    expect([...watch.qemu]).toContain("paused");
    const events = await dozeEvents(sys, agent.id, since);
    const dozes = events.filter((e) => e.toState === "dozing");
    const resumes = events.filter((e) => e.fromState === "dozing");
    expect(dozes.length).toBeGreaterThanOrEqual(3);
    expect(resumes).toHaveLength(dozes.length);
    expect(resumes.filter((e) => e.reason === "upstream").length).toBeGreaterThanOrEqual(3);
    const dozedMs = resumes.reduce((s, e) => s + (e.timings?.dozeMs ?? 0), 0);
    expect(dozedMs).toBeGreaterThan(3 * 3000 * 0.6); // most of the three 3 s waits

    // The guest clock after each resume: the guest read its clock on the first byte no earlier than the model sent it
    // (a clock left stopped through a 3 s doze would read ~3 s early), and /clock afterwards is within 50 ms.
    for (const [i, c] of guestCalls.entries()) {
      const lag = c.firstByteAt - made[i]!.firstByteWallMs!;
      expect(lag, `call ${i}: the guest's receipt minus the model's first byte`).toBeGreaterThan(-50);
      expect(lag).toBeLessThan(2000);
    }
    expect(afterResume.guest, JSON.stringify(afterResume)).toBeGreaterThanOrEqual(afterResume.t0 - 50);
    expect(afterResume.guest, JSON.stringify(afterResume)).toBeLessThanOrEqual(afterResume.t1 + 50);

    // Billed: the meter cut the waits out of active time (dozing segments), so active time is well under the calls'.
    const hib = await sys.call(`/v1/agents/${agent.id}/hibernate`, { method: "POST" });
    expect(hib.status, await hib.clone().text()).toBe(200);
    await billedUntil(sys, agent.id, plain.to);
    const windowMs = plain.to - tunnelled.from;
    const billed = await billedOver(sys.database.db, [agent.id], tunnelled.from, plain.to);
    console.log(
      `doze e2e: 3 model calls of 3 s in ${windowMs} ms: ${dozes.length} dozes, ${Math.round(dozedMs)} ms dozed (event log); billed active ${billed.activeMs} ms, dozing ${billed.dozingMs} ms; ` +
        `first byte to the guest: ${guestCalls.map((c, i) => Math.round(c.firstByteAt - made[i]!.firstByteWallMs!)).join(", ")} ms`,
    );
    expect(billed.dozingMs).toBeGreaterThan(3 * 3000 * 0.6);
    expect(billed.activeMs).toBeLessThan(windowMs - 3 * 3000 * 0.6);
    expect(billed.activeMs + billed.dozingMs).toBeGreaterThan(windowMs * 0.9); // the run was metered throughout, in one state or the other
  }, 150_000);

  it("a token stream with 50 ms gaps (plain and in a tunnel) never dozes the VM", async () => {
    expect(sys, "the test above started the system").toBeDefined();
    const s = sys!;
    const agent = await s.createAgent({ allowEgress: true, idleTimeoutMs: 600_000 });
    const stream = model.url(SlowModel.path({ firstByteMs: 50, tokens: 60, gapMs: 50 })); // first byte at once, then 3 s of tokens
    for (const via of ["", "&via=connect"]) {
      const warm = await inbound(s, agent.id, `url=${model.url(SlowModel.path({ firstByteMs: 0, tokens: 2, gapMs: 10 }))}${via}`);
      expect(warm.status, warm.text).toBe(200);
    }
    const since = new Date();
    const callsBefore = model.calls.length;
    const watch = new StateWatch(s, driver, agent.id);
    const [plain, tunnelled] = await Promise.all([inbound(s, agent.id, `url=${stream}&times=1`), inbound(s, agent.id, `url=${stream}&via=connect&times=1`)]);
    await watch.stop();
    expect([plain.status, tunnelled.status], `${plain.text} ${tunnelled.text}`).toEqual([200, 200]);
    const made = model.calls.slice(callsBefore);
    expect(made.map((m) => [m.closedEarly, m.endedAt !== undefined])).toEqual([
      [false, true],
      [false, true],
    ]);
    const answered = [JSON.parse(plain.text), JSON.parse(tunnelled.text)].flatMap((a: FetchSummary) => a.calls);
    expect(answered.map((c) => c.fnv).sort()).toEqual(made.map((m) => m.fnv).sort());
    expect(answered.every((c) => c.ms > 2900)).toBe(true); // the stream really lasted its 3 s
    expect(await dozeEvents(s, agent.id, since)).toEqual([]);
    expect([...watch.api]).toEqual(["running"]);
    expect([...watch.qemu]).toEqual(["running"]);
  }, 90_000);

  it("with DOZE_AFTER_MS=0 the same wait never dozes and is billed active", async () => {
    await sys?.stop();
    sys = undefined;
    ({ sys, driver } = await qemuSystem(model, { DOZE_AFTER_MS: "0" }));
    const s = sys;
    const agent = await s.createAgent({ allowEgress: true, idleTimeoutMs: 600_000 });
    const warm = await inbound(s, agent.id, `url=${model.url(SlowModel.path({ firstByteMs: 0, tokens: 2, gapMs: 10 }))}&via=connect`);
    expect(warm.status, warm.text).toBe(200);
    const since = new Date();
    const callsBefore = model.calls.length;
    const watch = new StateWatch(s, driver, agent.id);
    const call = await inbound(s, agent.id, `url=${model.url()}&via=connect&times=1`);
    await watch.stop();
    expect(call.status, call.text).toBe(200);
    expect((JSON.parse(call.text) as FetchSummary).calls[0]!.fnv).toBe(model.calls[callsBefore]!.fnv);
    expect(await dozeEvents(s, agent.id, since)).toEqual([]);
    expect([...watch.api]).toEqual(["running"]);
    expect([...watch.qemu]).toEqual(["running"]);
    expect((await s.call(`/v1/agents/${agent.id}/hibernate`, { method: "POST" })).status).toBe(200);
    await billedUntil(s, agent.id, call.to);
    const billed = await billedOver(s.database.db, [agent.id], call.from, call.to);
    expect(billed.dozingMs).toBe(0);
    expect(billed.activeMs).toBeGreaterThan((call.to - call.from) * 0.95);
  }, 120_000);
});

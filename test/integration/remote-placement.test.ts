// Placement on real Postgres: which host a new agent goes to, that it stays there, and that racing gateways agree.
import { beforeAll, afterAll, beforeEach, describe, expect, it } from "vitest";
import { asc, eq, sql } from "drizzle-orm";
import { ManualClock, systemClock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import { agentCommits, agents, hosts, runs, tenants, vmEvents } from "../../schema/core.ts";
import { type AgentSpec, vmIdFor } from "../../contracts/agent.ts";
import { chooseHost, createDbPlacement, expireHostLeases, type AgentMove, type HostLoad } from "../../gateway/placement.ts";
import { EventLog } from "../../fleet-agent/event-log.ts";
import { silentLogger } from "../../lib/log.ts";
import { createDbHostStore, type HostStore } from "../../fleet-agent/store.ts";
import { Fencing } from "../../fleet-agent/host/fencing.ts";
import type { VmEntry } from "../../fleet-agent/vm-entry.ts";
import { freshDatabase } from "../helpers/db.ts";

let database: Awaited<ReturnType<typeof freshDatabase>>;

beforeAll(async () => {
  database = await freshDatabase();
  await database.db.insert(tenants).values({ id: "ten_p", name: "p" });
});
afterAll(async () => {
  await database?.close();
});
beforeEach(async () => {
  await database.db.delete(agentCommits);
  await database.db.execute(sql`update agents set host_id = null, deleted_at = now()`);
  await database.db.delete(hosts);
});

const db = () => database.db;

async function addHost(
  id: string,
  opts: { ageS?: number; capacityMiB?: number; usedMiB?: number; url?: string | null; clockSkewMs?: number; draining?: boolean; driver?: string } = {},
): Promise<void> {
  await db()
    .insert(hosts)
    .values({
      id,
      url: opts.url === undefined ? `http://${id}.invalid:8090` : opts.url,
      driver: opts.driver ?? "process",
      capacityMiB: opts.capacityMiB ?? 4096,
      usedMiB: opts.usedMiB ?? 0,
      clockSkewMs: opts.clockSkewMs ?? 0,
      drainingAt: opts.draining ? new Date() : null,
      lastHeartbeatAt: sql`now() - make_interval(secs => ${opts.ageS ?? 0})`,
    });
}

async function addAgent(opts: { memMiB?: number; hostId?: string; state?: string } = {}): Promise<AgentSpec> {
  const id = newId("agent");
  const memMiB = opts.memMiB ?? 256;
  await db()
    .insert(agents)
    .values({ id, tenantId: "ten_p", name: "a", image: "demo", memMiB, hostId: opts.hostId ?? null, state: opts.state ?? "creating" });
  return { id, tenantId: "ten_p", image: "demo", vcpus: 1, memMiB, idleTimeoutMs: 60_000, streamIdleMs: 60_000, allowEgress: false };
}

async function hostOf(agentId: string): Promise<string | null> {
  const [row] = await db().select({ hostId: agents.hostId }).from(agents).where(eq(agents.id, agentId));
  return row?.hostId ?? null;
}

const placement = (cacheTtlMs = 0) => createDbPlacement(db(), { liveWindowMs: 30_000, cacheTtlMs, clock: systemClock });

describe("chooseHost", () => {
  const h = (id: string, capacityMiB: number, usedMiB: number, pendingMiB = 0, agents = 0): HostLoad => ({
    id,
    url: "http://x",
    capacityMiB,
    usedMiB,
    pendingMiB,
    agents,
  });

  it("takes the host with the most free memory, counting agents placed there that have not run yet", () => {
    expect(chooseHost([h("a", 1024, 512), h("b", 1024, 0), h("c", 1024, 256)], 256)?.id).toBe("b");
    expect(chooseHost([h("a", 1024, 0, 512), h("b", 1024, 256, 0)], 256)?.id).toBe("b");
  });
  it("counts room exactly from what the host reported, less the reserve", () => {
    expect(chooseHost([h("a", 1024, 768)], 256)?.id).toBe("a");
    expect(chooseHost([h("a", 1024, 769)], 256)).toBeUndefined();
    expect(chooseHost([h("a", 1024, 512)], 256, 256)?.id).toBe("a");
    expect(chooseHost([h("a", 1024, 513)], 256, 256)).toBeUndefined();
  });
  it("agents placed but not run steer the choice, never refuse it (they hold no memory yet)", () => {
    expect(chooseHost([h("a", 1024, 0, 10_000)], 256)?.id).toBe("a");
  });
  it("breaks ties by the fewest agents, then the id", () => {
    expect(chooseHost([h("a", 1024, 0, 0, 5), h("b", 1024, 0, 0, 2)], 256)?.id).toBe("b");
    expect(chooseHost([h("b", 1024, 0), h("a", 1024, 0)], 256)?.id).toBe("a");
  });
  it("has nothing to choose from an empty list", () => {
    expect(chooseHost([], 1)).toBeUndefined();
  });
});

describe("createDbPlacement", () => {
  it("without a live host with room: 503 wake_failed with Retry-After", async () => {
    await addHost("host_stale", { ageS: 3600 });
    await addHost("host_nourl", { url: null });
    await addHost("host_small", { capacityMiB: 128 });
    const agent = await addAgent({ memMiB: 256 });
    const err = await placement()
      .hostFor(agent)
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AppError);
    expect(err).toMatchObject({ code: "wake_failed", status: 503, retryAfterS: 10 });
    expect(await hostOf(agent.id)).toBeNull();
  });

  it("places a new agent on the host with the most room and records it with lease generation 1; then it stays there", async () => {
    await addHost("host_a", { usedMiB: 1024 });
    await addHost("host_b");
    await addHost("host_old", { ageS: 3600 });
    const agent = await addAgent();
    expect(await placement().hostFor(agent)).toEqual({ id: "host_b", url: "http://host_b.invalid:8090", live: true, generation: 1 });
    expect(await hostOf(agent.id)).toBe("host_b");
    // host_a has more room now: the agent does not move.
    await db().update(hosts).set({ usedMiB: 0, capacityMiB: 8192 }).where(eq(hosts.id, "host_a"));
    await db().update(agents).set({ state: "hibernated" }).where(eq(agents.id, agent.id));
    expect((await placement().hostFor(agent)).id).toBe("host_b");
    expect((await placement().currentHost(agent.id))?.id).toBe("host_b");
  });

  it("30 agents created one after another over 3 equal hosts land 10, 10, 10", async () => {
    for (const id of ["host_x1", "host_x2", "host_x3"]) await addHost(id);
    const p = placement();
    for (let i = 0; i < 30; i++) await p.hostFor(await addAgent());
    const rows = await db().execute(sql`select host_id, count(*)::int as n from agents where deleted_at is null group by host_id order by host_id`);
    expect([...(rows as unknown as { host_id: string; n: number }[])].map((r) => [r.host_id, r.n])).toEqual([
      ["host_x1", 10],
      ["host_x2", 10],
      ["host_x3", 10],
    ]);
  });

  it("hosts that are unhealthy take no new agents: a skewed clock, draining, unreachable from here", async () => {
    await addHost("host_skewed", { clockSkewMs: 600_000 });
    await addHost("host_draining", { draining: true });
    await addHost("host_dark");
    await addHost("host_good", { usedMiB: 3000 });
    const probed: string[] = [];
    const p = createDbPlacement(db(), {
      liveWindowMs: 30_000,
      cacheTtlMs: 0,
      clock: systemClock,
      maxClockSkewMs: 2000,
      probe: async (h) => (probed.push(h.id), h.id !== "host_dark"),
    });
    for (let i = 0; i < 3; i++) expect((await p.hostFor(await addAgent())).id).toBe("host_good");
    expect(probed).toContain("host_dark");
    expect(probed).not.toContain("host_skewed");
    // A host a call could not reach counts as unreachable until a probe reaches it again.
    p.unreachable!({ id: "host_good", url: "http://host_good.invalid:8090" });
    await expect(p.hostFor(await addAgent())).rejects.toMatchObject({ code: "wake_failed" });
    // Back at another URL (a restart): asked again at once, not after the kept answer's time.
    await db().update(hosts).set({ url: "http://host_good.invalid:8091" }).where(eq(hosts.id, "host_good"));
    expect((await p.hostFor(await addAgent())).id).toBe("host_good");
  });

  it("an agent whose host's lease ended moves to a live host with a new generation; its open run there ends at that host's last heartbeat", async () => {
    await addHost("host_dead", { ageS: 3600 });
    await addHost("host_alive", { ageS: 0 });
    const fresh = await addAgent({ hostId: "host_dead", state: "creating" });
    expect((await placement().hostFor(fresh)).id).toBe("host_alive");
    expect(await hostOf(fresh.id)).toBe("host_alive");
    const slept = await addAgent({ hostId: "host_dead", state: "running" });
    await db().insert(runs).values({
      id: "run_open00000001",
      agentId: slept.id,
      tenantId: "ten_p",
      hostId: "host_dead",
      vmId: "vm_x",
      wokeAt: sql`now() - interval '2 hours'`,
      wakeReason: "request",
      wakeMode: "boot",
    });
    const moves: AgentMove[] = [];
    const p = createDbPlacement(db(), { liveWindowMs: 30_000, cacheTtlMs: 0, clock: systemClock, onMove: (m) => void moves.push(m) });
    expect(await p.hostFor(slept)).toEqual({ id: "host_alive", url: "http://host_alive.invalid:8090", live: true, generation: 1 });
    const [row] = await db().select().from(agents).where(eq(agents.id, slept.id));
    expect(row).toMatchObject({ hostId: "host_alive", generation: 1, state: "stopped" });
    expect(moves).toEqual([{ agentId: slept.id, fromHostId: "host_dead", toHostId: "host_alive", generation: 1, reason: "host_lost" }]);
    const [run] = await db().select().from(runs).where(eq(runs.id, "run_open00000001"));
    const [dead] = await db().select().from(hosts).where(eq(hosts.id, "host_dead"));
    expect(run).toMatchObject({ sleepReason: "host_lost", sleptAt: dead!.lastHeartbeatAt });
  });

  it("with no other host to take it, an agent of a dead host gets 503 host_unavailable with Retry-After, and stays", async () => {
    await addHost("host_gone", { ageS: 3600 });
    const slept = await addAgent({ hostId: "host_gone", state: "hibernated" });
    await expect(placement().hostFor(slept)).rejects.toMatchObject({ code: "host_unavailable", status: 503, retryAfterS: 5 });
    expect(await hostOf(slept.id)).toBe("host_gone");
  });

  it("a QEMU agent of a dead host moves only with its last hibernation committed to the shared store; otherwise it waits for its host", async () => {
    await addHost("host_qdead", { ageS: 3600, driver: "qemu" });
    await addHost("host_qlive", { driver: "qemu" });
    const waiting = await addAgent({ hostId: "host_qdead", state: "hibernated" });
    await db().insert(runs).values({
      id: "run_slept0000001",
      agentId: waiting.id,
      tenantId: "ten_p",
      hostId: "host_qdead",
      vmId: "vm_w",
      wokeAt: sql`now() - interval '1 hour'`,
      sleptAt: sql`now() - interval '50 minutes'`,
      wakeReason: "request",
      wakeMode: "boot",
    });
    await expect(placement().hostFor(waiting)).rejects.toMatchObject({ code: "host_unavailable", status: 503 });
    expect(await hostOf(waiting.id)).toBe("host_qdead");
    // A commit older than its last hibernation is not its state either.
    const files = { "state.bin": { digest: "sha256:00", bytes: 1 } };
    await db()
      .insert(agentCommits)
      .values({ agentId: waiting.id, hostId: "host_qdead", generation: 0, files, bytes: 1, snapshotAt: sql`now() - interval '55 minutes'` });
    await expect(placement().hostFor(waiting)).rejects.toMatchObject({ code: "host_unavailable" });
    await db().update(agentCommits).set({ snapshotAt: sql`now() - interval '50 minutes'` }).where(eq(agentCommits.agentId, waiting.id));
    expect(await placement().hostFor(waiting)).toMatchObject({ id: "host_qlive", generation: 1 });
  });

  it("a draining host keeps its awake agents and gives up its sleeping ones (with their state carryable); no new agents go there", async () => {
    await addHost("host_drain", { draining: true });
    await addHost("host_other", { usedMiB: 1000 });
    const awake = await addAgent({ hostId: "host_drain", state: "running" });
    const asleep = await addAgent({ hostId: "host_drain", state: "hibernated" });
    const moves: AgentMove[] = [];
    const p = createDbPlacement(db(), { liveWindowMs: 30_000, cacheTtlMs: 0, clock: systemClock, onMove: (m) => void moves.push(m) });
    expect((await p.hostFor(awake)).id).toBe("host_drain");
    expect(await p.hostFor(asleep)).toMatchObject({ id: "host_other", generation: 1 });
    expect(moves).toEqual([{ agentId: asleep.id, fromHostId: "host_drain", toHostId: "host_other", generation: 1, reason: "drain" }]);
    const [row] = await db().select().from(agents).where(eq(agents.id, asleep.id));
    expect(row?.state).toBe("hibernated");
    // The move is in the agent's event log, from the old host.
    expect(await db().select().from(vmEvents).where(eq(vmEvents.agentId, asleep.id))).toEqual([
      expect.objectContaining({
        hostId: "host_drain",
        vmId: vmIdFor(asleep.id),
        fromState: "hibernated",
        toState: "hibernated",
        reason: "moved",
        detail: { why: "drain", fromHostId: "host_drain", toHostId: "host_other", generation: 1 },
      }),
    ]);
    expect((await p.hostFor(await addAgent())).id).toBe("host_other");
  });

  it("a wake on a draining host and a gateway's move of the same sleeping agent race: exactly one goes ahead, never two copies", async () => {
    await addHost("host_drain", { draining: true });
    await addHost("host_other", { usedMiB: 1000 });
    const store = createDbHostStore(db());
    const p = placement();

    // The host claims first (a call from a gateway whose cache still names it): the move finds the row waking and leaves it.
    const first = await addAgent({ hostId: "host_drain", state: "hibernated" });
    expect(await store.claimWake(first.id, "host_drain", 0)).toBeUndefined();
    const [claimed] = await db().select().from(agents).where(eq(agents.id, first.id));
    expect(claimed).toMatchObject({ state: "restoring", hostId: "host_drain", generation: 0 });
    expect(await p.hostFor(first)).toMatchObject({ id: "host_drain", generation: 0 });
    expect(await hostOf(first.id)).toBe("host_drain");

    // The move first: the host's claim is refused with the new owner (its wake answers 503 and the gateway asks again).
    const second = await addAgent({ hostId: "host_drain", state: "hibernated" });
    expect(await p.hostFor(second)).toMatchObject({ id: "host_other", generation: 1 });
    expect(await store.claimWake(second.id, "host_drain", 0)).toMatchObject({ hostId: "host_other", generation: 1 });
    const [moved] = await db().select().from(agents).where(eq(agents.id, second.id));
    expect(moved).toMatchObject({ state: "hibernated", hostId: "host_other" });

    // Many at once, both ways: for each agent the wake's claim and the move never both win.
    const racing = await Promise.all(Array.from({ length: 20 }, () => addAgent({ hostId: "host_drain", state: "hibernated" })));
    const outcomes = await Promise.all(
      racing.map(async (a) => {
        const [claim, place] = await Promise.all([store.claimWake(a.id, "host_drain", 0), p.hostFor(a)]);
        return { woke: claim === undefined, movedTo: place.id };
      }),
    );
    for (const o of outcomes) expect(o.woke ? o.movedTo === "host_drain" : o.movedTo === "host_other").toBe(true);
    const rows = await db()
      .select()
      .from(agents)
      .where(sql`${agents.id} in ${racing.map((a) => a.id)}`);
    for (const r of rows)
      expect(r.hostId === "host_drain" ? r.state === "restoring" && r.generation === 0 : r.state === "hibernated" && r.generation === 1).toBe(true);
  });

  it("a claim outlives the host's own late writes of the runs before it: the row stays waking, so a drain's move cannot take it", async () => {
    await addHost("host_drain", { draining: true });
    await addHost("host_other", { usedMiB: 1000 });
    const store = createDbHostStore(db());
    const events = new EventLog(store, silentLogger);
    const p = placement();
    const a = await addAgent({ hostId: "host_drain", state: "running" });
    const t = (fromState: string, toState: string) => events.transition(drainHostTransition(a.id, fromState, toState, "drain"));
    const state = async () => (await db().select().from(agents).where(eq(agents.id, a.id)))[0]?.state;

    // The host hibernated the agent, woke and hibernated it again, before its event log wrote any of it (writes queue
    // behind holds; under load seconds behind); then it claims the row for the next wake.
    const release = events.hold(10_000);
    t("running", "snapshotting");
    t("snapshotting", "hibernated");
    t("hibernated", "restoring");
    t("restoring", "running");
    t("running", "snapshotting");
    t("snapshotting", "hibernated");
    await events.overtake(a.id);
    expect(await store.claimWake(a.id, "host_drain", 0)).toBeUndefined();
    expect(await state()).toBe("restoring");
    release();
    await events.flush();
    // The log has every transition; the row still says the claim's wake, and a drain's move leaves it here.
    expect(await db().select().from(vmEvents).where(eq(vmEvents.agentId, a.id))).toHaveLength(6);
    expect(await state()).toBe("restoring");
    expect(await p.hostFor(a)).toMatchObject({ id: "host_drain", generation: 0 });

    // The wake's own transitions move the row on; once it sleeps again the move takes it, after every event of the host.
    t("hibernated", "restoring");
    t("restoring", "running");
    await events.flush();
    expect(await state()).toBe("running");
    t("running", "snapshotting");
    t("snapshotting", "hibernated");
    await events.flush();
    expect(await p.hostFor(a)).toMatchObject({ id: "host_other", generation: 1 });
    const log = await db().select().from(vmEvents).where(eq(vmEvents.agentId, a.id)).orderBy(asc(vmEvents.id));
    expect(log.map((e) => `${e.hostId}:${e.toState}:${e.reason}`).at(-1)).toBe("host_drain:hibernated:moved");
  });

  it("a hand-off and a wake's claim on a draining host: the row never says asleep after the claim, so no move lands before the wake's transitions", async () => {
    await addHost("host_drain", { draining: true });
    await addHost("host_other", { usedMiB: 1000 });
    const a = await addAgent({ hostId: "host_drain", state: "hibernated" });
    const db0 = createDbHostStore(db());
    // The hand-off's row write is slow (a busy database): it arrives after the claim that started behind it.
    let letMark!: () => void;
    const markHeld = new Promise<void>((resolve) => (letMark = resolve));
    const store: HostStore = {
      ...db0,
      markAsleep: async (...args) => {
        await markHeld;
        return db0.markAsleep(...args);
      },
    };
    const events = new EventLog(store, silentLogger);
    const unused = {} as never;
    const fencing = new Fencing({
      hostId: "host_drain",
      vmsDir: "/nonexistent",
      clock: new ManualClock(), // no deadline passes: each write answers
      fs: unused,
      store,
      events,
      vms: unused,
      generations: unused,
      eviction: unused,
      draining: () => true,
    });
    const entry = { spec: { id: a.id }, state: "hibernated", generation: 0 } as unknown as VmEntry;
    const state = async () => (await db().select().from(agents).where(eq(agents.id, a.id)))[0]?.state;

    // A call its gateway can repeat: the draining host hands the sleeping agent off (its row write under way)...
    const handedOff = fencing.handOff(entry);
    // ...and a call it cannot repeat (a large body) starts a wake here: its claim.
    const claim = fencing.ownerCheck(entry).then(
      () => "woken" as const,
      () => "refused" as const,
    );
    for (let i = 0; i < 25 && (await state()) !== "restoring"; i++) await new Promise((r) => setTimeout(r, 20));
    letMark();
    await handedOff;
    // The claim holds (nothing moved the agent yet): the host wakes it. Its transitions queue behind the driver's hold
    // (wake.ts), as they do; a gateway places the agent meanwhile.
    expect(await claim).toBe("woken");
    const release = events.hold(10_000);
    for (const [fromState, toState] of [
      ["hibernated", "restoring"],
      ["restoring", "running"],
    ] as const)
      events.transition(drainHostTransition(a.id, fromState, toState, "request"));
    const placed = await placement().hostFor(a);
    release();
    await events.flush();
    // The log, read by id as the events API reads it, has no transition of the old host after a move; and the agent
    // does not move while it wakes here (never two copies).
    const log = await db().select().from(vmEvents).where(eq(vmEvents.agentId, a.id)).orderBy(asc(vmEvents.id));
    const story = log.map((e) => `${e.hostId}:${e.fromState}>${e.toState}(${e.reason})`).join(" ");
    const moved = log.findIndex((e) => e.reason === "moved");
    expect(moved < 0 ? [] : log.slice(moved + 1).filter((e) => e.hostId === "host_drain"), story).toEqual([]);
    expect(placed.id, story).toBe("host_drain");
    expect(await state()).toBe("running");
  });

  it("a burst of failovers spreads over the live hosts and stays within their capacity", async () => {
    await addHost("host_gone", { ageS: 3600 });
    await addHost("host_left", { capacityMiB: 1024 });
    await addHost("host_right", { capacityMiB: 1024 });
    const victims = await Promise.all(Array.from({ length: 6 }, () => addAgent({ hostId: "host_gone", state: "hibernated" })));
    const p = placement();
    // All at once, as calls to a dead host's agents come in: each moves (process driver: its state is carryable). None
    // of the moved agents is awake yet, so no heartbeat counts them: without this process's note all six took the host
    // that looked emptiest, 1536 MiB on 1024.
    const placed = await Promise.all(victims.map((a) => p.hostFor(a)));
    const count = (id: string) => placed.filter((h) => h.id === id).length;
    expect([count("host_left"), count("host_right")]).toEqual([3, 3]);
    // Past both hosts' capacity the next ones are refused (a 503 to retry), not piled on.
    const more = await Promise.all(Array.from({ length: 4 }, () => addAgent({ hostId: "host_gone", state: "hibernated" })));
    const outcomes = await Promise.all(
      more.map((a) =>
        p.hostFor(a).then(
          (h) => h.id,
          (e: AppError) => e.code,
        ),
      ),
    );
    expect(outcomes.filter((o) => o === "host_left" || o === "host_right")).toHaveLength(2);
    expect(outcomes.filter((o) => o === "host_unavailable")).toHaveLength(2);
  });

  it("a host whose lease ended gets its awake agents' rows stopped and its open runs ended at its last heartbeat, before anyone calls them", async () => {
    await addHost("host_lapsed", { ageS: 3600 });
    await addHost("host_beating");
    const lapsed = await addAgent({ hostId: "host_lapsed", state: "running" });
    const asleep = await addAgent({ hostId: "host_lapsed", state: "hibernated" });
    const fine = await addAgent({ hostId: "host_beating", state: "running" });
    for (const [id, agent, host] of [
      ["run_lapsed000001", lapsed, "host_lapsed"],
      ["run_fine00000001", fine, "host_beating"],
    ] as const) {
      await db().insert(runs).values({
        id,
        agentId: agent.id,
        tenantId: "ten_p",
        hostId: host,
        vmId: "vm_e",
        wokeAt: sql`now() - interval '2 hours'`,
        wakeReason: "request",
        wakeMode: "boot",
      });
    }
    expect(await expireHostLeases(db(), 30_000)).toEqual({ agents: 1, runs: 1 });
    const states = await db()
      .select({ id: agents.id, state: agents.state, hostId: agents.hostId })
      .from(agents)
      .where(sql`${agents.id} in (${lapsed.id}, ${asleep.id}, ${fine.id})`);
    expect(Object.fromEntries(states.map((r) => [r.id, [r.state, r.hostId]]))).toEqual({
      [lapsed.id]: ["stopped", "host_lapsed"],
      [asleep.id]: ["hibernated", "host_lapsed"],
      [fine.id]: ["running", "host_beating"],
    });
    const [run] = await db().select().from(runs).where(eq(runs.id, "run_lapsed000001"));
    const [host] = await db().select().from(hosts).where(eq(hosts.id, "host_lapsed"));
    expect(run).toMatchObject({ sleepReason: "host_lost", sleptAt: host!.lastHeartbeatAt });
    const [other] = await db().select().from(runs).where(eq(runs.id, "run_fine00000001"));
    expect(other!.sleptAt).toBeNull();
    // The lost host's awake agent has it in its event log, at the host's last heartbeat, naming the run that ended.
    expect(await db().select().from(vmEvents).where(eq(vmEvents.agentId, lapsed.id))).toEqual([
      expect.objectContaining({
        at: host!.lastHeartbeatAt,
        hostId: "host_lapsed",
        vmId: vmIdFor(lapsed.id),
        runId: "run_lapsed000001",
        fromState: "running",
        toState: "stopped",
        reason: "host_lost",
      }),
    ]);
    expect(await db().select().from(vmEvents).where(eq(vmEvents.agentId, asleep.id))).toEqual([]);
    expect(await expireHostLeases(db(), 30_000)).toEqual({ agents: 0, runs: 0 });
  });

  it("gateways racing to place the same agents agree on one host each", async () => {
    for (let i = 0; i < 4; i++) await addHost(`host_${i}`, { ageS: i });
    const specs = await Promise.all(Array.from({ length: 10 }, () => addAgent()));
    const gateways = [placement(), placement(), placement()];
    // Shuffle heartbeats while they race so different gateways could see different "freshest" hosts.
    const answers = await Promise.all(
      specs.flatMap((s, i) =>
        gateways.map(async (g, j) => {
          if ((i + j) % 3 === 0)
            await db()
              .update(hosts)
              .set({ lastHeartbeatAt: sql`now()` })
              .where(eq(hosts.id, `host_${(i + j) % 4}`));
          return { agentId: s.id, hostId: (await g.hostFor(s)).id };
        }),
      ),
    );
    for (const s of specs) {
      const recorded = await hostOf(s.id);
      expect(recorded).not.toBeNull();
      expect(new Set(answers.filter((a) => a.agentId === s.id).map((a) => a.hostId))).toEqual(new Set([recorded]));
    }
  });

  it("never placed: no current host; deleted: not found", async () => {
    await addHost("host_x");
    const agent = await addAgent();
    expect(await placement().currentHost(agent.id)).toBeUndefined();
    await db().update(agents).set({ deletedAt: new Date() }).where(eq(agents.id, agent.id));
    await expect(placement().hostFor(agent)).rejects.toMatchObject({ code: "not_found" });
  });

  it("currentHosts: a page's agents in one query, the host-less and deleted ones left out, live as the heartbeat says", async () => {
    await addHost("host_fresh");
    await addHost("host_old", { ageS: 3600 });
    await addHost("host_nourl", { url: null });
    const onFresh = await addAgent({ hostId: "host_fresh", state: "running" });
    const onOld = await addAgent({ hostId: "host_old", state: "hibernated" });
    const noUrl = await addAgent({ hostId: "host_nourl", state: "hibernated" });
    const never = await addAgent();
    const gone = await addAgent({ hostId: "host_fresh", state: "hibernated" });
    await db().update(agents).set({ deletedAt: new Date() }).where(eq(agents.id, gone.id));
    const found = await placement().currentHosts([onFresh.id, onOld.id, noUrl.id, never.id, gone.id, "agt_notanagent0000"]);
    expect(Object.fromEntries(found)).toEqual({
      [onFresh.id]: { id: "host_fresh", url: "http://host_fresh.invalid:8090", live: true, generation: 0 },
      [onOld.id]: { id: "host_old", url: "http://host_old.invalid:8090", live: false, generation: 0 },
    });
    expect((await placement().currentHosts([])).size).toBe(0);
  });

  it("caches an answer for its TTL; forget() drops it", async () => {
    await addHost("host_one");
    await addHost("host_two");
    const clock = new ManualClock();
    const p = createDbPlacement(db(), { liveWindowMs: 30_000, cacheTtlMs: 1000, clock });
    const agent = await addAgent({ hostId: "host_one", state: "hibernated" });
    expect((await p.hostFor(agent)).id).toBe("host_one");
    await db().update(agents).set({ hostId: "host_two" }).where(eq(agents.id, agent.id));
    expect((await p.hostFor(agent)).id).toBe("host_one"); // cached
    clock.advance(1000);
    expect((await p.hostFor(agent)).id).toBe("host_two");
    await db().update(agents).set({ hostId: "host_one" }).where(eq(agents.id, agent.id));
    p.forget(agent.id);
    expect((await p.hostFor(agent)).id).toBe("host_one");
  });
});

/** A transition the draining test host writes for agent `agentId` of the test tenant. */
function drainHostTransition(agentId: string, fromState: string, toState: string, reason: string) {
  return {
    at: new Date(),
    hostId: "host_drain",
    agentId,
    tenantId: "ten_p",
    vmId: vmIdFor(agentId),
    runId: null,
    fromState,
    toState,
    reason,
    timings: null,
    detail: null,
    generation: 0,
  };
}

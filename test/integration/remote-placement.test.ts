// Placement on real Postgres: which host a new agent goes to, that it stays there, and that racing gateways agree.
import { beforeAll, afterAll, beforeEach, describe, expect, it } from "vitest";
import { eq, sql } from "drizzle-orm";
import { ManualClock, systemClock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import { agents, hosts, tenants } from "../../schema/core.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import { chooseHost, createDbPlacement, type HostLoad } from "../../gateway/placement.ts";
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
  await database.db.execute(sql`update agents set host_id = null, deleted_at = now()`);
  await database.db.delete(hosts);
});

const db = () => database.db;

async function addHost(id: string, opts: { ageS?: number; capacityMiB?: number; url?: string | null } = {}): Promise<void> {
  await db()
    .insert(hosts)
    .values({ id, url: opts.url === undefined ? `http://${id}.invalid:8090` : opts.url, driver: "process", capacityMiB: opts.capacityMiB ?? 4096, lastHeartbeatAt: sql`now() - make_interval(secs => ${opts.ageS ?? 0})` });
}

async function addAgent(opts: { memMiB?: number; hostId?: string; state?: string } = {}): Promise<AgentSpec> {
  const id = newId("agent");
  const memMiB = opts.memMiB ?? 256;
  await db().insert(agents).values({ id, tenantId: "ten_p", name: "a", image: "demo", memMiB, hostId: opts.hostId ?? null, state: opts.state ?? "creating" });
  return { id, tenantId: "ten_p", image: "demo", vcpus: 1, memMiB, idleTimeoutMs: 60_000, streamIdleMs: 60_000, allowEgress: false };
}

async function hostOf(agentId: string): Promise<string | null> {
  const [row] = await db().select({ hostId: agents.hostId }).from(agents).where(eq(agents.id, agentId));
  return row?.hostId ?? null;
}

const placement = (cacheTtlMs = 0) => createDbPlacement(db(), { liveWindowMs: 30_000, cacheTtlMs, clock: systemClock });

describe("chooseHost", () => {
  const at = (s: number) => new Date(Date.UTC(2026, 0, 1, 0, 0, s));
  const h = (id: string, capacityMiB: number, usedMiB: number, beatS: number): HostLoad => ({ id, url: "http://x", capacityMiB, usedMiB, lastHeartbeatAt: at(beatS) });

  it("takes the freshest heartbeat among hosts with room", () => {
    expect(chooseHost([h("a", 1024, 0, 1), h("b", 1024, 0, 3), h("c", 1024, 900, 5)], 256)?.id).toBe("b");
  });
  it("counts exactly: free memory equal to the need is room", () => {
    expect(chooseHost([h("a", 1024, 768, 1)], 256)?.id).toBe("a");
    expect(chooseHost([h("a", 1024, 769, 1)], 256)).toBeUndefined();
  });
  it("breaks heartbeat ties by the most room", () => {
    expect(chooseHost([h("a", 1024, 512, 2), h("b", 2048, 0, 2)], 256)?.id).toBe("b");
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
    const err = await placement().hostFor(agent).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AppError);
    expect(err).toMatchObject({ code: "wake_failed", status: 503, retryAfterS: 10 });
    expect(await hostOf(agent.id)).toBeNull();
  });

  it("places a new agent on the live host with the freshest heartbeat and records it; then it stays there", async () => {
    await addHost("host_a", { ageS: 5 });
    await addHost("host_b", { ageS: 0 });
    await addHost("host_old", { ageS: 3600 });
    const agent = await addAgent();
    expect(await placement().hostFor(agent)).toEqual({ id: "host_b", url: "http://host_b.invalid:8090", live: true });
    expect(await hostOf(agent.id)).toBe("host_b");
    // host_a beats now, fresher than host_b: the agent does not move.
    await db().update(hosts).set({ lastHeartbeatAt: sql`now() + interval '1 second'` }).where(eq(hosts.id, "host_a"));
    await db().update(agents).set({ state: "hibernated" }).where(eq(agents.id, agent.id));
    expect((await placement().hostFor(agent)).id).toBe("host_b");
    expect((await placement().currentHost(agent.id))?.id).toBe("host_b");
  });

  it("room counts the memory of awake agents only (hibernated ones cost disk)", async () => {
    await addHost("host_full", { ageS: 0, capacityMiB: 1024 });
    await addHost("host_spare", { ageS: 10, capacityMiB: 1024 });
    await addAgent({ memMiB: 900, hostId: "host_full", state: "running" });
    await addAgent({ memMiB: 900, hostId: "host_spare", state: "hibernated" });
    const agent = await addAgent({ memMiB: 256 });
    expect((await placement().hostFor(agent)).id).toBe("host_spare");
  });

  it("an agent whose host stopped heartbeating: moved when it never ran, kept (its snapshot is there) otherwise", async () => {
    await addHost("host_dead", { ageS: 3600 });
    await addHost("host_alive", { ageS: 0 });
    const fresh = await addAgent({ hostId: "host_dead", state: "creating" });
    expect((await placement().hostFor(fresh)).id).toBe("host_alive");
    expect(await hostOf(fresh.id)).toBe("host_alive");
    const slept = await addAgent({ hostId: "host_dead", state: "hibernated" });
    expect(await placement().hostFor(slept)).toEqual({ id: "host_dead", url: "http://host_dead.invalid:8090", live: false });
    expect(await hostOf(slept.id)).toBe("host_dead");
  });

  it("gateways racing to place the same agents agree on one host each", async () => {
    for (let i = 0; i < 4; i++) await addHost(`host_${i}`, { ageS: i });
    const specs = await Promise.all(Array.from({ length: 10 }, () => addAgent()));
    const gateways = [placement(), placement(), placement()];
    // Shuffle heartbeats while they race so different gateways could see different "freshest" hosts.
    const answers = await Promise.all(
      specs.flatMap((s, i) => gateways.map(async (g, j) => {
        if ((i + j) % 3 === 0) await db().update(hosts).set({ lastHeartbeatAt: sql`now()` }).where(eq(hosts.id, `host_${(i + j) % 4}`));
        return { agentId: s.id, hostId: (await g.hostFor(s)).id };
      })),
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
      [onFresh.id]: { id: "host_fresh", url: "http://host_fresh.invalid:8090", live: true },
      [onOld.id]: { id: "host_old", url: "http://host_old.invalid:8090", live: false },
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

// Viewers' sessions on desktop agents in real Postgres (gateway/desktop/session-store.ts): one control holder an agent across gateways, a dead gateway's session over at its expiry, and the in-memory store answering the same.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { agents, desktopSessions, tenants } from "../../schema/core.ts";
import { createDesktopSessionStore } from "../../gateway/desktop/session-store.ts";
import { controlHolder, memoryDesktopSessions, type DesktopSession, type DesktopSessions } from "../../gateway/desktop/sessions.ts";
import { newId } from "../../lib/ids.ts";
import { freshDatabase } from "../helpers/db.ts";
import { eq } from "drizzle-orm";

let database: Awaited<ReturnType<typeof freshDatabase>>;
const t0 = new Date("2026-12-05T10:00:00Z");
const at = (s: number) => new Date(t0.getTime() + s * 1000);
let agentSeq = 0;

function session(agentId: string, mode: "view" | "control", startS: number, actor = "alice", ttlS = 30): DesktopSession {
  return {
    id: newId("desktopSession"),
    tenantId: "ten_d",
    agentId,
    mode,
    actor,
    requestId: newId("request"),
    startedAt: at(startS),
    expiresAt: at(startS + ttlS),
  };
}

async function newAgent(): Promise<string> {
  const id = `agt_desk${++agentSeq}`;
  await database.db.insert(agents).values({ id, tenantId: "ten_d", name: id, image: "desktop-agent" });
  return id;
}

beforeAll(async () => {
  database = await freshDatabase();
  await database.db.insert(tenants).values({ id: "ten_d", name: "d" });
});
afterAll(async () => {
  await database?.close();
});

function contract(name: string, make: () => DesktopSessions) {
  describe(name, () => {
    it("one control holder an agent; viewers beside it; the holder named to the next; a closed session frees it", async () => {
      const store = make();
      const agentId = await newAgent();
      const first = await store.open(session(agentId, "control", 0, "alice"));
      expect("session" in first).toBe(true);
      expect("session" in (await store.open(session(agentId, "view", 1, "bob")))).toBe(true);
      const second = await store.open(session(agentId, "control", 2, "carol"));
      expect("heldBy" in second && second.heldBy.actor).toBe("alice");
      expect((await controlHolder(store, agentId, at(3)))?.actor).toBe("alice");
      expect((await store.live(agentId, at(3))).map((s) => `${s.mode}:${s.actor}`)).toEqual(["control:alice", "view:bob"]);

      await store.close((first as { session: DesktopSession }).session.id, at(4));
      expect(await controlHolder(store, agentId, at(5))).toBeUndefined();
      expect("session" in (await store.open(session(agentId, "control", 6, "carol")))).toBe(true);
      // another agent's desktop is another matter
      expect("session" in (await store.open(session(await newAgent(), "control", 6, "dave")))).toBe(true);
    });

    it("a session not renewed is over at its expiry (its gateway died); renewed, it lives on", async () => {
      const store = make();
      const agentId = await newAgent();
      const held = await store.open(session(agentId, "control", 0, "alice", 30));
      const id = (held as { session: DesktopSession }).session.id;
      await store.renew(id, at(60));
      expect("heldBy" in (await store.open(session(agentId, "control", 45, "bob")))).toBe(true);
      expect((await controlHolder(store, agentId, at(59)))?.actor).toBe("alice");
      expect(await controlHolder(store, agentId, at(61))).toBeUndefined();
      expect("session" in (await store.open(session(agentId, "control", 61, "bob")))).toBe(true);
      expect((await controlHolder(store, agentId, at(62)))?.actor).toBe("bob");
    });
  });
}

contract("desktop sessions in Postgres", () => createDesktopSessionStore(database.db));
contract("desktop sessions in memory", () => memoryDesktopSessions());

describe("desktop sessions in Postgres, what the rows keep", () => {
  it("an expired holder's row ends at its expiry when the next one opens; concurrent takeovers: exactly one wins", async () => {
    const store = createDesktopSessionStore(database.db);
    const agentId = await newAgent();
    const dead = session(agentId, "control", 0, "alice", 30);
    await store.open(dead);
    await store.open(session(agentId, "control", 100, "bob"));
    const [row] = await database.db.select().from(desktopSessions).where(eq(desktopSessions.id, dead.id));
    expect(row!.endedAt?.toISOString()).toBe(at(30).toISOString());

    const other = await newAgent();
    // Two gateways, two stores, the same database: the unique index decides.
    const stores = [createDesktopSessionStore(database.db), createDesktopSessionStore(database.db)];
    const results = await Promise.all(Array.from({ length: 6 }, (_, i) => stores[i % 2]!.open(session(other, "control", 0, `user${i}`))));
    expect(results.filter((r) => "session" in r)).toHaveLength(1);
    const winner = (results.find((r) => "session" in r) as { session: DesktopSession }).session.actor;
    for (const r of results) if ("heldBy" in r) expect(r.heldBy.actor).toBe(winner);
  });
});

// What a gateway keeps for a Postgres outage: placements and agent rows it loaded are served past their TTL when a refresh fails as unavailable;
// and the client's gate, which makes queries fail at once (instead of queueing) while the database is known down.
import { describe, expect, it } from "vitest";
import { ManualClock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import type { Db } from "../../schema/postgres.ts";
import { createDbPlacement } from "../../gateway/placement.ts";
import { createAgentCache } from "../../gateway/proxy/agents.ts";
import { gatedClient } from "../../schema/db-gate.ts";
import { readinessResponse } from "../../lib/readiness.ts";
import type { AgentRow } from "../../gateway/agents/repo.ts";

const refused = () => Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:5432"), { code: "ECONNREFUSED" });

/** Just enough of a drizzle db for placement's raw queries: one agent on one live host, or a refused connection. */
function fakeDb(state: { down: boolean; queries: number; hostUrl: string }): Db {
  return {
    async execute() {
      state.queries++;
      if (state.down) throw Object.assign(new Error("Failed query"), { cause: refused() });
      return [{ host_id: "host_a", state: "running", url: state.hostUrl, live: true }];
    },
  } as unknown as Db;
}

const agent = { id: "agt_a", memMiB: 256 } as AgentSpec;

async function codeOf(p: Promise<unknown>): Promise<string | undefined> {
  try {
    await p;
    return undefined;
  } catch (err) {
    return err instanceof AppError ? err.code : "raw";
  }
}

describe("placement during an outage", () => {
  it("serves the host it resolved before, past the TTL, asking the database once per TTL; an agent it never placed is 503", async () => {
    const state = { down: false, queries: 0, hostUrl: "http://h1" };
    const clock = new ManualClock();
    const outages: unknown[] = [];
    const placement = createDbPlacement(fakeDb(state), { liveWindowMs: 30_000, cacheTtlMs: 2000, clock, onOutage: (e) => outages.push(e) });
    expect((await placement.hostFor(agent)).url).toBe("http://h1");
    state.down = true;
    clock.advance(60_000);
    expect((await placement.hostFor(agent)).url).toBe("http://h1");
    expect((await placement.hostFor(agent)).url).toBe("http://h1"); // trusted for another TTL: no second wait
    expect((await placement.currentHost(agent.id))?.url).toBe("http://h1");
    expect(state.queries).toBe(2);
    expect(outages).toHaveLength(1);
    expect(await codeOf(placement.hostFor({ ...agent, id: "agt_new" }))).toBe("database_unavailable");
    // The host refused or did not answer: the kept answer is dropped, and without the database there is none.
    placement.forget(agent.id);
    expect(await codeOf(placement.hostFor(agent))).toBe("database_unavailable");
    // Back: the database's answer wins at once.
    state.down = false;
    state.hostUrl = "http://h2";
    expect((await placement.hostFor(agent)).url).toBe("http://h2");
  });
});

describe("agent cache during an outage", () => {
  const row = { id: "agt_a", tenantId: "ten_a", state: "running" } as AgentRow;

  it("serves a loaded row at any age while refreshes fail as unavailable, and does not make calls wait for them", async () => {
    let now = 0;
    const state = { down: false, loads: 0 };
    let release: (() => void) | undefined;
    const repo = {
      async get(id: string) {
        state.loads++;
        if (state.down) {
          await new Promise<void>((r) => (release = r));
          throw refused();
        }
        return id === "agt_a" ? row : undefined;
      },
    };
    const cache = createAgentCache(repo, undefined, { ttlMs: 2000, maxStaleMs: 30_000, maxEntries: 10, now: () => now });
    expect((await cache.get("agt_a"))?.row).toBe(row);
    state.down = true;
    now = 120_000; // far past maxStaleMs: the first call waits for one refresh, which fails as unavailable
    const first = cache.get("agt_a");
    release!();
    expect((await first)?.row).toBe(row);
    // From now on the row is served at once (peek answers synchronously: the fast path does not wait at all).
    expect(cache.peek("agt_a")?.row).toBe(row);
    expect((await cache.get("agt_a"))?.row).toBe(row);
    release?.();
    // An agent never loaded cannot be answered without the database.
    const unknown = cache.get("agt_b");
    release!();
    expect(await codeOf(unknown)).toBe("database_unavailable");
    // Back: the next refresh succeeds and clears the outage.
    state.down = false;
    expect(await cache.get("agt_b")).toBeUndefined();
  });
});

describe("the client's gate", () => {
  /** A postgres.js-shaped client: each query is a thenable that waits until the test settles it. */
  function fakeClient() {
    const sent: { settle: (err?: Error) => void }[] = [];
    const client = {
      name: "first",
      unsafe() {
        let settle!: (err?: Error) => void;
        const p = new Promise<unknown[]>((resolve, reject) => (settle = (err) => (err ? reject(err) : resolve([]))));
        sent.push({ settle });
        return Object.assign(p, { values: () => p });
      },
      begin: () => Promise.resolve("tx"),
    };
    return { client, sent };
  }

  it("after a query failed as unavailable, one probe goes through and the rest fail at once; the first answer opens it", async () => {
    const { client, sent } = fakeClient();
    const gated = gatedClient(client, 5000);
    expect(gated.name).toBe("first");
    const first = gated.unsafe();
    sent[0]!.settle(refused());
    await expect(first).rejects.toThrow(/ECONNREFUSED/);
    const probe = gated.unsafe();
    const others = [gated.unsafe(), gated.unsafe(), gated.begin()];
    expect(sent).toHaveLength(2); // only the probe reached the driver
    for (const o of others) await expect(o).rejects.toMatchObject({ code: "DATABASE_UNAVAILABLE" });
    sent[1]!.settle();
    await probe;
    const after = gated.unsafe();
    expect(sent).toHaveLength(3);
    sent[2]!.settle();
    await after;
  });
});

describe("/readyz", () => {
  it("200 with each dependency up; a check that fails or hangs past the timeout is 503 naming it down, with Retry-After", async () => {
    const up = await readinessResponse({ database: { code: "database_unavailable", check: async () => 1 } }, "req_ready1");
    expect(up.status).toBe(200);
    expect(await up.json()).toEqual({ ok: true, database: "up" });
    const started = performance.now();
    const hung = await readinessResponse({ database: { code: "database_unavailable", check: () => new Promise(() => {}) } }, "req_ready2", 100);
    expect(performance.now() - started).toBeLessThan(1000);
    expect(hung.status).toBe(503);
    expect(hung.headers.get("retry-after")).toBe("2");
    expect(await hung.json()).toMatchObject({
      error: { code: "database_unavailable", message: "not ready: database down", requestId: "req_ready2", details: { database: "down" } },
    });
  });
});

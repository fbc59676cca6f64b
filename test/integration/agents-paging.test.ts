// GET /v1/agents and /v1/agents/{id}/events over real Postgres: cursors that cross pages with no duplicate or gap, filters, bad input, and a constant number of queries per page.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generateKeyPair, exportJWK, type JWK } from "jose";
import postgres from "postgres";
import { drizzle } from "drizzle-orm/postgres-js";
import { silentLogger } from "../../lib/log.ts";
import { newId } from "../../lib/ids.ts";
import { createGateway } from "../../gateway/app.ts";
import { createAgentRepo } from "../../gateway/agents/repo.ts";
import { createAgentSettingsStore } from "../../gateway/proxy/agents.ts";
import { createJwtAuthenticator } from "../../gateway/auth.ts";
import type { VmStatus } from "../../contracts/agent.ts";
import { fromPrivateJwk, mintToken } from "../../compose/dev-keys.ts";
import { createDbAuditLog } from "../../schema/audit-log.ts";
import * as schema from "../../schema/index.ts";
import type { Db } from "../../schema/db.ts";
import { freshDatabase } from "../helpers/db.ts";
import { fakeFleet } from "../helpers/fake-fleet.ts";

let database: Awaited<ReturnType<typeof freshDatabase>>;
let client: ReturnType<typeof postgres>;
let privateJwk: JWK;
let app: ReturnType<typeof createGateway>;
/** Every SQL statement the gateway sent, in order. */
const statements: string[] = [];
/** Agents a host reports awake, and how the fleet was asked. */
const awake = new Set<string>();
const asked = { status: 0, statuses: 0 };

const fleet = fakeFleet({
  async status(agentId) {
    asked.status++;
    return awake.has(agentId) ? liveStatus(agentId) : undefined;
  },
  async statuses(agentIds) {
    asked.statuses++;
    return new Map(agentIds.filter((id) => awake.has(id)).map((id) => [id, liveStatus(id)]));
  },
});

function liveStatus(agentId: string): VmStatus {
  return { agentId, vmId: "vm_x", state: "running", inFlight: 2, leases: 1, runId: "run_x", lastWakeAt: 1_700_000_000_000, lastActivityAt: undefined };
}

beforeAll(async () => {
  database = await freshDatabase();
  // The gateway's own client, logging each statement: what a page costs in queries is counted, not assumed.
  client = postgres(database.url, { max: 4, onnotice: () => {} });
  const db = drizzle(client, { schema, logger: { logQuery: (query) => void statements.push(query) } }) as unknown as Db;
  const { privateKey } = await generateKeyPair("ES256", { extractable: true });
  privateJwk = { ...(await exportJWK(privateKey)), kid: "k1" };
  const repo = createAgentRepo(db);
  for (const t of ["ten_a", "ten_b", "ten_c", "ten_e", "ten_big"]) await repo.ensureTenant(t, t);
  app = createGateway({
    agents: repo,
    fleet,
    audit: createDbAuditLog(db),
    auth: createJwtAuthenticator({ keys: { jwks: fromPrivateJwk(privateJwk).jwks }, issuer: "agentvm-dev", audience: "agentvm", algorithms: ["ES256"] }),
    log: silentLogger,
    settings: createAgentSettingsStore(db),
    config: {
      domain: undefined,
      maxBodyBytes: 1000,
      maxApiBodyBytes: 10_000,
      images: ["demo", "other"],
      agentDefaults: { vcpus: 1, memMiB: 256, idleTimeoutMs: 1000, streamIdleMs: 1000 },
    },
  });
});
afterAll(async () => {
  await client?.end();
  await database?.close();
});

const auth = async (tenant = "ten_a") => ({ authorization: `Bearer ${await mintToken(privateJwk, { tenant, scopes: ["agents:admin"] })}` });

interface AgentJson {
  id: string;
  name: string;
  image: string;
  state: string;
  inFlight: number;
  limits: { maxBodyBytes: number };
}
interface Page {
  agents: AgentJson[];
  nextCursor: string | null;
}

async function get<T>(path: string, tenant = "ten_a"): Promise<{ status: number; body: T }> {
  const res = await app.request(path, { headers: await auth(tenant) });
  return { status: res.status, body: (await res.json()) as T };
}

/** Follows `nextCursor` from the first page to the last; answers every page. */
async function allPages(query: string, tenant = "ten_a"): Promise<Page[]> {
  const pages: Page[] = [];
  let cursor: string | null = null;
  do {
    const sep = query ? "&" : "";
    const { status, body }: { status: number; body: Page } = await get<Page>(
      `/v1/agents?${query}${cursor ? `${sep}cursor=${encodeURIComponent(cursor)}` : ""}`,
      tenant,
    );
    expect(status).toBe(200);
    pages.push(body);
    cursor = body.nextCursor;
  } while (cursor && pages.length < 100);
  return pages;
}

/** Agents inserted the way the API stores them, in one statement, with the given creation instants and columns. */
async function insertAgents(
  tenantId: string,
  rows: { createdAt: string; name?: string; state?: string; image?: string; imageDigest?: string; deleted?: boolean }[],
): Promise<string[]> {
  const ids = rows.map(() => newId("agent"));
  await client`insert into agents ${client(
    rows.map((r, i) => ({
      id: ids[i]!,
      tenant_id: tenantId,
      name: r.name ?? "bulk",
      image: r.image ?? "demo",
      image_digest: r.imageDigest ?? null,
      state: r.state ?? "creating",
      created_at: r.createdAt,
      deleted_at: r.deleted ? r.createdAt : null,
    })),
  )}`;
  return ids;
}

describe("GET /v1/agents pages with a cursor", () => {
  const created: string[] = [];

  beforeAll(async () => {
    // 250 agents through the API: three pages of 100.
    const h = { ...(await auth()), "content-type": "application/json" };
    for (let i = 0; i < 250; i++) {
      const body = { name: i % 5 === 0 ? `web-${i}` : `worker-${i}`, image: i % 10 === 0 ? "other" : "demo" };
      const res = await app.request("/v1/agents", { method: "POST", body: JSON.stringify(body), headers: h });
      expect(res.status).toBe(201);
      created.push(((await res.json()) as { id: string }).id);
    }
  });

  it("follows cursors across pages in creation order, with no duplicate or gap", async () => {
    const pages = await allPages("limit=100");
    expect(pages.map((p) => p.agents.length)).toEqual([100, 100, 50]);
    expect(pages.at(-1)!.nextCursor).toBeNull();
    expect(pages.flatMap((p) => p.agents.map((a) => a.id))).toEqual(created);
    // The default page is 100 agents.
    const first = await get<Page>("/v1/agents");
    expect(first.body.agents).toHaveLength(100);
    expect(first.body.nextCursor).toEqual(pages[0]!.nextCursor);
  });

  it("filters by name prefix, image and recorded state, and pages within the filter", async () => {
    const web = (await allPages("namePrefix=web-&limit=20")).flatMap((p) => p.agents);
    expect(web.map((a) => a.id)).toEqual(created.filter((_, i) => i % 5 === 0));
    expect(web.every((a) => a.name.startsWith("web-"))).toBe(true);
    const other = (await allPages("image=other&limit=7")).flatMap((p) => p.agents);
    expect(other.map((a) => a.id)).toEqual(created.filter((_, i) => i % 10 === 0));
    // `state` is the row's: the host's live state shows in the answer, the filter reads what the database recorded.
    const asleep = created.filter((_, i) => i % 25 === 3);
    await client`update agents set state = 'hibernated' where id in ${client(asleep)}`;
    awake.add(asleep[0]!);
    const hibernated = (await allPages("state=hibernated&limit=3")).flatMap((p) => p.agents);
    expect(hibernated.map((a) => a.id)).toEqual(asleep);
    expect(hibernated[0]).toMatchObject({ state: "running", inFlight: 2 });
    expect(hibernated[1]).toMatchObject({ state: "hibernated", inFlight: 0 });
    const both = (await allPages("state=hibernated&namePrefix=worker-&image=demo")).flatMap((p) => p.agents);
    expect(both.map((a) => a.id)).toEqual(asleep.filter((id) => created.indexOf(id) % 5 !== 0 && created.indexOf(id) % 10 !== 0));
    expect((await get<Page>("/v1/agents?namePrefix=nobody")).body).toEqual({ agents: [], nextCursor: null });
    // A name prefix is a prefix, not a pattern.
    expect((await get<Page>("/v1/agents?namePrefix=w%25")).body.agents).toEqual([]);
  });

  it("shows each agent's limits from one batched read", async () => {
    const h = { ...(await auth()), "content-type": "application/json" };
    const res = await app.request(`/v1/agents/${created[1]}`, { method: "PATCH", body: JSON.stringify({ limits: { maxBodyBytes: 10 } }), headers: h });
    expect(res.status).toBe(200);
    const page = (await get<Page>("/v1/agents?limit=3")).body;
    expect(page.agents.map((a) => a.limits.maxBodyBytes)).toEqual([1000, 10, 1000]);
  });

  it("another tenant's agents do not exist for the caller; deleted agents are not listed", async () => {
    expect((await get<Page>("/v1/agents", "ten_b")).body).toEqual({ agents: [], nextCursor: null });
    const gone = created[100]!;
    expect((await app.request(`/v1/agents/${gone}`, { method: "DELETE", headers: await auth() })).status).toBe(200);
    const ids = (await allPages("limit=1000")).flatMap((p) => p.agents.map((a) => a.id));
    expect(ids).toHaveLength(249);
    expect(ids).not.toContain(gone);
  });
});

describe("the order is exact where Postgres's clock is finer than JavaScript's", () => {
  it("agents created in the same millisecond, or the same microsecond, are each listed once", async () => {
    const instants = ["2030-01-01T00:00:00.000100Z", "2030-01-01T00:00:00.000200Z", "2030-01-01T00:00:00.000900Z", "2030-01-01T00:00:00.001000Z"];
    const ids = await insertAgents(
      "ten_c",
      [...instants, ...instants, ...instants].map((createdAt) => ({ createdAt })),
    );
    const pages = await allPages("limit=1", "ten_c");
    const listed = pages.flatMap((p) => p.agents.map((a) => a.id));
    expect(listed).toHaveLength(ids.length);
    expect(new Set(listed).size).toBe(ids.length);
    expect(new Set(listed)).toEqual(new Set(ids));
    for (const limit of [2, 5, 7]) expect((await allPages(`limit=${limit}`, "ten_c")).flatMap((p) => p.agents.map((a) => a.id))).toEqual(listed);
  });
});

describe("a page costs the same number of queries at any size", () => {
  it("1,000 agents a page: one query for the page, one for their limits, one status read", async () => {
    const base = Date.parse("2031-01-01T00:00:00Z");
    const ids = await insertAgents(
      "ten_big",
      Array.from({ length: 2500 }, (_, i) => ({ createdAt: new Date(base + i).toISOString(), name: `a${i}` })),
    );
    const cost = async (query: string) => {
      statements.length = 0;
      asked.status = 0;
      asked.statuses = 0;
      const { status, body } = await get<Page>(`/v1/agents?${query}`, "ten_big");
      expect(status).toBe(200);
      // Authentication reads nothing from the database here (a JWT); every statement is the list's.
      return { body, queries: statements.length, status: asked.status, statuses: asked.statuses };
    };
    const small = await cost("limit=10");
    const large = await cost("limit=1000");
    expect(large.body.agents).toHaveLength(1000);
    expect(large.body.agents.map((a) => a.id)).toEqual(ids.slice(0, 1000));
    expect(small.queries).toBe(2);
    expect(large.queries).toBe(small.queries);
    expect([large.status, large.statuses]).toEqual([0, 1]);
    const next = await cost(`limit=1000&cursor=${encodeURIComponent(large.body.nextCursor!)}`);
    expect(next.body.agents.map((a) => a.id)).toEqual(ids.slice(1000, 2000));
    expect(next.queries).toBe(2);
    // The page is read by the keyset index, not by sorting the tenant's agents. With statistics of what was just
    // inserted (without them the planner guesses one row and any index will do: this failed twice in full runs,
    // whenever autovacuum had not analyzed the table yet).
    await client.unsafe("analyze agents");
    const plan = await client.unsafe(
      `explain select * from agents where tenant_id = 'ten_big' and deleted_at is null and (created_at, id) > ('2031-01-01T00:00:01Z'::timestamptz, '') order by created_at, id limit 101`,
    );
    expect(plan.map((r) => Object.values(r)[0]).join("\n")).toContain("agents_tenant_page_idx");
  });
});

describe("bad paging input is a 400 with the envelope", () => {
  it("limits out of range, cursors this list did not give", async () => {
    const cursorOf = (v: unknown) => Buffer.from(JSON.stringify(v)).toString("base64url");
    for (const q of [
      "limit=0",
      "limit=1001",
      "limit=x",
      "limit=1.5",
      "cursor=%%%",
      `cursor=${cursorOf([1, 2, 3])}`,
      `cursor=${cursorOf(["x", "y"])}`,
      `cursor=${cursorOf([-1, "agt_x"])}`,
      `cursor=${cursorOf([1e300, "agt_x"])}`,
      "state=asleep",
      "image=Not%20An%20Image",
    ]) {
      const res = await app.request(`/v1/agents?${q}`, { headers: await auth() });
      expect(res.status, q).toBe(400);
      const body = (await res.json()) as { error: { code: string; message: string; requestId: string } };
      expect(body.error.code, q).toBe("bad_request");
      expect(body.error.requestId).toBe(res.headers.get("x-request-id"));
    }
  });
});

describe("GET /v1/agents/{id}/events pages newest first and filters by time", () => {
  it("follows cursors, filters by since/until, refuses bad instants", async () => {
    const [agentId] = await insertAgents("ten_e", [{ createdAt: "2030-06-01T00:00:00Z", name: "events" }]);
    const at = (i: number) => new Date(Date.parse("2030-06-01T00:00:00Z") + i * 60_000).toISOString();
    await client`insert into vm_events ${client(
      Array.from({ length: 25 }, (_, i) => ({
        at: at(i),
        host_id: "host_x",
        agent_id: agentId!,
        vm_id: "vm_x",
        from_state: "hibernated",
        to_state: "running",
        reason: "request",
      })),
    )}`;
    type Events = { events: { id: number; at: string }[]; nextCursor: string | null };
    const seen: { id: number; at: string }[] = [];
    let cursor: string | null = null;
    let pages = 0;
    do {
      const { status, body }: { status: number; body: Events } = await get<Events>(
        `/v1/agents/${agentId}/events?limit=10${cursor ? `&cursor=${cursor}` : ""}`,
        "ten_e",
      );
      expect(status).toBe(200);
      seen.push(...body.events);
      cursor = body.nextCursor;
      pages++;
    } while (cursor);
    expect(pages).toBe(3);
    expect(seen).toHaveLength(25);
    expect(seen.map((e) => e.at)).toEqual(Array.from({ length: 25 }, (_, i) => at(24 - i)));
    const window = (await get<Events>(`/v1/agents/${agentId}/events?since=${at(5)}&until=${encodeURIComponent(at(8).replace("Z", "+00:00"))}`, "ten_e")).body;
    expect(window.events.map((e) => e.at)).toEqual([at(7), at(6), at(5)]);
    expect(window.nextCursor).toBeNull();
    for (const q of ["since=yesterday", "since=1969-12-31T23:59:59Z", "until=2030-02-30T00:00:00Z", "since=2030-01-01", "limit=0", "cursor=abc"]) {
      const res = await app.request(`/v1/agents/${agentId}/events?${q}`, { headers: await auth("ten_e") });
      expect(res.status, q).toBe(400);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe("bad_request");
    }
  });
});

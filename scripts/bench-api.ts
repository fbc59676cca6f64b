// `npm run bench:api`: what a page of GET /v1/agents costs with 10,000 agents in one tenant, beside the same page with 100.
//
// The gateway runs as `npm start` runs it (scripts/start.ts in its own process, process driver) over a throwaway real
// Postgres (scripts/postgres-server.ts). Agents are never called (no VM runs). The demo tenant gets 100 agents (the
// demo agent and the rest created through the API), then grows to BENCH_AGENTS: BENCH_API_AGENTS of them are created
// through the API, the bulk inserted directly in SQL with the columns the API writes (creation instants 1 ms apart).
// At each size, over real HTTP (fetch, keep-alive), sequentially, after a warm-up:
//   first page   GET /v1/agents?limit=100
//   middle page  GET /v1/agents?limit=100&cursor=… where the cursor is the one reached by following `nextCursor`
//                through pages of 50 to the middle of the list (at 100 agents that page holds the last 50)
// and at the larger size the walk through every page (limit=100), checked for no duplicate or gap.
// Prints one table and, last, `RESULT {json}` (ratio = first-page p50 at BENCH_AGENTS / first-page p50 at 100).
//
// | variable | default | meaning |
// | BENCH_AGENTS | 10000 | agents in the tenant for the large measurement |
// | BENCH_API_AGENTS | 500 | of which created through the API (the first 100 always are; the rest bulk in SQL) |
// | BENCH_REQUESTS | 50 | timed requests per measurement (at least 30) |
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import postgres from "postgres";
import { int } from "../lib/env.ts";
import { newId } from "../lib/ids.ts";
import { startPostgres, type PgServer } from "./postgres-server.ts";
import { startSystem, type StartedSystem } from "./bench-start.ts";
import { stopChild } from "./bench/children.ts";
import { percentile, printResult, round } from "./bench/figures.ts";

const env = process.env;
const largeCount = int(env, "BENCH_AGENTS", 10_000, { min: 200, max: 1_000_000 });
const apiCount = int(env, "BENCH_API_AGENTS", 500, { min: 100, max: largeCount });
const requests = int(env, "BENCH_REQUESTS", 50, { min: 30, max: 100_000 });
const smallCount = 100;
const pageLimit = 100;
const warmups = 30;

const root = fileURLToPath(new URL("..", import.meta.url));
const work = mkdtempSync(join(tmpdir(), "agentvm-bench-api-"));
const log = (msg: string) => console.error(`[bench-api] ${msg}`);
let gateway: ChildProcess | undefined;
let pg: PgServer | undefined;

interface Page {
  agents: { id: string }[];
  nextCursor: string | null;
}

interface Timing {
  p50Ms: number;
  p99Ms: number;
  items: number;
  bytes: number;
}

/** The gateway as `npm start` runs it, over `databaseUrl`: its URL and the demo tenant's token. */
function startGateway(databaseUrl: string): Promise<StartedSystem> {
  return startSystem({ root, dataDir: join(work, "data"), env, databaseUrl, onSpawn: (child) => (gateway = child) });
}

async function stopAll(): Promise<void> {
  if (gateway) await stopChild(gateway, "SIGINT", 10_000);
  await pg?.stop();
  rmSync(work, { recursive: true, force: true });
}

async function main(): Promise<void> {
  pg = await startPostgres();
  const sql = postgres(pg.url, { max: 2, onnotice: () => {} });
  log(`postgres at ${pg.url}; starting the gateway (npm start's program, process driver)`);
  const { url, token } = await startGateway(pg.url);
  const headers = { authorization: `Bearer ${token}`, "content-type": "application/json" };

  async function list(query: string): Promise<{ page: Page; bytes: number }> {
    const res = await fetch(`${url}/v1/agents?${query}`, { headers });
    const text = await res.text();
    if (res.status !== 200) throw new Error(`GET /v1/agents?${query}: ${res.status} ${text.slice(0, 300)}`);
    return { page: JSON.parse(text) as Page, bytes: text.length };
  }

  async function createThroughApi(n: number): Promise<void> {
    for (let i = 0; i < n; i++) {
      const res = await fetch(`${url}/v1/agents`, { method: "POST", headers, body: JSON.stringify({ name: `api-${i}` }) });
      if (res.status !== 201) throw new Error(`POST /v1/agents: ${res.status} ${await res.text()}`);
      await res.arrayBuffer();
    }
  }

  /** The bulk, as the API would write it (the same columns and defaults), in statements of 1,000 rows. */
  async function insertInSql(n: number): Promise<void> {
    const [tenant] = await sql<{ tenant_id: string; vcpus: number; mem_mib: number; disk_mib: number; idle_timeout_ms: number; stream_idle_ms: number }[]>`
      select tenant_id, vcpus, mem_mib, disk_mib, idle_timeout_ms, stream_idle_ms from agents where name like 'api-%' limit 1`;
    if (!tenant) throw new Error("no agent created through the API to copy the columns of");
    const start = Date.now();
    for (let done = 0; done < n; done += 1000) {
      const rows = Array.from({ length: Math.min(1000, n - done) }, (_, i) => ({
        ...tenant,
        id: newId("agent"),
        name: `bulk-${done + i}`,
        image: "demo",
        image_digest: null,
        public: false,
        allow_egress: false,
        non_waking: null,
        created_at: new Date(start + done + i).toISOString(),
      }));
      await sql`insert into agents ${sql(rows)}`;
    }
  }

  /** The cursor to the middle of the list: `nextCursor` followed through pages of 50. */
  async function middleCursor(total: number): Promise<string> {
    let cursor: string | null = null;
    for (let seen = 0; seen < total / 2; ) {
      const { page }: { page: Page } = await list(`limit=50${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
      seen += page.agents.length;
      cursor = page.nextCursor;
      if (!cursor) throw new Error("the list ended before its middle");
    }
    return cursor!;
  }

  async function time(query: string): Promise<Timing> {
    for (let i = 0; i < warmups; i++) await list(query);
    const ms: number[] = [];
    let last = { page: { agents: [], nextCursor: null } as Page, bytes: 0 };
    for (let i = 0; i < requests; i++) {
      const t0 = performance.now();
      last = await list(query);
      ms.push(performance.now() - t0);
    }
    return { p50Ms: percentile(ms, 50), p99Ms: percentile(ms, 99), items: last.page.agents.length, bytes: last.bytes };
  }

  async function measure(total: number): Promise<{ first: Timing; middle: Timing }> {
    const first = await time(`limit=${pageLimit}`);
    const middle = await time(`limit=${pageLimit}&cursor=${encodeURIComponent(await middleCursor(total))}`);
    return { first, middle };
  }

  /** Every page, in order: the time it took and whether each agent came exactly once. */
  async function walk(total: number): Promise<{ ms: number; pages: number; unique: number }> {
    const ids = new Set<string>();
    let cursor: string | null = null;
    let pages = 0;
    const t0 = performance.now();
    do {
      const { page }: { page: Page } = await list(`limit=${pageLimit}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
      for (const a of page.agents) ids.add(a.id);
      cursor = page.nextCursor;
      pages++;
    } while (cursor);
    const ms = performance.now() - t0;
    if (ids.size !== total) throw new Error(`walked ${ids.size} distinct agents of ${total}`);
    return { ms, pages, unique: ids.size };
  }

  // The demo agent is the first; the other 99 come through the API.
  await createThroughApi(smallCount - 1);
  const [count] = await sql<{ n: number }[]>`select count(*)::int as n from agents where deleted_at is null`;
  if (count!.n !== smallCount) throw new Error(`expected ${smallCount} agents, found ${count!.n}`);
  log(`${smallCount} agents: measuring`);
  const small = await measure(smallCount);

  const moreThroughApi = apiCount - smallCount;
  log(`adding ${moreThroughApi} agents through the API and ${largeCount - apiCount} in SQL`);
  await createThroughApi(moreThroughApi);
  await insertInSql(largeCount - apiCount);
  log(`${largeCount} agents: measuring`);
  const large = await measure(largeCount);
  const walked = await walk(largeCount);
  await sql.end();

  console.log(`\nGET /v1/agents over HTTP, ${requests} sequential requests each after ${warmups} warm-up (p50 / p99 ms; items and bytes of the answer)`);
  console.log("agents   page     p50 ms   p99 ms   items    bytes");
  for (const [n, r] of [
    [smallCount, small],
    [largeCount, large],
  ] as const) {
    for (const [name, t] of [
      ["first", r.first],
      ["middle", r.middle],
    ] as const) {
      console.log(
        `${String(n).padStart(6)}   ${name.padEnd(6)} ${t.p50Ms.toFixed(2).padStart(8)} ${t.p99Ms.toFixed(2).padStart(8)} ${String(t.items).padStart(7)} ${String(t.bytes).padStart(8)}`,
      );
    }
  }
  console.log(
    `walk of all ${walked.pages} pages at ${largeCount} agents: ${walked.ms.toFixed(0)} ms, ${walked.unique} distinct agents (none repeated or missed)`,
  );
  const result = {
    page_ms_100: round(small.first.p50Ms, 2),
    page_ms_10000: round(large.first.p50Ms, 2),
    ratio: round(large.first.p50Ms / small.first.p50Ms, 2),
    page_p99_ms_100: round(small.first.p99Ms, 2),
    page_p99_ms_10000: round(large.first.p99Ms, 2),
    middle_ms_100: round(small.middle.p50Ms, 2),
    middle_ms_10000: round(large.middle.p50Ms, 2),
    middle_p99_ms_10000: round(large.middle.p99Ms, 2),
    walk_ms_10000: Math.round(walked.ms),
    agents: largeCount,
    agents_via_api: apiCount,
    requests,
    target_ms: 50,
    within_target: large.first.p99Ms <= 50 && large.middle.p99Ms <= 50,
  };
  await stopAll();
  printResult(result);
}

main().catch(async (err: unknown) => {
  console.error(err instanceof Error ? (err.stack ?? err.message) : String(err));
  await stopAll().catch(() => undefined);
  process.exit(1);
});

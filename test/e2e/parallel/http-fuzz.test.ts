// The whole HTTP API under fuzz (scripts/fuzz/): `npm start`'s gateway in its own process, real Postgres, real sockets.
//
// Requests are generated from the document the gateway serves (GET /openapi.json) with fast-check; every answer must be
// a status the document lists for its operation or a generic one (scripts/fuzz/verdict.ts: 400, 401, 403, 404, 405,
// 408, 413, 415, 429, 431), never a 5xx, every error the envelope with a matching x-request-id, ≤ 8 KiB, nothing
// internal in it; the gateway logs no `error` line; afterwards it still serves (healthz, an admin list, the demo agent
// through the proxy) and its RSS is within 64 MiB of what it was after the warm-up. The seed is printed; replay a
// failure with FUZZ_SEED=<seed>. The long run is `npm run fuzz` (scripts/fuzz.ts).
//
// Slow bodies (8 pieces, 50–150 ms apart) are judged like the rest: answered in time or `408`. Once body deadlines
// (CLIENT_BODY_*) land, a case that trickles below the progress floor is to be asserted `408` here.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freshDatabase } from "../../helpers/db.ts";
import { startTarget, type Target } from "../../../scripts/fuzz/target.ts";
import { campaignFailures, resultLine, runCampaign } from "../../../scripts/fuzz/campaign.ts";

const seed = process.env.FUZZ_SEED ? Number(process.env.FUZZ_SEED) : 20_260_301;
const work = mkdtempSync(join(tmpdir(), "agentvm-http-fuzz-"));
let target: Target | undefined;

beforeAll(async () => {
  // A database of its own on the shared test server (migrated here; the gateway's start migrates it again, a no-op).
  const db = await freshDatabase({ maxConnections: 1 });
  await db.close();
  target = await startTarget({ databaseUrl: db.url, dataDir: join(work, "data"), env: process.env });
});

afterAll(async () => {
  await target?.stop();
  rmSync(work, { recursive: true, force: true });
});

describe("the HTTP API under fuzz", () => {
  it(`answers every generated request with a documented status and the envelope, and keeps serving (seed ${seed})`, { timeout: 150_000 }, async () => {
    console.log(`http-fuzz: seed ${seed} (replay with FUZZ_SEED=${seed})`);
    const result = await runCampaign(target!, {
      seed,
      runs: 3000,
      seconds: 60,
      warmupRuns: 400,
      concurrency: 4,
      slow: true,
      trickleMs: { min: 50, max: 150 },
      requestTimeoutMs: 30_000,
      log: (l) => console.log(l),
    });
    const failures = campaignFailures(result, { rssMarginKiB: 64 * 1024, minRequests: 1000 });
    console.log(resultLine(result, failures));
    expect(target!.exited(), "the gateway exited during the run").toBeUndefined();
    expect(failures, `seed ${seed}:\n${failures.join("\n")}`).toEqual([]);
    // Every kind of answer was seen: successes, refusals of every kind, and statuses the parser gives.
    for (const s of ["200", "400", "401", "403", "404"]) expect(result.statuses[s] ?? 0, `status ${s}`).toBeGreaterThan(0);
  });
});

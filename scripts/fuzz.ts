// `npm run fuzz`: the long fuzz of the whole HTTP API against `npm start`'s gateway (own process, real Postgres); prints `RESULT {json}`.
//
// | variable | default | meaning |
// | FUZZ_SEED | the time | fast-check seed: the same seed generates the same requests (ids learned from answers aside) |
// | FUZZ_SECONDS | 900 | stop after this many seconds (the warm-up included) |
// | FUZZ_RUNS | 1000000 | or after this many requests past the warm-up, whichever comes first |
// | FUZZ_WARMUP | 2000 | requests before RSS is first read |
// | FUZZ_CONCURRENCY | 8 | requests in flight at once |
// | FUZZ_RSS_MARGIN_MIB | 64 | how far RSS at the end may be above RSS after the warm-up, MiB |
// | DATABASE_URL | a throwaway server | Postgres to run against (its `postgres` database is used as is) |
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { int, optStr } from "../lib/env.ts";
import { startPostgres, type PgServer } from "./postgres-server.ts";
import { campaignFailures, resultLine, runCampaign } from "./fuzz/campaign.ts";
import { startTarget, type Target } from "./fuzz/target.ts";

const env = process.env;
const config = {
  seed: int(env, "FUZZ_SEED", Date.now() % 2 ** 31, { min: 0, max: 2 ** 31 - 1 }),
  seconds: int(env, "FUZZ_SECONDS", 900, { min: 1 }),
  runs: int(env, "FUZZ_RUNS", 1_000_000, { min: 1 }),
  warmupRuns: int(env, "FUZZ_WARMUP", 2000, { min: 1 }),
  concurrency: int(env, "FUZZ_CONCURRENCY", 8, { min: 1, max: 256 }),
  rssMarginKiB: int(env, "FUZZ_RSS_MARGIN_MIB", 64, { min: 1 }) * 1024,
  databaseUrl: optStr(env, "DATABASE_URL"),
};

const work = mkdtempSync(join(tmpdir(), "agentvm-fuzz-"));
let pg: PgServer | undefined;
let target: Target | undefined;
try {
  console.error(`fuzz: seed ${config.seed} (replay with FUZZ_SEED=${config.seed})`);
  pg = config.databaseUrl ? undefined : await startPostgres();
  target = await startTarget({ databaseUrl: config.databaseUrl ?? pg!.url, dataDir: join(work, "data"), env });
  const result = await runCampaign(target, { ...config, slow: true, requestTimeoutMs: 60_000, log: (l) => console.error(l) });
  const failures = campaignFailures(result, { rssMarginKiB: config.rssMarginKiB, minRequests: 1 });
  for (const f of failures) console.error(`FAIL ${f}`);
  console.log(resultLine(result, failures));
  process.exitCode = failures.length > 0 ? 1 : 0;
} finally {
  await target?.stop();
  await pg?.stop();
  rmSync(work, { recursive: true, force: true });
}

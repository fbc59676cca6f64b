// `npm run audit:verify -- [--tenant T | --all]`: recomputes audit hash chains straight from the database and names the first broken row (exit 1).
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import type { Env } from "../lib/env.ts";
import type { AuditChainVerdict } from "../schema/audit-verify.ts";
import { verifyAllAuditChains, verifyAuditChain } from "../schema/audit-verify.ts";
import { openDatabase, parseDatabaseAppRole, parseDbTimeouts, type DatabaseTarget } from "../schema/db.ts";
import { runIfMain } from "../lib/node-main.ts";

const help = `usage: npm run audit:verify -- (--tenant <id> | --all) [--json]

  --tenant   verify this tenant's chain ('' names the rows without a tenant)
  --all      verify every chain (the default)
  --json     print the verdicts as JSON

The database: DATABASE_URL (Postgres), else the embedded PGlite of \`npm start\` under DATA_DIR/db (default .data/db;
stop \`npm start\` first: PGlite takes one process). Exit codes: 0 every chain verified, 1 a chain is broken (its
first broken row named), 2 bad usage.`;

/** Where the command reads: the same variables `npm start` and the gateways read (DATABASE_URL, DATA_DIR, DATABASE_APP_ROLE, DB_*). */
export function auditVerifyTarget(env: Env): DatabaseTarget {
  const url = env.DATABASE_URL?.trim();
  if (url) return { url, maxConnections: 1, timeouts: parseDbTimeouts(env), appRole: parseDatabaseAppRole(env) };
  return { pgliteDir: join(resolve(env.DATA_DIR?.trim() || ".data"), "db") };
}

/** One line per chain: `ok <chain>: N rows` or `BROKEN <chain>: seq S (id I) <problem>: <message>`. */
export function renderVerdict(v: AuditChainVerdict): string {
  const name = v.chain === "" ? "(no tenant)" : v.chain;
  if (v.ok) return `ok ${name}: ${v.rows} rows, head seq ${v.headSeq}`;
  const b = v.broken;
  return `BROKEN ${name}: seq ${b.seq ?? "-"} (id ${b.id ?? "-"}) ${b.problem}: ${b.message} (${v.rows} rows before it verified)`;
}

export async function main(argv: string[], env: Env = process.env): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        tenant: { type: "string" },
        all: { type: "boolean", default: false },
        json: { type: "boolean", default: false },
        help: { type: "boolean", short: "h", default: false },
      },
      strict: true,
    }));
  } catch (err) {
    console.error(`${err instanceof Error ? err.message : String(err)}\n${help}`);
    return 2;
  }
  if (values.help) {
    console.log(help);
    return 0;
  }
  if (values.tenant !== undefined && values.all) {
    console.error(`--tenant and --all exclude each other\n${help}`);
    return 2;
  }
  const database = await openDatabase(auditVerifyTarget(env), { migrate: false });
  try {
    const verdicts = values.tenant !== undefined ? [await verifyAuditChain(database.db, values.tenant)] : await verifyAllAuditChains(database.db);
    if (values.json) console.log(JSON.stringify(verdicts));
    else for (const v of verdicts) console.log(renderVerdict(v));
    const broken = verdicts.filter((v) => !v.ok).length;
    if (!values.json) console.log(broken === 0 ? `${verdicts.length} chain(s) verified` : `${broken} of ${verdicts.length} chain(s) broken`);
    return broken === 0 ? 0 : 1;
  } finally {
    await database.close();
  }
}

runIfMain(import.meta.url, main);

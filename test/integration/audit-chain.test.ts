// The audit log's hash chain and append-only rules in the database itself (migration 0004), on real Postgres and on embedded PGlite, and the verifier that finds tampering.
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { sql } from "drizzle-orm";
import { drizzle as pgliteDrizzle } from "drizzle-orm/pglite";
import { migrate as pgliteMigrate } from "drizzle-orm/pglite/migrator";
import { drizzle as pgDrizzle } from "drizzle-orm/postgres-js";
import { migrate as pgMigrate } from "drizzle-orm/postgres-js/migrator";
import { PGlite } from "@electric-sql/pglite";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest";
import { nanoid } from "nanoid";
import { createDbAuditLog } from "../../schema/audit-log.ts";
import { verifyAllAuditChains, verifyAuditChain } from "../../schema/audit-verify.ts";
import { migrationsFolder, openDatabase, queryRows, type Database, type Db } from "../../schema/db.ts";
import * as schema from "../../schema/index.ts";
import { freshDatabase } from "../helpers/db.ts";

/** Runs raw SQL as the database's owner (a superuser): PGlite's own session, or a separate postgres.js connection. */
type Owner = {
  run<T>(text: string): Promise<T[]>;
  /** The statements in one transaction. */
  inTx(statements: string[]): Promise<void>;
  close(): Promise<void>;
};

interface Backend {
  name: string;
  open(): Promise<{ database: Database; owner: Owner }>;
}

const postgresBackend: Backend = {
  name: "real Postgres (application pool as agentvm_app)",
  async open() {
    const database = await freshDatabase();
    const client = postgres(database.url, { max: 1, onnotice: () => {} });
    const inTx = async (statements: string[]) => {
      await client.begin(async (tx) => {
        for (const s of statements) await tx.unsafe(s);
      });
    };
    return { database, owner: { run: async <T>(text: string) => (await client.unsafe(text)) as unknown as T[], inTx, close: () => client.end() } };
  },
};

const pgliteBackend: Backend = {
  name: "embedded PGlite",
  async open() {
    const database = await openDatabase({ pgliteMemory: true });
    const inTx = async (statements: string[]) => {
      await database.db.transaction(async (tx) => {
        for (const s of statements) await tx.execute(sql.raw(s));
      });
    };
    return { database, owner: { run: <T>(text: string) => queryRows<T>(database.db, sql.raw(text)), inTx, close: async () => {} } };
  },
};

/** The messages of a rejection and of what it wraps (drizzle wraps the driver's error as `cause`). */
async function failure(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    const parts: string[] = [];
    for (let e: unknown = err; e instanceof Error; e = e.cause) parts.push(e.message);
    return parts.join(" <- ");
  }
  throw new Error("expected a failure");
}

async function seed(db: Db, tenantId: string | null, n: number, actor = "sub_test"): Promise<void> {
  const audit = createDbAuditLog(db);
  for (let i = 0; i < n; i++)
    await audit.record({
      tenantId,
      actor,
      action: "agent.update",
      target: `agt_${i}`,
      requestId: `req_${i}`,
      detail: { i, note: 'é ü \u0001 "q"', nested: { b: 1.5, a: [1, 2] } },
    });
}

describe.each([postgresBackend, pgliteBackend])("audit chain on $name", (backend) => {
  let database: Database;
  let owner: Owner;
  let tenantA: string;
  let tenantB: string;

  beforeAll(async () => {
    ({ database, owner } = await backend.open());
    tenantA = `ten_${nanoid(8).toLowerCase()}`;
    tenantB = `ten_${nanoid(8).toLowerCase()}`;
  });
  afterAll(async () => {
    await owner.close();
    await database.close();
  });

  it("links each tenant's rows: seq 1, 2, …, prev_hash the previous row's hash, the head naming the last; the verifier agrees", async () => {
    await seed(database.db, tenantA, 5);
    await seed(database.db, tenantB, 3);
    await seed(database.db, null, 2, "host_1");
    const rows = await owner.run<{ seq: string; prev_hash: string; hash: string }>(
      `select seq::text, prev_hash, hash from audit_log where tenant_id = '${tenantA}' order by audit_log.seq`,
    );
    expect(rows.map((r) => Number(r.seq))).toEqual([1, 2, 3, 4, 5]);
    expect(rows[0]!.prev_hash).toBe("");
    for (let i = 1; i < rows.length; i++) expect(rows[i]!.prev_hash).toBe(rows[i - 1]!.hash);
    for (const r of rows) expect(r.hash).toMatch(/^[0-9a-f]{64}$/);
    const [head] = await owner.run<{ seq: string; hash: string }>(`select seq::text, hash from audit_chain_heads where chain = '${tenantA}'`);
    expect(head).toEqual({ seq: "5", hash: rows[4]!.hash });
    expect(await verifyAuditChain(database.db, tenantA)).toEqual({ chain: tenantA, ok: true, rows: 5, headSeq: 5, headHash: rows[4]!.hash });
    const all = await verifyAllAuditChains(database.db);
    expect(all.map((v) => [v.chain, v.ok, v.rows])).toEqual(
      expect.arrayContaining([
        [tenantA, true, 5],
        [tenantB, true, 3],
        ["", true, 2],
      ]),
    );
  });

  it("does not depend on session settings: rows written under another TimeZone, DateStyle and extra_float_digits verify", async () => {
    await owner.inTx([
      "set local timezone = 'Pacific/Chatham'",
      "set local datestyle = 'SQL, DMY'",
      "set local extra_float_digits = -15",
      `insert into audit_log (tenant_id, actor, action, target, detail) values ('${tenantB}', 'sub_x', 'x', 'y', '{"f": 0.1, "z": 1e3}')`,
    ]);
    expect(await verifyAuditChain(database.db, tenantB)).toMatchObject({ ok: true, rows: 4 });
  });

  it("refuses UPDATE, DELETE and TRUNCATE, even for the owner (a superuser)", async () => {
    expect(await failure(owner.run(`update audit_log set actor = 'x' where tenant_id = '${tenantA}'`))).toMatch(/audit_log is append-only: UPDATE refused/);
    expect(await failure(owner.run(`delete from audit_log where tenant_id = '${tenantA}'`))).toMatch(/audit_log is append-only: DELETE refused/);
    expect(await failure(owner.run(`truncate audit_log`))).toMatch(/audit_log is append-only: TRUNCATE refused/);
    expect(await failure(owner.run(`delete from audit_chain_heads`))).toMatch(/audit_chain_heads is append-only/);
    // A seq or hash the writer supplies is overwritten by the trigger.
    await owner.run(
      `insert into audit_log (tenant_id, actor, action, target, seq, prev_hash, hash) values ('${tenantA}', 'sub_x', 'forge', 't', 99, 'p', 'h')`,
    );
    const [forged] = await owner.run<{ seq: string; hash: string }>(`select seq::text, hash from audit_log where action = 'forge'`);
    expect(forged!.seq).toBe("6");
    expect(forged!.hash).not.toBe("h");
    expect(await verifyAuditChain(database.db, tenantA)).toMatchObject({ ok: true, rows: 6 });
  });

  describe("a superuser past the triggers (session_replication_role = replica) is found by the verifier", () => {
    const tamper = (statement: string) => owner.inTx(["set local session_replication_role = replica", statement]);

    it("an altered row: hash mismatch naming it", async () => {
      const t = `ten_${nanoid(8).toLowerCase()}`;
      await seed(database.db, t, 6);
      const [row] = await owner.run<{ id: string }>(`select id::text from audit_log where tenant_id = '${t}' and seq = 4`);
      await tamper(`update audit_log set detail = '{"i": 3, "note": "rewritten"}' where id = ${row!.id}`);
      const verdict = await verifyAuditChain(database.db, t);
      expect(verdict).toMatchObject({ ok: false, rows: 3, broken: { problem: "hash_mismatch", seq: 4, id: Number(row!.id) } });
    });

    it("an altered row whose hash was recomputed too: the next row's prev_hash names the break", async () => {
      const t = `ten_${nanoid(8).toLowerCase()}`;
      await seed(database.db, t, 4);
      await tamper(
        `update audit_log set actor = 'someone_else', hash = audit_row_hash(prev_hash, id, seq, tenant_id, at, 'someone_else', action, target, request_id, detail) where tenant_id = '${t}' and seq = 2`,
      );
      expect(await verifyAuditChain(database.db, t)).toMatchObject({ ok: false, broken: { problem: "prev_hash_mismatch", seq: 3 } });
    });

    it("a deleted row: a gap in seq at the row after it", async () => {
      const t = `ten_${nanoid(8).toLowerCase()}`;
      await seed(database.db, t, 5);
      const [after] = await owner.run<{ id: string }>(`select id::text from audit_log where tenant_id = '${t}' and seq = 3`);
      await tamper(`delete from audit_log where tenant_id = '${t}' and seq = 2`);
      const verdict = await verifyAuditChain(database.db, t);
      expect(verdict).toMatchObject({ ok: false, rows: 1, broken: { problem: "seq_gap", seq: 3, id: Number(after!.id) } });
      if (!verdict.ok) expect(verdict.broken.message).toMatch(/expected 2/);
    });

    it("the last rows deleted: the head no longer matches", async () => {
      const t = `ten_${nanoid(8).toLowerCase()}`;
      await seed(database.db, t, 3);
      await tamper(`delete from audit_log where tenant_id = '${t}' and seq = 3`);
      expect(await verifyAuditChain(database.db, t)).toMatchObject({ ok: false, rows: 2, broken: { problem: "head_mismatch", seq: 3 } });
    });

    it("a row inserted with the trigger off: unchained", async () => {
      const t = `ten_${nanoid(8).toLowerCase()}`;
      await seed(database.db, t, 2);
      await tamper(`insert into audit_log (tenant_id, actor, action, target) values ('${t}', 'ghost', 'agent.delete', 'agt_x')`);
      expect(await verifyAuditChain(database.db, t)).toMatchObject({ ok: false, broken: { problem: "unchained_row" } });
    });
  });
});

describe("the application role on real Postgres", () => {
  let database: Awaited<ReturnType<typeof freshDatabase>>;
  const tenant = "ten_roletest";
  beforeAll(async () => {
    database = await freshDatabase({ maxConnections: 20 });
  });
  afterAll(async () => {
    await database.close();
  });

  it("the pool runs as agentvm_app, which may INSERT and SELECT audit rows but not UPDATE, DELETE or TRUNCATE them, nor change the chain heads", async () => {
    const [who] = await queryRows<{ current_user: string }>(database.db, sql`select current_user`);
    expect(who!.current_user).toBe("agentvm_app");
    await seed(database.db, tenant, 2);
    expect(await failure(database.db.execute(sql`update audit_log set actor = 'x'`))).toMatch(/permission denied for table audit_log/);
    expect(await failure(database.db.execute(sql`delete from audit_log`))).toMatch(/permission denied for table audit_log/);
    expect(await failure(database.db.execute(sql`truncate audit_log`))).toMatch(/permission denied for table audit_log/);
    await database.db.execute(sql`select * from audit_chain_heads`);
    expect(await failure(database.db.execute(sql`update audit_chain_heads set seq = 0`))).toMatch(/permission denied for table audit_chain_heads/);
    expect(await failure(database.db.execute(sql`set session_replication_role = replica`))).toMatch(/permission denied/);
    // The other tables keep every right the application needs, tables of later migrations (and their sequences) by default privileges.
    await database.db.execute(sql`update agents set name = name where false`);
    const owner = postgres(database.url, { max: 1, onnotice: () => {} });
    await owner`create table later_migration (id bigserial primary key, x int)`;
    await owner.end();
    await database.db.execute(sql`insert into later_migration (x) values (1)`);
    await database.db.execute(sql`update later_migration set x = 2`);
    await database.db.execute(sql`delete from later_migration`);
    expect(await verifyAuditChain(database.db, tenant)).toMatchObject({ ok: true, rows: 2 });
  });

  it("200 rows from 20 connections at once into one chain: seq 1..200 without gaps, a valid chain", async () => {
    const t = "ten_concurrent";
    const client = postgres(database.url, { max: 20, onnotice: () => {}, connection: { role: "agentvm_app" } });
    try {
      const conns = await Promise.all(Array.from({ length: 20 }, () => client.reserve()));
      const pids = await Promise.all(conns.map(async (c) => (await c`select pg_backend_pid() as pid`)[0]!.pid as number));
      expect(new Set(pids).size).toBe(20);
      await Promise.all(
        conns.map(async (c, w) => {
          for (let i = 0; i < 10; i++) {
            // A transaction that holds the chain head a moment after its insert: the others queue on it.
            await c`begin`;
            await c`insert into audit_log (tenant_id, actor, action, target, detail) values (${t}, ${`worker_${w}`}, 'agent.wake', ${`agt_${i}`}, ${c.json({ w, i })})`;
            await c`select pg_sleep(0.001)`;
            await c`commit`;
          }
        }),
      );
      for (const c of conns) c.release();
    } finally {
      await client.end();
    }
    const seqs = await queryRows<{ seq: string }>(database.db, sql`select seq::text from audit_log where tenant_id = ${t} order by audit_log.seq`);
    expect(seqs.map((r) => Number(r.seq))).toEqual(Array.from({ length: 200 }, (_, i) => i + 1));
    expect(await verifyAuditChain(database.db, t, { batchRows: 7 })).toMatchObject({ ok: true, rows: 200, headSeq: 200 });
  });

  it("DATABASE_APP_ROLE naming a role the user cannot run as fails at open, naming the fix", async () => {
    await expect(openDatabase({ url: database.url, appRole: "nosuch_role" })).rejects.toThrow(
      /DATABASE_APP_ROLE=nosuch_role: the database user cannot run as it .*role "nosuch_role" does not exist/,
    );
  });
});

/** A copy of the migrations folder whose journal stops before 0004 (the database as it was before this migration). */
function migrationsBefore0004(): { folder: string; dispose(): void } {
  const dir = mkdtempSync(join(tmpdir(), "audit-migrations-"));
  cpSync(migrationsFolder, dir, { recursive: true });
  const journalPath = join(dir, "meta", "_journal.json");
  const journal = JSON.parse(readFileSync(journalPath, "utf8")) as { entries: { tag: string }[] };
  journal.entries = journal.entries.filter((e) => e.tag < "0004");
  writeFileSync(journalPath, JSON.stringify(journal));
  return { folder: dir, dispose: () => rmSync(dir, { recursive: true, force: true }) };
}

const legacyRows = `insert into audit_log (at, tenant_id, actor, action, target, request_id, detail) values
  ('2026-01-01T00:00:00Z', 'ten_a', 'sub_1', 'agent.create', 'agt_1', 'req_1', '{"image": "demo"}'),
  ('2026-01-01T00:00:01Z', null, 'host_1', 'vm.wake', 'agt_9', null, null),
  ('2026-01-01T00:00:02Z', 'ten_a', 'host_1', 'vm.wake', 'agt_1', null, '{"from": "hibernated"}'),
  ('2026-01-01T00:00:03Z', 'ten_b', 'sub_2', 'agent.delete', 'agt_2', 'req_2', null),
  ('2026-01-01T00:00:04Z', 'ten_a', 'sub_1', 'agent.delete', 'agt_1', 'req_3', null)`;

describe("migration 0004 backfills the chains of rows written before it, in id order per tenant", () => {
  it("on embedded PGlite", async () => {
    const before = migrationsBefore0004();
    const client = new PGlite();
    try {
      const db = pgliteDrizzle(client, { schema });
      await pgliteMigrate(db, { migrationsFolder: before.folder });
      await client.exec(legacyRows);
      await pgliteMigrate(db, { migrationsFolder });
      const asDb = db as unknown as Db;
      const rows = await queryRows<{ tenant_id: string | null; seq: string }>(asDb, sql`select tenant_id, seq::text from audit_log order by id`);
      expect(rows.map((r) => [r.tenant_id, Number(r.seq)])).toEqual([
        ["ten_a", 1],
        [null, 1],
        ["ten_a", 2],
        ["ten_b", 1],
        ["ten_a", 3],
      ]);
      expect((await verifyAllAuditChains(asDb)).map((v) => [v.chain, v.ok, v.rows])).toEqual([
        ["", true, 1],
        ["ten_a", true, 3],
        ["ten_b", true, 1],
      ]);
      await seed(asDb, "ten_a", 1);
      expect(await verifyAuditChain(asDb, "ten_a")).toMatchObject({ ok: true, rows: 4 });
    } finally {
      await client.close();
      before.dispose();
    }
  });

  it("on real Postgres", async () => {
    const before = migrationsBefore0004();
    const adminUrl = inject("pgUrl");
    const name = `t_bf_${nanoid(8)
      .toLowerCase()
      .replace(/[^a-z0-9]/g, "x")}`;
    const admin = postgres(adminUrl, { max: 1, onnotice: () => {} });
    await admin.unsafe(`create database ${name}`);
    const client = postgres(adminUrl.replace(/\/postgres$/, `/${name}`), { max: 1, onnotice: () => {} });
    try {
      const db = pgDrizzle(client, { schema });
      await pgMigrate(db, { migrationsFolder: before.folder });
      await client.unsafe(legacyRows);
      await pgMigrate(db, { migrationsFolder });
      const asDb = db as unknown as Db;
      expect((await verifyAllAuditChains(asDb)).map((v) => [v.chain, v.ok, v.rows])).toEqual([
        ["", true, 1],
        ["ten_a", true, 3],
        ["ten_b", true, 1],
      ]);
    } finally {
      await client.end();
      await admin.end();
      before.dispose();
    }
  });
});

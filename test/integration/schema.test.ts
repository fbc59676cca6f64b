// The committed migrations apply on real Postgres and on embedded PGlite, and give the same tables.
import { afterAll, describe, expect, it } from "vitest";
import { sql } from "drizzle-orm";
import { openDatabase, migrateDatabase, queryRows, type Database } from "../../schema/db.ts";
import { freshDatabase } from "../helpers/db.ts";

const tablesQuery = sql`select table_name from information_schema.tables where table_schema = 'public' order by table_name`;

async function tableNames(database: Database): Promise<string[]> {
  return (await queryRows<{ table_name: string }>(database.db, tablesQuery)).map((r) => r.table_name);
}

describe("migrations", () => {
  const open: Database[] = [];
  afterAll(async () => {
    for (const d of open) await d.close();
  });

  it("apply on Postgres and PGlite with identical tables, and re-apply as a no-op", async () => {
    const pg = await freshDatabase();
    const lite = await openDatabase({ pgliteMemory: true });
    open.push(pg, lite);
    const pgTables = await tableNames(pg);
    expect(pgTables).toContain("agents");
    expect(pgTables).toContain("vm_events");
    expect(await tableNames(lite)).toEqual(pgTables);
    await migrateDatabase(pg);
    expect(await tableNames(pg)).toEqual(pgTables);
  });
});

// Database connection: postgres.js when a URL is given, embedded PGlite in a directory otherwise; migrations apply on open.
import { fileURLToPath } from "node:url";
import * as schema from "./index.ts";
import { defaultDbTimeouts, openPostgresDb, type Db, type DbTimeouts } from "./postgres.ts";

// The Worker-safe part (types, raw queries, a postgres.js db without migrations) lives in postgres.ts.
export { defaultDbTimeouts, parseDbTimeouts, queryRows, type Db, type DbTimeouts, type Schema } from "./postgres.ts";

export interface Database {
  db: Db;
  kind: "postgres" | "pglite";
  close(): Promise<void>;
}

// Workers have no module URL (nor files): there this module loads, and only migrating would fail.
export const migrationsFolder = typeof import.meta.url === "string" ? fileURLToPath(new URL("./migrations", import.meta.url)) : "";

/** `timeouts` default to `defaultDbTimeouts` (schema/postgres.ts: DB_CONNECT_TIMEOUT_S, DB_STATEMENT_TIMEOUT_MS, …). */
export type DatabaseTarget = { url: string; maxConnections?: number; timeouts?: DbTimeouts } | { pgliteDir: string } | { pgliteMemory: true };

export async function openDatabase(target: DatabaseTarget, opts: { migrate?: boolean } = {}): Promise<Database> {
  const database = "url" in target ? await openPostgres(target.url, target.maxConnections ?? 10, target.timeouts ?? defaultDbTimeouts) : await openPglite(target);
  if (opts.migrate !== false) await migrateDatabase(database);
  return database;
}

async function openPostgres(url: string, max: number, timeouts: DbTimeouts): Promise<Database & { migrateWith: () => Promise<void> }> {
  const { migrate } = await import("drizzle-orm/postgres-js/migrator");
  const { db, close } = openPostgresDb(url, { max, timeouts });
  return {
    db,
    kind: "postgres",
    close,
    migrateWith: () => migrate(db as unknown as Parameters<typeof migrate>[0], { migrationsFolder }),
  };
}

// Specifiers in variables: bundlers (the Worker build) leave PGlite out, it is only ever loaded on Node.
const pgliteModule = "@electric-sql/pglite";
const pgliteDrizzleModule = "drizzle-orm/pglite";
const pgliteMigratorModule = "drizzle-orm/pglite/migrator";

async function openPglite(target: { pgliteDir: string } | { pgliteMemory: true }): Promise<Database & { migrateWith: () => Promise<void> }> {
  const { PGlite } = (await import(pgliteModule)) as typeof import("@electric-sql/pglite");
  const { drizzle } = (await import(pgliteDrizzleModule)) as typeof import("drizzle-orm/pglite");
  const { migrate } = (await import(pgliteMigratorModule)) as typeof import("drizzle-orm/pglite/migrator");
  const client = "pgliteDir" in target ? new PGlite(target.pgliteDir) : new PGlite();
  await client.waitReady;
  const db = drizzle(client, { schema });
  return {
    db: db as unknown as Db,
    kind: "pglite",
    close: () => client.close(),
    migrateWith: () => migrate(db, { migrationsFolder }),
  };
}

/** Applies the committed migrations (idempotent: drizzle records what it applied). */
export async function migrateDatabase(database: Database): Promise<void> {
  await (database as Database & { migrateWith: () => Promise<void> }).migrateWith();
}

// Database connection: postgres.js when a URL is given, embedded PGlite in a directory otherwise; migrations apply on open.
import { fileURLToPath } from "node:url";
import type { SQL } from "drizzle-orm";
import type { PgDatabase, PgQueryResultHKT } from "drizzle-orm/pg-core";
import * as schema from "./index.ts";

export type Schema = typeof schema;
export type Db = PgDatabase<PgQueryResultHKT, Schema>;

export interface Database {
  db: Db;
  kind: "postgres" | "pglite";
  close(): Promise<void>;
}

export const migrationsFolder = fileURLToPath(new URL("./migrations", import.meta.url));

export type DatabaseTarget = { url: string; maxConnections?: number } | { pgliteDir: string } | { pgliteMemory: true };

export async function openDatabase(target: DatabaseTarget, opts: { migrate?: boolean } = {}): Promise<Database> {
  const database = "url" in target ? await openPostgres(target.url, target.maxConnections ?? 10) : await openPglite(target);
  if (opts.migrate !== false) await migrateDatabase(database);
  return database;
}

async function openPostgres(url: string, max: number): Promise<Database & { migrateWith: () => Promise<void> }> {
  const { default: postgres } = await import("postgres");
  const { drizzle } = await import("drizzle-orm/postgres-js");
  const { migrate } = await import("drizzle-orm/postgres-js/migrator");
  const client = postgres(url, { max, onnotice: () => {} });
  const db = drizzle(client, { schema });
  return {
    db: db as unknown as Db,
    kind: "postgres",
    close: () => client.end({ timeout: 5 }),
    migrateWith: () => migrate(db, { migrationsFolder }),
  };
}

async function openPglite(target: { pgliteDir: string } | { pgliteMemory: true }): Promise<Database & { migrateWith: () => Promise<void> }> {
  const { PGlite } = await import("@electric-sql/pglite");
  const { drizzle } = await import("drizzle-orm/pglite");
  const { migrate } = await import("drizzle-orm/pglite/migrator");
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

/** Runs raw SQL and returns its rows on either driver (postgres.js answers an array, PGlite `{rows}`). */
export async function queryRows<T>(db: Db, query: SQL): Promise<T[]> {
  const result = (await db.execute(query)) as unknown;
  return (Array.isArray(result) ? result : (result as { rows: T[] }).rows) as T[];
}

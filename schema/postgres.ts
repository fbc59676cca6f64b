// A drizzle database over postgres.js without migrations or PGlite: what a Worker (Hyperdrive) and other lean clients open.
import type { SQL } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import type { PgDatabase, PgQueryResultHKT } from "drizzle-orm/pg-core";
import postgres from "postgres";
import * as schema from "./index.ts";

export type Schema = typeof schema;
export type Db = PgDatabase<PgQueryResultHKT, Schema>;

export interface PostgresOptions {
  /** Connections the pool may open. */
  max?: number;
  /** Ask the server for custom type oids at connect (not needed by this schema; one round trip less on Workers). */
  fetchTypes?: boolean;
}

export interface PostgresDb {
  db: Db;
  /** Ends the pool's connections, waiting up to 5 s for queries in flight. */
  close(): Promise<void>;
}

export function openPostgresDb(url: string, opts: PostgresOptions = {}): PostgresDb {
  const client = postgres(url, { max: opts.max ?? 10, fetch_types: opts.fetchTypes ?? true, onnotice: () => {} });
  const db = drizzle(client, { schema });
  return { db: db as unknown as Db, close: () => client.end({ timeout: 5 }) };
}

/** Runs raw SQL and returns its rows on either driver (postgres.js answers an array, PGlite `{rows}`). */
export async function queryRows<T>(db: Db, query: SQL): Promise<T[]> {
  const result = (await db.execute(query)) as unknown;
  return (Array.isArray(result) ? result : (result as { rows: T[] }).rows) as T[];
}

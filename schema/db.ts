// Database connection: postgres.js when a URL is given, embedded PGlite in a directory otherwise; migrations apply on open.
import { fileURLToPath } from "node:url";
import * as schema from "./index.ts";
import postgres from "postgres";
import { AppError } from "../lib/errors.ts";
import { defaultDatabaseAppRole, defaultDbTimeouts, openPostgresDb, type Db, type DbTimeouts } from "./postgres.ts";

// The Worker-safe part (types, raw queries, a postgres.js db without migrations) lives in postgres.ts.
export {
  databaseEnv,
  dbTimeoutsOf,
  defaultDatabaseAppRole,
  defaultDbTimeouts,
  parseDatabaseAppRole,
  parseDbTimeouts,
  type DatabaseSettings,
  queryRows,
  type Db,
  type DbTimeouts,
  type Schema,
} from "./postgres.ts";

export interface Database {
  db: Db;
  kind: "postgres" | "pglite";
  close(): Promise<void>;
}

// Workers have no module URL (nor files): there this module loads, and only migrating would fail.
export const migrationsFolder = typeof import.meta.url === "string" ? fileURLToPath(new URL("./migrations", import.meta.url)) : "";

/**
 * `timeouts` default to `defaultDbTimeouts` (schema/postgres.ts: DB_CONNECT_TIMEOUT_S, DB_STATEMENT_TIMEOUT_MS, …);
 * `appRole` (DATABASE_APP_ROLE) to `defaultDatabaseAppRole`: the pool's queries run as it, migrations as the URL's user
 * ('' = the URL's user for everything). PGlite has one session and no such role: it runs as its own superuser.
 */
export type DatabaseTarget = { url: string; maxConnections?: number; timeouts?: DbTimeouts; appRole?: string } | { pgliteDir: string } | { pgliteMemory: true };

export async function openDatabase(target: DatabaseTarget, opts: { migrate?: boolean } = {}): Promise<Database> {
  const database =
    "url" in target
      ? await openPostgres(target.url, target.maxConnections ?? 10, target.timeouts ?? defaultDbTimeouts, target.appRole ?? defaultDatabaseAppRole)
      : await openPglite(target);
  if (opts.migrate !== false) await migrateDatabase(database);
  return database;
}

async function openPostgres(url: string, max: number, timeouts: DbTimeouts, appRole: string): Promise<Database & { migrateWith: () => Promise<void> }> {
  const { migrate } = await import("drizzle-orm/postgres-js/migrator");
  const { db, close } = openPostgresDb(url, { max, timeouts, ...(appRole ? { role: appRole } : {}) });
  if (!appRole) return { db, kind: "postgres", close, migrateWith: () => migrate(db as unknown as Parameters<typeof migrate>[0], { migrationsFolder }) };
  // The pool connects lazily: migrating first over a connection of the URL's own user (which creates the role).
  const migrateAsOwner = async () => {
    const owner = openPostgresDb(url, { max: 1, timeouts });
    try {
      await migrate(owner.db as unknown as Parameters<typeof migrate>[0], { migrationsFolder });
      await assertCanSetRole(url, appRole, timeouts);
    } finally {
      await owner.close();
    }
  };
  return { db, kind: "postgres", close, migrateWith: migrateAsOwner };
}

/** Fails at start, naming the fix, when the URL's user cannot run as `role` (no such role, or not a member). */
async function assertCanSetRole(url: string, role: string, timeouts: DbTimeouts): Promise<void> {
  const client = postgres(url, { max: 1, onnotice: () => {}, fetch_types: false, connect_timeout: timeouts.connectTimeoutS });
  try {
    await client.begin(async (tx) => {
      await tx.unsafe(`SET LOCAL ROLE "${role.replaceAll('"', '""')}"`);
    });
  } catch (err) {
    const why = err instanceof Error ? err.message : String(err);
    throw new AppError(
      "bad_request",
      `configuration: DATABASE_APP_ROLE=${role}: the database user cannot run as it (${why}); create the role and grant it to that user (migration 0004 does when allowed), or set DATABASE_APP_ROLE= (empty) to run as the user itself`,
    );
  } finally {
    await client.end({ timeout: 5 });
  }
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

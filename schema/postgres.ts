// A drizzle database over postgres.js without migrations or PGlite: what a Worker (Hyperdrive) and other lean clients open.
import type { SQL } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import type { PgDatabase, PgQueryResultHKT } from "drizzle-orm/pg-core";
import postgres from "postgres";
import { z } from "zod";
import { envVar, parseEnv, vars, type Env } from "../lib/env.ts";
import * as schema from "./index.ts";
import { gatedClient } from "./db-gate.ts";
import { registerBuiltinArrayTypes, type PostgresTypeOptions } from "./postgres-guard.ts";

export type Schema = typeof schema;
export type Db = PgDatabase<PgQueryResultHKT, Schema>;

/** How long the client waits on the database, so a caller never hangs on it (Node programs; a Worker leaves them to Hyperdrive). */
export interface DbTimeouts {
  /** Opening a connection (TCP, TLS, startup), s: postgres.js `connect_timeout`. */
  connectTimeoutS: number;
  /** One statement on the server, ms: the session's `statement_timeout`, set at connect. */
  statementTimeoutMs: number;
  /** An idle pooled connection is closed after this long, s: postgres.js `idle_timeout` (0: never). */
  idleTimeoutS: number;
  /** Longest wait before the next connection attempt after failed ones, ms (postgres.js `backoff`; its own grows to 20 s). */
  reconnectMaxMs: number;
}

export const defaultDbTimeouts: DbTimeouts = { connectTimeoutS: 5, statementTimeoutMs: 30_000, idleTimeoutS: 60, reconnectMaxMs: 500 };

/** The role the application's queries run as on Postgres (migration 0004 creates it: no UPDATE/DELETE on audit_log). */
export const defaultDatabaseAppRole = "agentvm_app";

/** The database's variables (Node programs; the Worker reaches Postgres through Hyperdrive and reads only DB_MAX_CONNECTIONS). */
export const databaseEnv = z.object({
  DATABASE_URL: vars.optStr({
    type: "URL",
    default: "(unset: embedded PGlite in `DATA_DIR/db`)",
    doc: "the Postgres (`postgres://…`) all gateways and hosts share",
  }),
  DB_CONNECT_TIMEOUT_S: vars.int({
    fallback: defaultDbTimeouts.connectTimeoutS,
    min: 1,
    max: 300,
    unit: "s",
    doc: "opening a Postgres connection (also how long one probe may take before another is allowed); past it a call that needs the database gets `503 database_unavailable`",
  }),
  DB_STATEMENT_TIMEOUT_MS: vars.int({
    fallback: defaultDbTimeouts.statementTimeoutMs,
    min: 0,
    unit: "ms",
    doc: "one statement on the server (`statement_timeout`); 0: none",
  }),
  DB_IDLE_TIMEOUT_S: vars.int({
    fallback: defaultDbTimeouts.idleTimeoutS,
    min: 0,
    unit: "s",
    doc: "an idle pooled connection is closed after this long; 0: never",
  }),
  DB_RECONNECT_MAX_MS: vars.int({
    fallback: defaultDbTimeouts.reconnectMaxMs,
    min: 10,
    max: 60_000,
    unit: "ms",
    doc: "longest wait between connection attempts while Postgres is down: how soon calls succeed once it is back (the event-log spool replays within ~2 s of its return)",
  }),
  DATABASE_APP_ROLE: envVar(
    {
      type: "role name",
      default: `\`${defaultDatabaseAppRole}\``,
      doc: "on Postgres every pooled connection runs as this role (no UPDATE/DELETE on `audit_log`); migrations run as the URL's user; empty: the URL's user for everything; unused on PGlite",
    },
    (raw, fail) => {
      // Unlike other variables, empty is a value here (the URL's user), not "unset".
      const role = raw === undefined ? defaultDatabaseAppRole : raw.trim();
      if (role !== "" && !/^[a-z_][a-z0-9_]{0,62}$/.test(role)) fail("must be a role name (lower case letters, digits, _) or empty");
      return role;
    },
  ),
  DB_MAX_CONNECTIONS: vars.int({ fallback: 5, min: 1, max: 100, doc: "Worker: connections one request's client may open through Hyperdrive" }),
});

export type DatabaseSettings = z.output<typeof databaseEnv>;

export function dbTimeoutsOf(
  v: Pick<DatabaseSettings, "DB_CONNECT_TIMEOUT_S" | "DB_STATEMENT_TIMEOUT_MS" | "DB_IDLE_TIMEOUT_S" | "DB_RECONNECT_MAX_MS">,
): DbTimeouts {
  return {
    connectTimeoutS: v.DB_CONNECT_TIMEOUT_S,
    statementTimeoutMs: v.DB_STATEMENT_TIMEOUT_MS,
    idleTimeoutS: v.DB_IDLE_TIMEOUT_S,
    reconnectMaxMs: v.DB_RECONNECT_MAX_MS,
  };
}

const timeoutsEnv = databaseEnv.pick({ DB_CONNECT_TIMEOUT_S: true, DB_STATEMENT_TIMEOUT_MS: true, DB_IDLE_TIMEOUT_S: true, DB_RECONNECT_MAX_MS: true });

/** DB_* timeouts alone (scripts that open the database outside a program: audit-verify). */
export function parseDbTimeouts(env: Env): DbTimeouts {
  return dbTimeoutsOf(parseEnv(timeoutsEnv, env));
}

/** DATABASE_APP_ROLE alone. */
export function parseDatabaseAppRole(env: Env): string {
  return parseEnv(databaseEnv.pick({ DATABASE_APP_ROLE: true }), env).DATABASE_APP_ROLE;
}

export interface PostgresOptions {
  /** Connections the pool may open. */
  max?: number;
  /**
   * Ask the server for array type oids on every new connection (postgres.js `fetch_types`). Default false: that fetch
   * ends the process when a connection dies during it (schema/postgres-guard.ts); the built-in array types are
   * registered without it, and this schema has no custom ones.
   */
  fetchTypes?: boolean;
  /**
   * Unset: postgres.js's own (30 s connect, no statement or idle timeout, reconnect backoff up to 20 s). Set: these,
   * and queries fail at once while the database is known to be down (schema/db-gate.ts).
   */
  timeouts?: DbTimeouts;
  /** Every connection runs as this role (startup parameter `role`: `SET ROLE` before the first query); unset: the URL's user. */
  role?: string;
}

export interface PostgresDb {
  db: Db;
  /** Ends the pool's connections, waiting up to 5 s for queries in flight. */
  close(): Promise<void>;
}

export function openPostgresDb(url: string, opts: PostgresOptions = {}): PostgresDb {
  const t = opts.timeouts;
  const client = postgres(url, {
    max: opts.max ?? 10,
    fetch_types: opts.fetchTypes ?? false,
    onnotice: () => {},
    ...(t
      ? {
          connect_timeout: t.connectTimeoutS,
          idle_timeout: t.idleTimeoutS,
          // Attempts after failures wait 25 ms, 50 ms, … up to reconnectMaxMs (jittered): a returning server is used at once.
          backoff: (retries: number) => (Math.min(t.reconnectMaxMs, 25 * 2 ** retries) * (0.5 + Math.random() / 2)) / 1000,
        }
      : {}),
    connection: { ...(t ? { statement_timeout: t.statementTimeoutMs } : {}), ...(opts.role ? { role: opts.role } : {}) },
  });
  registerBuiltinArrayTypes(client.options as unknown as PostgresTypeOptions);
  const db = drizzle(t ? gatedClient(client, t.connectTimeoutS * 1000) : client, { schema });
  return { db: db as unknown as Db, close: () => client.end({ timeout: 5 }) };
}

/** Runs raw SQL and returns its rows on either driver (postgres.js answers an array, PGlite `{rows}`). */
export async function queryRows<T>(db: Db, query: SQL): Promise<T[]> {
  const result = (await db.execute(query)) as unknown;
  return (Array.isArray(result) ? result : (result as { rows: T[] }).rows) as T[];
}

// Raw SQL with $n parameters on whichever client a `Db` wraps (postgres.js or PGlite), plus COPY where the client has it.
import type { Db } from "../schema/db.ts";

/** `prepare: false`: planned with its parameters' values every time (postgres.js otherwise reuses a generic plan from a statement's sixth run). */
export interface QueryOptions {
  prepare?: boolean;
}

export interface SqlRunner {
  query<T = Record<string, unknown>>(text: string, params?: unknown[], opts?: QueryOptions): Promise<T[]>;
  /** `COPY table (cols) FROM STDIN` with tab-separated text rows; undefined when the client cannot stream COPY. */
  copyIn?: (table: string, columns: readonly string[], rows: string) => Promise<void>;
}

export interface TxRunner extends SqlRunner {
  kind: "postgres" | "pglite";
  transaction<T>(fn: (tx: SqlRunner) => Promise<T>): Promise<T>;
}

interface PostgresJsLike {
  unsafe(text: string, params?: unknown[], opts?: { prepare?: boolean }): Promise<unknown[]> & { writable(): Promise<NodeJS.WritableStream> };
  begin<T>(fn: (tx: PostgresJsLike) => Promise<T>): Promise<T>;
}

interface PgliteLike {
  query<T>(text: string, params?: unknown[]): Promise<{ rows: T[] }>;
  transaction<T>(fn: (tx: { query<R>(text: string, params?: unknown[]): Promise<{ rows: R[] }> }) => Promise<T>): Promise<T>;
}

/** This postgres.js no longer looks like the version the COPY error workaround was written for: use INSERT instead. */
export class CopyUnsupportedError extends Error {
  constructor() {
    super("postgres.js internals changed: COPY errors could hang, so COPY is not used");
  }
}

const cache = new WeakMap<object, TxRunner>();

function postgresJsRunner(sql: PostgresJsLike): SqlRunner {
  return {
    query: async <T>(text: string, params: unknown[] = [], opts: QueryOptions = {}) =>
      (await sql.unsafe(text, params, { prepare: opts.prepare ?? true })) as T[],
    copyIn: async (table, columns, rows) => {
      const query = sql.unsafe(`COPY ${table} (${columns.join(", ")}) FROM STDIN`) as ReturnType<PostgresJsLike["unsafe"]> & { reject?: (e: unknown) => void };
      // postgres.js 3.4 loses an error that arrives after the stream's end (e.g. a unique violation on the
      // last rows): the stream never finishes. The error still reaches the query's `reject`, so listen there.
      let failed: (e: unknown) => void = () => {};
      const failure = new Promise<never>((_, reject) => (failed = reject));
      failure.catch(() => {});
      const original = query.reject;
      if (typeof original !== "function") throw new CopyUnsupportedError(); // the query was never sent (postgres.js runs queries when awaited)
      query.reject = (e: unknown) => {
        failed(e);
        original.call(query, e);
      };
      const stream = await query.writable();
      await Promise.race([
        failure,
        new Promise<void>((resolve, reject) => {
          stream.on("error", reject);
          stream.on("finish", resolve);
          stream.end(rows);
        }),
      ]);
    },
  };
}

/** The runner for `db`'s underlying client (cached per client). */
export function sqlRunner(db: Db): TxRunner {
  const client = (db as unknown as { $client: object }).$client;
  const hit = cache.get(client);
  if (hit) return hit;
  let runner: TxRunner;
  if (typeof (client as Partial<PostgresJsLike>).unsafe === "function" && typeof (client as Partial<PostgresJsLike>).begin === "function") {
    const sql = client as PostgresJsLike;
    runner = {
      kind: "postgres",
      ...postgresJsRunner(sql),
      transaction: (fn) => sql.begin((tx) => fn(postgresJsRunner(tx))),
    };
  } else {
    const lite = client as PgliteLike;
    const wrap = (q: { query<R>(text: string, params?: unknown[]): Promise<{ rows: R[] }> }): SqlRunner => ({
      query: async <T>(text: string, params: unknown[] = []) => (await q.query<T>(text, params)).rows,
    });
    runner = { kind: "pglite", ...wrap(lite), transaction: (fn) => lite.transaction((tx) => fn(wrap(tx))) };
  }
  cache.set(client, runner);
  return runner;
}

/** int8 and numeric come back as strings (postgres.js), bigints or numbers (PGlite): one number, exact below 2^53. */
export function toNumber(v: unknown): number {
  if (v === null || v === undefined) return 0;
  const n = typeof v === "number" ? v : Number(v);
  if (!Number.isSafeInteger(n) && Number.isInteger(Number(v))) throw new Error(`integer ${String(v)} exceeds 2^53`);
  return n;
}

/** Postgres error code (SQLSTATE) of a thrown driver error, if any. */
export function sqlState(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | undefined)?.code;
  return typeof code === "string" ? code : undefined;
}

// Child process for postgres-guard.test.ts: the database client opens its first connection through a proxy that resets it at its first statement.
import { sql } from "drizzle-orm";
import { openPostgresDb, queryRows } from "../../schema/postgres.ts";

// Names the query of an error that is about to end the process (a monitor: it changes nothing).
process.on("uncaughtExceptionMonitor", (err) => console.error(`ending on: ${(err as { query?: string }).query ?? "?"}`));
// FETCH_TYPES=1: postgres.js's own per-connection type fetch (the crash path), to show the test can fail.
const { db, close } = openPostgresDb(process.env.DATABASE_URL ?? "", { max: 1, fetchTypes: process.env.FETCH_TYPES === "1" });
const first = await queryRows(db, sql`select 1 as n`).then(
  () => "answered",
  (err: { cause?: { code?: string } }) => `failed ${err.cause?.code}`, // drizzle wraps the driver's error
);
// A rejection nobody handles ends the process on the next turns: give it time to.
await new Promise((r) => setTimeout(r, 300));
const [second] = await queryRows<{ a: string[] }>(db, sql`select ${sql.param(["x", "y"])}::text[] as a`);
console.log(JSON.stringify({ first, second: second?.a }));
await close();

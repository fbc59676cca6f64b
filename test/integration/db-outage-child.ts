// Child process for the outage test: transactions under load through the database client every program uses, while the parent stops and starts Postgres.
import { createInterface } from "node:readline";
import { sql } from "drizzle-orm";
import { openDatabase, queryRows } from "../../schema/db.ts";

const database = await openDatabase({ url: process.env.DATABASE_URL ?? "", maxConnections: 10 }, { migrate: false });
const { db } = database;
let stop = false;
const outcomes = { committed: 0, failed: 0 };
const load = (async () => {
  const inFlight = new Set<Promise<unknown>>();
  while (!stop) {
    for (let i = 0; i < 8; i++) {
      const p = db
        .transaction(async (tx) => {
          await tx.execute(sql`select pg_sleep(0.01)`);
          await tx.execute(sql`select 1`);
        })
        .then(
          () => void outcomes.committed++,
          () => void outcomes.failed++,
        );
      inFlight.add(p);
      void p.finally(() => inFlight.delete(p));
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  // A transaction whose connection was lost mid-way never settles (nothing more is sent on it): wait a bounded time.
  await Promise.race([Promise.all(inFlight), new Promise((r) => setTimeout(r, 2000))]);
})();
console.log("ready");
createInterface({ input: process.stdin }).once("line", async () => {
  stop = true;
  await load;
  const started = performance.now();
  for (let i = 0; i < 20; i++) await queryRows(db, sql`select 1`);
  console.log(JSON.stringify({ ...outcomes, afterMs: Math.round(performance.now() - started) }));
  await database.close();
  process.exit(0);
});

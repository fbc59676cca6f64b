// A fresh, migrated database per test file on the shared test server (real Postgres, never a mock).
import { inject } from "vitest";
import postgres from "postgres";
import { nanoid } from "nanoid";
import { openDatabase, type Database } from "../../schema/db.ts";

export async function freshDatabase(opts: { maxConnections?: number } = {}): Promise<Database & { url: string }> {
  const adminUrl = inject("pgUrl");
  const name = `t_${nanoid(10)
    .toLowerCase()
    .replace(/[^a-z0-9]/g, "x")}`;
  const admin = postgres(adminUrl, { max: 1, onnotice: () => {} });
  await admin.unsafe(`CREATE DATABASE ${name}`);
  await admin.end();
  const url = adminUrl.replace(/\/postgres$/, `/${name}`);
  const database = await openDatabase({ url, maxConnections: opts.maxConnections ?? 5 });
  return Object.assign(database, { url });
}

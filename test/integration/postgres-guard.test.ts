// The database client survives a connection that dies during its first statement (postgres.js's type fetch ended the process there), and still speaks arrays.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawn } from "node:child_process";
import net from "node:net";
import { join } from "node:path";
import { sql } from "drizzle-orm";
import postgres from "postgres";
import { drizzle } from "drizzle-orm/postgres-js";
import { openPostgresDb, queryRows, type PostgresDb } from "../../schema/postgres.ts";
import { builtinArrayTypes, parseArrayLiteral } from "../../schema/postgres-guard.ts";
import { freshDatabase } from "../helpers/db.ts";
import { repoRoot } from "../helpers/worker-stack.ts";

let url: string;
let closeDb: () => Promise<void>;
beforeAll(async () => {
  const database = await freshDatabase({ maxConnections: 1 });
  url = database.url;
  closeDb = () => database.close();
});
afterAll(async () => closeDb?.());

/**
 * A TCP proxy to Postgres that resets the first connection (RST: the client reads ECONNRESET) when the client sends
 * its first message after the startup handshake — the moment Postgres stopped in the outage test. Later connections pass.
 */
async function resettingProxy(target: URL): Promise<{ url: string; resets: () => number; close: () => Promise<void> }> {
  let connections = 0;
  let resets = 0;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const cut = connections++ === 0;
    const upstream = net.connect(Number(target.port), target.hostname);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("error", () => {});
      s.on("close", () => sockets.delete(s));
    }
    let handshakeDone = false;
    let pending = Buffer.alloc(0);
    upstream.on("data", (chunk: Buffer) => {
      client.write(chunk);
      if (!cut || handshakeDone) return;
      // Server messages: a type byte and a length; the handshake ends with the first ReadyForQuery ("Z").
      pending = Buffer.concat([pending, chunk]);
      while (pending.length >= 5 && pending.length >= 1 + pending.readUInt32BE(1)) {
        if (pending[0] === 0x5a) handshakeDone = true;
        pending = pending.subarray(1 + pending.readUInt32BE(1));
      }
    });
    client.on("data", (chunk: Buffer) => {
      if (cut && handshakeDone) {
        resets++;
        client.resetAndDestroy();
        upstream.destroy();
        return;
      }
      upstream.write(chunk);
    });
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  const proxied = new URL(target);
  proxied.port = String((server.address() as net.AddressInfo).port);
  return {
    url: proxied.toString(),
    resets: () => resets,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

async function runChild(databaseUrl: string, fetchTypes: boolean): Promise<{ code: number | null; out: string }> {
  const child = spawn(process.execPath, [join(repoRoot, "test/integration/postgres-guard-child.ts")], {
    env: { ...process.env, DATABASE_URL: databaseUrl, FETCH_TYPES: fetchTypes ? "1" : "0" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr.on("data", (d: Buffer) => (out += d.toString()));
  const code = await new Promise<number | null>((r) => child.once("exit", (c) => r(c)));
  return { code, out };
}

describe("postgres.js connection dying during its first statement", () => {
  it("fails that one query and leaves the process running (with postgres.js's type fetch, the process dies)", async () => {
    const proxy = await resettingProxy(new URL(url));
    try {
      const fixed = await runChild(proxy.url, false);
      expect(proxy.resets()).toBe(1);
      expect(fixed.code, fixed.out).toBe(0);
      expect(JSON.parse(fixed.out.trim().split("\n").at(-1)!)).toEqual({ first: "failed ECONNRESET", second: ["x", "y"] });
    } finally {
      await proxy.close();
    }
    // The control: the same cut with `fetch_types` on reaches its dropped type query, an unhandled rejection.
    const control = await resettingProxy(new URL(url));
    try {
      const crashed = await runChild(control.url, true);
      expect(control.resets()).toBe(1);
      expect(crashed.code, crashed.out).not.toBe(0);
      expect(crashed.out).toContain("read ECONNRESET");
      expect(crashed.out).toContain("pg_catalog.pg_type");
    } finally {
      await control.close();
    }
  }, 30_000);
});

describe("built-in array types without the fetch", () => {
  let pg: PostgresDb;
  let fetched: postgres.Sql;
  beforeAll(() => {
    pg = openPostgresDb(url, { max: 1 });
    // The reference: postgres.js with its own type fetch, under drizzle too (drizzle replaces the date parsers).
    fetched = postgres(url, { max: 1, onnotice: () => {} });
    drizzle(fetched);
  });
  afterAll(async () => {
    await pg?.close();
    await fetched?.end();
  });

  it("match the server's catalog", async () => {
    const elements = Object.keys(builtinArrayTypes).map(Number);
    const rows = await queryRows<{ typelem: number; oid: number }>(
      pg.db,
      sql`select typelem::int4 as typelem, oid::int4 as oid from pg_type where typcategory = 'A' and typelem = any(${sql.param(elements)}::int4[])`,
    );
    expect(Object.fromEntries(rows.map((r) => [r.typelem, r.oid]))).toEqual(
      Object.fromEntries(Object.entries(builtinArrayTypes).map(([k, v]) => [Number(k), v])),
    );
  });

  it("go out and come back as postgres.js's fetched ones do", async () => {
    const text = ["plain", 'quo"te', "back\\slash", "com,ma", "{brace}", "", "NULL", "sp ace", "ünï"];
    const ints = [1, -2, 2147483647];
    const big = ["9007199254740993", "-1"];
    const nested = [
      [1, 2],
      [3, 4],
    ];
    const when = '{"2026-01-02T03:04:05.678Z"}'; // drizzle passes date arrays through as text, either way
    const json = [{ a: [1, "x"] }, { b: null }]; // no NULL element: postgres.js's own parser throws on one (ours gives null, below)
    const query = `select $1::text[] as text, $2::int4[] as ints, $3::int8[] as big, $4::int4[] as nested, $5::timestamptz[] as when, $6::jsonb[] as json, '{}'::text[] as empty, '{t,f}'::bool[] as bools`;
    const params = [text, ints, big, nested, when, json.map((j) => JSON.stringify(j))];
    const client = (pg.db as unknown as { $client: postgres.Sql }).$client;
    const [a] = await client.unsafe(query, params as never[]);
    const [b] = await fetched.unsafe(query, params as never[]);
    expect(a).toEqual(b);
    expect(a!.text).toEqual(text);
    expect(a!.ints).toEqual(ints);
    expect(a!.nested).toEqual(nested);
    expect(a!.empty).toEqual([]);
    expect(a!.bools).toEqual([true, false]);
    expect(a!.json).toEqual(json);
  });

  it('parse NULL elements as null, and quoted "NULL" as text', () => {
    expect(parseArrayLiteral('{a,NULL,"NULL",null}', undefined)).toEqual(["a", null, "NULL", null]);
    expect(parseArrayLiteral("[0:1]={1,2}", Number)).toEqual([1, 2]);
    expect(parseArrayLiteral("{{1,2},{3,NULL}}", Number)).toEqual([
      [1, 2],
      [3, null],
    ]);
  });
});

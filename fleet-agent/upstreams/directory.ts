// A host's view of tenants' upstreams: the rows read from Postgres, their secret headers unsealed, kept in memory for UPSTREAM_CACHE_MS.
import { and, asc, eq, isNull } from "drizzle-orm";
import type { Clock } from "../../lib/clock.ts";
import { unseal } from "../../lib/seal.ts";
import type { Db } from "../../schema/db.ts";
import { upstreams } from "../../schema/operations.ts";
import type { OpenUpstream, UpstreamDirectory } from "../egress/upstreams.ts";

export interface DirectoryDeps {
  db: Db;
  /** The upstream key (UPSTREAM_KEY_FILE), as WebCrypto holds it. */
  key: () => Promise<CryptoKey>;
  clock: Clock;
  /** How long an answer is reused, ms (0: every call reads). */
  cacheMs: number;
}

/** The directory over Postgres; a tenant's answer (one upstream, or its names) is reused for `cacheMs`. */
export function createUpstreamDirectory(deps: DirectoryDeps): UpstreamDirectory {
  const { db, clock, cacheMs } = deps;
  const cache = new Map<string, { at: number; value: Promise<unknown> }>();

  function cached<T>(key: string, load: () => Promise<T>): Promise<T> {
    const now = clock.monotonic();
    const hit = cache.get(key);
    if (hit && now - hit.at < cacheMs) return hit.value as Promise<T>;
    const value = load();
    // A failed read is not kept: the next call asks again.
    value.catch(() => cache.delete(key));
    if (cacheMs > 0) {
      if (cache.size > 10_000) cache.clear(); // bounded: a host never needs more than its tenants' few upstreams
      cache.set(key, { at: now, value });
    }
    return value;
  }

  return {
    get(tenantId, name) {
      return cached(`u\u0000${tenantId}\u0000${name}`, async (): Promise<OpenUpstream | undefined> => {
        const rows = await db
          .select()
          .from(upstreams)
          .where(and(eq(upstreams.tenantId, tenantId), eq(upstreams.name, name), isNull(upstreams.deletedAt)))
          .limit(1);
        const row = rows[0];
        if (!row) return undefined;
        const headers = JSON.parse(await unseal(await deps.key(), row.headersSealed, row.id)) as Record<string, string>;
        return { id: row.id, name: row.name, baseUrl: row.baseUrl, headers };
      });
    },
    names(tenantId) {
      return cached(`n\u0000${tenantId}`, async () => {
        const rows = await db
          .select({ name: upstreams.name })
          .from(upstreams)
          .where(and(eq(upstreams.tenantId, tenantId), isNull(upstreams.deletedAt)))
          .orderBy(asc(upstreams.name));
        return rows.map((r) => r.name);
      });
    },
  };
}

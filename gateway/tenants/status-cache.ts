// Tenant statuses kept in memory for a few seconds, so a call (the proxy's hot path included) does not query for them.
import { asDatabaseError, isDatabaseUnavailable } from "../../schema/db-errors.ts";
import type { TenantStatus } from "./store.ts";

/** What a check needs of a tenant: its status (`missing`: no such row) and the operator's reason. */
export interface TenantStanding {
  status: TenantStatus | "missing";
  reason: string | null;
}

export interface TenantStatusCacheOptions {
  /** How long a loaded status is trusted, ms; 0: every `get` reads it. */
  ttlMs: number;
  /** Past `ttlMs` and below this age, a status is still served while one refresh runs in the background (with `serveStale`); older, only while a refresh started before is still running. */
  maxStaleMs: number;
  maxEntries: number;
  /**
   * Node: a stale status is served at once and refreshed in the background. Workers: false, a refresh must not outlive
   * the request that started it (its database client closes with it), so a stale status is re-read before it is used.
   */
  serveStale: boolean;
  now?: () => number;
}

export interface TenantStatusCache {
  /** The tenant's standing, from memory when fresh enough, else read (one read at a time per tenant). */
  get(tenantId: string): Promise<TenantStanding>;
  /** The standing from memory if it may be used now without waiting (fresh, or stale within bounds); else undefined. */
  peek(tenantId: string): TenantStanding | undefined;
  /** The last standing loaded, whatever its age (after `get` or `peek` answered for it). */
  known(tenantId: string): TenantStanding | undefined;
  /** This process changed the tenant: the new standing applies here at once. */
  set(tenantId: string, standing: TenantStanding): void;
}

interface Entry {
  value: TenantStanding | undefined;
  loadedAt: number;
  refreshing: Promise<TenantStanding> | undefined;
  /** The last refresh failed because the database is unavailable: the status is served as it is, however old. */
  outage: boolean;
  /** Bumped by `set`: a read that started before it does not overwrite it. */
  version: number;
}

/**
 * While the database is unavailable a status this process has loaded is served at any age (changing it needs the
 * database too); a tenant never loaded fails with `database_unavailable`.
 */
export function createTenantStatusCache(load: (tenantId: string) => Promise<TenantStanding>, opts: TenantStatusCacheOptions): TenantStatusCache {
  const entries = new Map<string, Entry>();
  const now = opts.now ?? (() => performance.now());

  function entryFor(tenantId: string): Entry {
    let e = entries.get(tenantId);
    if (!e) {
      if (entries.size >= opts.maxEntries) entries.delete(entries.keys().next().value!);
      e = { value: undefined, loadedAt: -Infinity, refreshing: undefined, outage: false, version: 0 };
      entries.set(tenantId, e);
    }
    return e;
  }

  function refresh(tenantId: string, e: Entry): Promise<TenantStanding> {
    if (e.refreshing) return e.refreshing;
    const started = now();
    const version = e.version;
    const p = load(tenantId).then(
      (value) => {
        e.refreshing = undefined;
        // A `set` while loading wins: the loaded value may predate the change.
        if (entries.get(tenantId) === e && e.version === version) {
          e.value = value;
          e.loadedAt = started;
          e.outage = false;
        }
        return e.value ?? value;
      },
      (err: unknown) => {
        e.refreshing = undefined;
        if (!isDatabaseUnavailable(err)) throw err;
        e.outage = true;
        if (e.value) return e.value;
        throw asDatabaseError(err);
      },
    );
    e.refreshing = p;
    return p;
  }

  /**
   * Whether `e` may be served now: fresh; or, serving stale, younger than `maxStaleMs`, or while the refresh started
   * within that bound is still running (a slow database must not hold calls), or in an outage; a refresh is started.
   */
  function usable(tenantId: string, e: Entry | undefined): e is Entry & { value: TenantStanding } {
    if (!e?.value) return false;
    const age = now() - e.loadedAt;
    if (age < opts.ttlMs) return true;
    if (!opts.serveStale || !(age < opts.maxStaleMs || e.outage || e.refreshing)) return false;
    void refresh(tenantId, e).catch(() => undefined);
    return true;
  }

  return {
    get(tenantId) {
      const e = entries.get(tenantId);
      if (usable(tenantId, e)) return Promise.resolve(e.value);
      return refresh(tenantId, e ?? entryFor(tenantId));
    },
    peek(tenantId) {
      const e = entries.get(tenantId);
      return usable(tenantId, e) ? e.value : undefined;
    },
    known(tenantId) {
      return entries.get(tenantId)?.value;
    },
    set(tenantId, standing) {
      const e = entryFor(tenantId);
      e.value = standing;
      e.loadedAt = now();
      e.outage = false;
      e.version++;
    },
  };
}

// The tenant status cache: one read per tenant per TTL, changes in this process at once, stale-while-refresh bounds, outages, Workers' mode.
import { describe, expect, it } from "vitest";
import { AppError } from "../../lib/errors.ts";
import { createTenantStatusCache, type TenantStanding } from "../../gateway/tenants/status-cache.ts";
import { tenantRefusal } from "../../gateway/tenants/gate.ts";

function harness(opts: { ttlMs: number; serveStale: boolean; maxStaleMs?: number }) {
  let t = 0;
  const db = new Map<string, TenantStanding>([["ten_a", { status: "active", reason: null }]]);
  let reads = 0;
  let down = false;
  const cache = createTenantStatusCache(
    async (id) => {
      reads++;
      if (down) throw new AppError("database_unavailable", "down");
      return db.get(id) ?? { status: "missing", reason: null };
    },
    { ttlMs: opts.ttlMs, maxStaleMs: opts.maxStaleMs ?? 30_000, maxEntries: 100, serveStale: opts.serveStale, now: () => t },
  );
  return {
    cache,
    db,
    reads: () => reads,
    advance: (ms: number) => void (t += ms),
    setDown: (v: boolean) => void (down = v),
  };
}

const flush = () => new Promise((r) => setTimeout(r, 0));

describe("tenant status cache", () => {
  it("reads a tenant once per TTL; a change made elsewhere is seen after the TTL (plus one background refresh)", async () => {
    const h = harness({ ttlMs: 5000, serveStale: true });
    for (let i = 0; i < 100; i++) expect((await h.cache.get("ten_a")).status).toBe("active");
    expect(h.reads()).toBe(1);
    expect(h.cache.peek("ten_a")?.status).toBe("active");
    h.db.set("ten_a", { status: "suspended", reason: "r" }); // another gateway's change
    h.advance(4999);
    expect((await h.cache.get("ten_a")).status).toBe("active");
    h.advance(2);
    // Stale: served once more while the refresh runs, then the new status.
    expect((await h.cache.get("ten_a")).status).toBe("active");
    await flush();
    expect((await h.cache.get("ten_a")).status).toBe("suspended");
    expect(h.reads()).toBe(2);
  });

  it("a change through this process applies at once, and a read that started before it does not undo it", async () => {
    const h = harness({ ttlMs: 5000, serveStale: true });
    const loading = h.cache.get("ten_a");
    h.cache.set("ten_a", { status: "deleted", reason: null });
    await loading;
    expect(h.cache.peek("ten_a")?.status).toBe("deleted");
    expect(h.cache.known("ten_a")?.status).toBe("deleted");
  });

  it("past maxStaleMs nothing is served from memory without a read; unknown tenants are remembered as missing", async () => {
    const h = harness({ ttlMs: 1000, serveStale: true, maxStaleMs: 3000 });
    expect((await h.cache.get("ten_nope")).status).toBe("missing");
    await h.cache.get("ten_nope");
    expect(h.reads()).toBe(1);
    h.advance(3001);
    expect(h.cache.peek("ten_nope")).toBeUndefined();
  });

  it("a refresh that hangs does not hold calls: past maxStaleMs the status is served while that refresh runs", async () => {
    let t = 0;
    let release: (v: TenantStanding) => void = () => {};
    let reads = 0;
    const cache = createTenantStatusCache(
      (_id) => {
        reads++;
        if (reads === 2) return new Promise<TenantStanding>((r) => (release = r));
        return Promise.resolve({ status: reads === 1 ? "active" : "suspended", reason: null });
      },
      { ttlMs: 1000, maxStaleMs: 2000, maxEntries: 10, serveStale: true, now: () => t },
    );
    await cache.get("ten_a");
    t = 1500;
    expect(cache.peek("ten_a")?.status).toBe("active"); // stale: starts the refresh, which hangs
    t = 60_000;
    expect(cache.peek("ten_a")?.status).toBe("active");
    expect((await cache.get("ten_a")).status).toBe("active");
    expect(reads).toBe(2);
    release({ status: "suspended", reason: null });
    await flush();
    expect(cache.known("ten_a")?.status).toBe("suspended");
    // What it read is as old as the read's start: too old to serve without another read.
    expect(cache.peek("ten_a")).toBeUndefined();
    expect((await cache.get("ten_a")).status).toBe("suspended");
    expect(reads).toBe(3);
  });

  it("while the database is down a loaded status is served at any age; a tenant never loaded is database_unavailable", async () => {
    const h = harness({ ttlMs: 1000, serveStale: true, maxStaleMs: 3000 });
    await h.cache.get("ten_a");
    h.setDown(true);
    h.advance(10_000);
    expect((await h.cache.get("ten_a")).status).toBe("active"); // waits for one failed read
    expect(h.cache.peek("ten_a")?.status).toBe("active"); // then from memory, refreshing in the background
    await expect(h.cache.get("ten_b")).rejects.toMatchObject({ code: "database_unavailable" });
    h.setDown(false);
    h.db.set("ten_a", { status: "suspended", reason: null });
    h.cache.peek("ten_a");
    await flush();
    expect(h.cache.peek("ten_a")?.status).toBe("suspended");
  });

  it("without stale serving (Workers) a stale status is re-read before use, and TTL 0 reads on every get", async () => {
    const h = harness({ ttlMs: 1000, serveStale: false });
    await h.cache.get("ten_a");
    h.advance(1001);
    expect(h.cache.peek("ten_a")).toBeUndefined();
    h.db.set("ten_a", { status: "suspended", reason: null });
    expect((await h.cache.get("ten_a")).status).toBe("suspended");
    const zero = harness({ ttlMs: 0, serveStale: false });
    for (let i = 0; i < 3; i++) await zero.cache.get("ten_a");
    expect(zero.reads()).toBe(3);
    expect(zero.cache.known("ten_a")?.status).toBe("active");
  });

  it("names why a tenant is refused", () => {
    expect(tenantRefusal("ten_a", { status: "active", reason: null })).toBeUndefined();
    expect(tenantRefusal("ten_a", { status: "missing", reason: null })).toMatchObject({
      code: "tenant_not_found",
      status: 403,
      message: "tenant ten_a does not exist",
    });
    expect(tenantRefusal("ten_a", { status: "suspended", reason: "unpaid" })).toMatchObject({
      code: "tenant_suspended",
      status: 403,
      message: "tenant ten_a is suspended: unpaid",
    });
    expect(tenantRefusal("ten_a", { status: "suspended", reason: null })).toMatchObject({ message: "tenant ten_a is suspended" });
    expect(tenantRefusal("ten_a", { status: "deleted", reason: null })).toMatchObject({
      code: "tenant_deleted",
      status: 403,
      message: "tenant ten_a was deleted",
    });
  });
});

// The tenant gate: a token's tenant, and a called agent's, must exist and be active; cached statuses, first-use provisioning.
import { AppError } from "../../lib/errors.ts";
import type { Logger } from "../../lib/log.ts";
import { COMPOSED_HANDLER } from "hono/utils/constants";
import { routeAccessOf, type Caller, type RouteAccess } from "../../contracts/caller.ts";
import type { AuditLog } from "../../schema/audit-log.ts";
import { createTenantStatusCache, type TenantStanding } from "./status-cache.ts";
import type { TenantRow, TenantStore } from "./store.ts";

export type { TenantStanding };

export interface TenantGateConfig {
  /** How long a tenant's status is trusted from memory, ms (TENANT_CACHE_TTL_MS); 0: read on every check. */
  cacheTtlMs: number;
  /** A verified token of an unknown tenant creates it (TENANTS_AUTO_PROVISION). */
  autoProvision: boolean;
  /** A stale status is served while it is refreshed in the background (Node); false on Workers. */
  serveStale: boolean;
}

export const defaultTenantGateConfig: TenantGateConfig = { cacheTtlMs: 5000, autoProvision: false, serveStale: true };

/** What an explicit tenant id (and a provisioned token's tenant claim) may be: 1–64 of letters, digits, `_`, `-`, `.`, starting with a letter or digit. */
export const tenantIdPattern = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;

export interface TenantGate {
  /** The caller's tenant must be active: 403 tenant_not_found / tenant_suspended / tenant_deleted. Provisions an unknown one when configured. */
  admit(caller: Caller, requestId: string): Promise<void>;
  /** Loads the tenant's status (cached) so `assertActive` can decide from memory. */
  load(tenantId: string): Promise<void>;
  /** The tenant's status is in memory and usable without waiting (a warm call decides synchronously). */
  ready(tenantId: string): boolean;
  /** Throws the tenant's refusal, from memory (after `load`, `admit` or `ready`). */
  assertActive(tenantId: string): void;
  /** This process changed the tenant (or created it): the new status applies here at once. */
  changed(row: TenantRow): void;
}

export interface TenantGateDeps {
  store: TenantStore;
  audit: AuditLog;
  log: Logger;
  config: TenantGateConfig;
}

/** The tenant's refusal, or undefined when it is active. */
export function tenantRefusal(tenantId: string, standing: TenantStanding): AppError | undefined {
  const id = tenantId.slice(0, 64);
  switch (standing.status) {
    case "active":
      return undefined;
    case "missing":
      return new AppError("tenant_not_found", `tenant ${id} does not exist`);
    case "suspended":
      return new AppError("tenant_suspended", `tenant ${id} is suspended${standing.reason ? `: ${standing.reason}` : ""}`);
    case "deleted":
      return new AppError("tenant_deleted", `tenant ${id} was deleted`);
  }
}

export const standingOf = (row: TenantRow | undefined): TenantStanding =>
  row ? { status: row.status, reason: row.statusReason } : { status: "missing", reason: null };

/**
 * An operator token on a route that declares `tenantGate: "not-operators"` (the operator's routes: tenants, rate
 * cards, the audit chain's verification, templates, hosts; see `scopeGate`): its tenant claim is not checked there (an
 * operator's need not exist). Any other token, or any other route, is checked. `routes`: the handlers the request
 * matched (`matchedRoutes` of hono/route), whose scope gates carry the declarations.
 */
export function skipsTenantCheck(caller: Caller, routes: readonly { handler: unknown }[]): boolean {
  if (!caller.scopes.has("operator")) return false;
  for (const r of routes) if (declaredAccess(r.handler)?.tenantGate === "not-operators") return true;
  return false;
}

/** A route's declaration, also through the wrapper Hono puts around the routes of a sub-app with its own error handler. */
function declaredAccess(handler: unknown): RouteAccess | undefined {
  return (
    routeAccessOf(handler) ?? (typeof handler === "function" ? routeAccessOf((handler as unknown as Record<string, unknown>)[COMPOSED_HANDLER]) : undefined)
  );
}

export function createTenantGate(deps: TenantGateDeps): TenantGate {
  const { store, config } = deps;
  const cache = createTenantStatusCache(async (id) => standingOf(await store.get(id)), {
    ttlMs: config.cacheTtlMs,
    // The staleness bound other gateways' changes are seen within: 2 × TTL at most (TTL plus one read under traffic).
    maxStaleMs: config.cacheTtlMs * 2,
    maxEntries: 100_000,
    serveStale: config.serveStale,
  });

  function assertActive(tenantId: string): void {
    const standing = cache.known(tenantId);
    // Only when 100,000 other tenants were loaded between a load and this check: the caller retries.
    if (!standing) throw new AppError("server_busy", "tenant status not in memory; retry", { retryAfterS: 1 });
    const refusal = tenantRefusal(tenantId, standing);
    if (refusal) throw refusal;
  }

  async function provision(caller: Caller, requestId: string): Promise<void> {
    const id = caller.tenantId;
    if (!tenantIdPattern.test(id)) throw new AppError("tenant_not_found", `tenant ${id.slice(0, 64)} does not exist (and is no tenant id that may be created)`);
    const row = await store.create({ id, name: id, timeZone: "UTC" });
    if (row) {
      await deps.audit.record({
        tenantId: id,
        actor: caller.subject,
        action: "tenant.provision",
        target: id,
        requestId,
        detail: { name: id, timeZone: "UTC" },
      });
      deps.log.info("tenant provisioned on first use", { tenantId: id, subject: caller.subject, requestId });
    }
    // Created here, or by a concurrent first call: its row says what it is now.
    cache.set(id, standingOf(row ?? (await store.get(id))));
  }

  return {
    async admit(caller, requestId) {
      const standing = await cache.get(caller.tenantId);
      if (standing.status === "missing" && config.autoProvision) await provision(caller, requestId);
      assertActive(caller.tenantId);
    },
    async load(tenantId) {
      await cache.get(tenantId);
    },
    ready(tenantId) {
      const standing = cache.peek(tenantId);
      // An unknown tenant that is to be provisioned needs `admit`, which writes.
      return standing !== undefined && !(standing.status === "missing" && config.autoProvision);
    },
    assertActive,
    changed(row) {
      cache.set(row.id, standingOf(row));
    },
  };
}

/** The agent a webhook intake path (`/hooks/{agentId}/{endpoint}`) names, unvalidated; undefined for other paths. */
export function hookAgentId(path: string): string | undefined {
  if (!path.startsWith("/hooks/")) return undefined;
  const end = path.indexOf("/", 7);
  const id = end === -1 ? path.slice(7) : path.slice(7, end);
  return id === "" ? undefined : id;
}

// Agent settings the proxy reads on every call (rules, per-agent limits), their store, and a short-lived cache of them.
import { eq, inArray } from "drizzle-orm";
import type { Db } from "../../schema/db.ts";
import { asDatabaseError, isDatabaseUnavailable } from "../../schema/db-errors.ts";
import { agents, type NonWakingRules } from "../../schema/core.ts";
import { agentProxyLimits } from "../../schema/proxy.ts";
import type { AgentRepo, AgentRow } from "../agents/repo.ts";

/** Per-agent overrides of the gateway's proxy limits; null = the global value. */
export interface AgentLimitOverrides {
  responseTimeoutMs: number | null;
  proxyIdleTimeoutMs: number | null;
  maxBodyBytes: number | null;
}

export const noOverrides: AgentLimitOverrides = { responseTimeoutMs: null, proxyIdleTimeoutMs: null, maxBodyBytes: null };

export interface AgentSettingsPatch {
  idleTimeoutMs?: number;
  streamIdleMs?: number;
  /** null resets to the defaults. */
  nonWaking?: NonWakingRules | null;
  limits?: Partial<AgentLimitOverrides>;
  /** Taken by the agent's next start (the route refuses it while the agent is awake). */
  allowEgress?: boolean;
}

/** Reads and writes what PATCH /v1/agents/:id changes (the agents row and the agent_proxy_limits row). */
export interface AgentSettingsStore {
  limits(agentId: string): Promise<AgentLimitOverrides>;
  /** The overrides of each of `agentIds` in one read (a page of a list); an agent without any maps to `noOverrides`. */
  limitsMany(agentIds: readonly string[]): Promise<Map<string, AgentLimitOverrides>>;
  update(agentId: string, patch: AgentSettingsPatch): Promise<void>;
}

export function createAgentSettingsStore(db: Db): AgentSettingsStore {
  const overridesOf = (r: typeof agentProxyLimits.$inferSelect): AgentLimitOverrides => ({
    responseTimeoutMs: r.responseTimeoutMs,
    proxyIdleTimeoutMs: r.proxyIdleTimeoutMs,
    maxBodyBytes: r.maxBodyBytes,
  });
  return {
    async limits(agentId) {
      const rows = await db.select().from(agentProxyLimits).where(eq(agentProxyLimits.agentId, agentId)).limit(1);
      return rows[0] ? overridesOf(rows[0]) : noOverrides;
    },
    async limitsMany(agentIds) {
      const out = new Map<string, AgentLimitOverrides>(agentIds.map((id) => [id, noOverrides]));
      if (agentIds.length === 0) return out;
      const rows = await db
        .select()
        .from(agentProxyLimits)
        .where(inArray(agentProxyLimits.agentId, [...agentIds]));
      for (const r of rows) out.set(r.agentId, overridesOf(r));
      return out;
    },
    async update(agentId, patch) {
      const set: Partial<typeof agents.$inferInsert> = {};
      if (patch.idleTimeoutMs !== undefined) set.idleTimeoutMs = patch.idleTimeoutMs;
      if (patch.streamIdleMs !== undefined) set.streamIdleMs = patch.streamIdleMs;
      if (patch.nonWaking !== undefined) set.nonWaking = patch.nonWaking;
      if (patch.allowEgress !== undefined) set.allowEgress = patch.allowEgress;
      if (Object.keys(set).length > 0) await db.update(agents).set(set).where(eq(agents.id, agentId));
      const limits = patch.limits;
      if (limits && Object.keys(limits).length > 0) {
        const values = { ...limits, updatedAt: new Date() };
        await db
          .insert(agentProxyLimits)
          .values({ agentId, ...values })
          .onConflictDoUpdate({ target: agentProxyLimits.agentId, set: values });
      }
    },
  };
}

/** What the proxy needs of an agent, as loaded: its row and its limit overrides. */
export interface LoadedAgent {
  row: AgentRow;
  overrides: AgentLimitOverrides;
}

export interface AgentCache {
  /** The agent (undefined when it does not exist or was deleted), from memory when fresh enough. */
  get(agentId: string): Promise<LoadedAgent | undefined>;
  /** The agent from memory, without waiting: fresh, or stale within bounds (then refreshed in the background); else undefined. */
  peek(agentId: string): LoadedAgent | undefined;
  /** Forgets an agent after this process changed or deleted it. */
  invalidate(agentId: string): void;
}

interface Entry {
  value: LoadedAgent | undefined;
  loadedAt: number;
  refreshing: Promise<LoadedAgent | undefined> | undefined;
  /** The last refresh failed because the database is unavailable: the row is served as it is, however old. */
  outage: boolean;
}

/**
 * Agent rows cached for `ttlMs`. A row older than that is still served while one refresh runs in the background
 * (a call never waits for the database on a warm agent), up to `maxStaleMs`; unknown ids are remembered for `ttlMs`
 * so a flood of them does not reach the database. Changes made through this process invalidate at once; other
 * gateway processes see them within `ttlMs` plus one refresh.
 *
 * While the database is unavailable a row this process has loaded is served at any age (it cannot change meanwhile:
 * changing it needs the database): the first call past `maxStaleMs` waits for one failed refresh, the ones after it
 * do not wait at all, and a background refresh keeps trying. An agent never loaded fails with `database_unavailable`.
 */
export function createAgentCache(
  repo: Pick<AgentRepo, "get">,
  settings: Pick<AgentSettingsStore, "limits"> | undefined,
  opts: { ttlMs: number; maxStaleMs: number; maxEntries: number; now?: () => number },
): AgentCache {
  if (opts.ttlMs === 0) return uncached(repo, settings);
  const entries = new Map<string, Entry>();
  const now = opts.now ?? (() => performance.now());

  const load = (agentId: string) => loadAgent(repo, settings, agentId);

  function refresh(agentId: string, entry: Entry | undefined): Promise<LoadedAgent | undefined> {
    if (entry?.refreshing) return entry.refreshing;
    const started = now();
    const target: Entry = entry ?? { value: undefined, loadedAt: -Infinity, refreshing: undefined, outage: false };
    const p = load(agentId).then(
      (value) => {
        // An invalidation while loading wins: the entry was dropped, the loaded value may predate the change.
        if (entries.get(agentId) === target) {
          target.value = value;
          target.loadedAt = started;
          target.refreshing = undefined;
          target.outage = false;
        }
        return value;
      },
      (err: unknown) => {
        target.refreshing = undefined;
        if (!isDatabaseUnavailable(err)) throw err;
        target.outage = true;
        if (target.value) return target.value;
        throw asDatabaseError(err);
      },
    );
    target.refreshing = p;
    if (!entry) {
      if (entries.size >= opts.maxEntries) entries.delete(entries.keys().next().value!);
      entries.set(agentId, target);
    }
    return p;
  }

  return {
    peek(agentId) {
      const e = entries.get(agentId);
      if (!e?.value) return undefined;
      const age = now() - e.loadedAt;
      if (age < opts.ttlMs) return e.value;
      if (age < opts.maxStaleMs || e.outage) {
        void refresh(agentId, e).catch(() => undefined);
        return e.value;
      }
      return undefined;
    },
    get(agentId) {
      const e = entries.get(agentId);
      if (e && e.loadedAt !== -Infinity) {
        const age = now() - e.loadedAt;
        if (age < opts.ttlMs) return Promise.resolve(e.value);
        if (e.value && (age < opts.maxStaleMs || e.outage)) {
          void refresh(agentId, e).catch(() => undefined);
          return Promise.resolve(e.value);
        }
      }
      return refresh(agentId, e);
    },
    invalidate(agentId) {
      entries.delete(agentId);
    },
  };
}

async function loadAgent(
  repo: Pick<AgentRepo, "get">,
  settings: Pick<AgentSettingsStore, "limits"> | undefined,
  agentId: string,
): Promise<LoadedAgent | undefined> {
  const row = await repo.get(agentId);
  if (!row) return undefined;
  const overrides = settings ? await settings.limits(agentId) : noOverrides;
  return { row, overrides };
}

/** `ttlMs` 0: every call reads the row, nothing is kept or refreshed in the background (a Worker, whose requests share no I/O). */
function uncached(repo: Pick<AgentRepo, "get">, settings: Pick<AgentSettingsStore, "limits"> | undefined): AgentCache {
  return {
    get: (agentId) =>
      loadAgent(repo, settings, agentId).catch((err: unknown) => {
        throw asDatabaseError(err);
      }),
    peek: () => undefined,
    invalidate: () => undefined,
  };
}

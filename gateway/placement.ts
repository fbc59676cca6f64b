// Which host runs an agent: the one in `agents.host_id`, else the live host with room and the freshest heartbeat (recorded atomically).
import { sql } from "drizzle-orm";
import type { Clock } from "../lib/clock.ts";
import { AppError } from "../lib/errors.ts";
import type { AgentSpec } from "../contracts/agent.ts";
import { queryRows, type Db } from "../schema/postgres.ts";
import { asDatabaseError, isDatabaseUnavailable } from "../schema/db-errors.ts";

export interface PlacedHost {
  id: string;
  /** Base URL of the host's ingress. */
  url: string;
  /** Heartbeat within the live window (a host that is not live is still tried for the agents it holds). */
  live: boolean;
}

export interface Placement {
  /** The host that runs `agent`, placing the agent on one first when it has none. */
  hostFor(agent: AgentSpec): Promise<PlacedHost>;
  /** The host the agent is on, without placing it; undefined when it never had one. */
  currentHost(agentId: string): Promise<PlacedHost | undefined>;
  /** `currentHost` of several agents in one look-up (a page of a list): agents without a host are left out. */
  currentHosts(agentIds: readonly string[]): Promise<Map<string, PlacedHost>>;
  /** Drops what is cached about the agent (its host did not answer). */
  forget(agentId: string): void;
  /** The live hosts with an ingress URL, by id: what `GET /v1/templates` asks, one call each. */
  liveHosts?(): Promise<PlacedHost[]>;
}

export interface PlacementOptions {
  /** A host whose last heartbeat is older than this is not live: no new agents go there. */
  liveWindowMs: number;
  /** How long an agent → host answer is reused before asking the database again (0: always ask). */
  cacheTtlMs: number;
  clock: Clock;
  /** Told once per outage that kept answers are being used (the database is unavailable). */
  onOutage?: (err: unknown) => void;
}

/** A host as placement weighs it: live ones with an ingress URL, and the memory of their awake agents. */
export interface HostLoad {
  id: string;
  url: string;
  capacityMiB: number;
  /** Memory of this host's agents that are awake (or waking, or being snapshotted) now; hibernated ones cost disk only. */
  usedMiB: number;
  lastHeartbeatAt: Date;
}

/** The host a new agent goes to: enough free memory for it, then the freshest heartbeat, then the most room. */
export function chooseHost(hosts: readonly HostLoad[], memMiB: number): HostLoad | undefined {
  return hosts
    .filter((h) => h.capacityMiB - h.usedMiB >= memMiB)
    .sort((a, b) => b.lastHeartbeatAt.getTime() - a.lastHeartbeatAt.getTime() || b.capacityMiB - b.usedMiB - (a.capacityMiB - a.usedMiB) || a.id.localeCompare(b.id))[0];
}

/** A cache shared by the placements of one process (a Worker builds a placement per request over its own db client). */
export type PlacementCache = Map<string, { host: PlacedHost; at: number }>;

/** Agents whose host a placement cache keeps at most (the oldest answer goes first). */
const maxCachedPlacements = 100_000;

export function createDbPlacement(db: Db, opts: PlacementOptions, cache: PlacementCache = new Map()): Placement {
  const liveWindow = sql`make_interval(secs => ${opts.liveWindowMs / 1000})`;

  async function current(agentId: string): Promise<{ found: boolean; state: string; host: PlacedHost | undefined; hostId: string | null }> {
    const rows = await queryRows<{ host_id: string | null; state: string; url: string | null; live: boolean | null }>(
      db,
      sql`select a.host_id, a.state, h.url, h.last_heartbeat_at > now() - ${liveWindow} as live
          from agents a left join hosts h on h.id = a.host_id
          where a.id = ${agentId} and a.deleted_at is null`,
    );
    const row = rows[0];
    if (!row) return { found: false, state: "", host: undefined, hostId: null };
    const host = row.host_id && row.url ? { id: row.host_id, url: row.url, live: row.live === true } : undefined;
    return { found: true, state: row.state, host, hostId: row.host_id };
  }

  async function candidates(): Promise<HostLoad[]> {
    const rows = await queryRows<{ id: string; url: string; capacity_mib: number; used_mib: string | number; last_heartbeat_at: Date | string }>(
      db,
      sql`select h.id, h.url, h.capacity_mib, h.last_heartbeat_at,
                 coalesce(sum(a.mem_mib) filter (where a.deleted_at is null and a.state in ('booting', 'running', 'restoring', 'snapshotting')), 0) as used_mib
          from hosts h left join agents a on a.host_id = h.id
          where h.url is not null and h.last_heartbeat_at > now() - ${liveWindow}
          group by h.id`,
    );
    return rows.map((r) => ({ id: r.id, url: r.url, capacityMiB: r.capacity_mib, usedMiB: Number(r.used_mib), lastHeartbeatAt: new Date(r.last_heartbeat_at) }));
  }

  function remember(agentId: string, host: PlacedHost): PlacedHost {
    if (opts.cacheTtlMs > 0 && host.live) {
      cache.delete(agentId); // re-inserted last: the map's order is the age of its answers
      if (cache.size >= maxCachedPlacements) cache.delete(cache.keys().next().value!);
      cache.set(agentId, { host, at: opts.clock.monotonic() });
    }
    return host;
  }

  function cached(agentId: string): PlacedHost | undefined {
    const hit = cache.get(agentId);
    return hit && opts.clock.monotonic() - hit.at < opts.cacheTtlMs ? hit.host : undefined;
  }

  /** The last database call failed as unavailable (the outage is told once, not per call). */
  let outage = false;

  /**
   * `ask` answers from the database; when the database is unavailable the host this process last knew for the agent
   * stands in, however old (an agent's host changes only through the database), and is trusted for another TTL so
   * calls meanwhile do not wait on the database. The host itself is the check: one that is unreachable, or refuses
   * the call as not its own, is forgotten (remote-fleet.ts). Without a kept answer: 503 database_unavailable.
   */
  async function orKept(agentId: string, ask: () => Promise<PlacedHost | undefined>): Promise<PlacedHost | undefined> {
    try {
      const host = await ask();
      outage = false;
      return host;
    } catch (err) {
      if (!isDatabaseUnavailable(err)) throw err;
      if (!outage) opts.onOutage?.(err);
      outage = true;
      const kept = cache.get(agentId);
      if (!kept) throw asDatabaseError(err);
      kept.at = opts.clock.monotonic();
      return kept.host;
    }
  }

  return {
    async liveHosts() {
      return (await candidates()).map((h) => ({ id: h.id, url: h.url, live: true })).sort((a, b) => a.id.localeCompare(b.id));
    },
    async hostFor(agent) {
      const hit = cached(agent.id);
      if (hit) return hit;
      return (await orKept(agent.id, () => place(agent)))!;
    },
    async currentHost(agentId) {
      return cached(agentId) ?? orKept(agentId, async () => (await current(agentId)).host);
    },
    async currentHosts(agentIds) {
      const out = new Map<string, PlacedHost>();
      const asked: string[] = [];
      for (const id of agentIds) {
        const hit = cached(id);
        if (hit) out.set(id, hit);
        else asked.push(id);
      }
      if (asked.length === 0) return out;
      try {
        const rows = await queryRows<{ id: string; host_id: string; url: string; live: boolean | null }>(
          db,
          sql`select a.id, a.host_id, h.url, h.last_heartbeat_at > now() - ${liveWindow} as live
              from agents a join hosts h on h.id = a.host_id
              where a.id in (${sql.join(asked.map((id) => sql`${id}`), sql`, `)}) and a.deleted_at is null and h.url is not null`,
        );
        outage = false;
        for (const r of rows) out.set(r.id, remember(r.id, { id: r.host_id, url: r.url, live: r.live === true }));
      } catch (err) {
        // As for one agent: while the database is away, the hosts this process last knew stand in (a listing shows the rest as recorded).
        if (!isDatabaseUnavailable(err)) throw err;
        if (!outage) opts.onOutage?.(err);
        outage = true;
        for (const id of asked) {
          const kept = cache.get(id);
          if (kept) out.set(id, kept.host);
        }
      }
      return out;
    },
    forget(agentId) {
      cache.delete(agentId);
    },
  };

  async function place(agent: AgentSpec): Promise<PlacedHost> {
    for (let attempt = 0; attempt < 3; attempt++) {
      const now = await current(agent.id);
      if (!now.found) throw new AppError("not_found", `agent ${agent.id} not found`);
      // An agent that has run keeps its host: its snapshot is on that host's disk. Only one that never ran moves.
      const movable = now.state === "creating";
      if (now.host && (now.host.live || !movable)) return remember(agent.id, now.host);
      if (now.hostId && !movable) throw new AppError("wake_failed", `agent ${agent.id} is on host ${now.hostId}, which has no ingress URL`, { retryAfterS: 10 });
      const choice = chooseHost(await candidates(), agent.memMiB);
      if (!choice) throw new AppError("wake_failed", `no live host has ${agent.memMiB} MiB free for agent ${agent.id}`, { retryAfterS: 10 });
      // Compare-and-set: when gateways race, one placement wins and the others read it on the next round.
      const updated = await queryRows<{ id: string }>(
        db,
        sql`update agents set host_id = ${choice.id}
            where id = ${agent.id} and host_id is not distinct from ${now.hostId}
            returning id`,
      );
      if (updated.length === 1) return remember(agent.id, { id: choice.id, url: choice.url, live: true });
    }
    throw new AppError("conflict", `agent ${agent.id} is being placed concurrently; retry`, { retryAfterS: 1 });
  }
}

// The hosts as the operator sees them: their rows with liveness, load and agent counts, paged by id; drain marks.
import { sql, type SQL } from "drizzle-orm";
import { queryRows, type Db } from "../../schema/postgres.ts";

export interface HostRow {
  id: string;
  /** Base URL of the host's ingress; null when it serves only the gateway in its own process. */
  url: string | null;
  driver: string;
  capacityMiB: number;
  /** Memory of its awake agents and how many they were, as the host reported at its last heartbeat. */
  usedMiB: number;
  awakeAgents: number;
  /** Its agents that are not deleted, awake or not (the rows' `host_id`). */
  agents: number;
  /** The host's clock minus the database's at its last heartbeat, ms (positive: the host is ahead). */
  clockSkewMs: number;
  /** Heartbeat within the live window. */
  live: boolean;
  lastHeartbeatAt: Date;
  /** How long ago the last heartbeat was, by the database's clock, ms (what `live` is decided on). */
  heartbeatAgeMs: number;
  startedAt: Date;
  drainingAt: Date | null;
}

export interface HostRepo {
  /** Hosts by id, after `after` (keyset), at most `limit`. */
  list(page: { limit: number; after?: string | undefined }): Promise<HostRow[]>;
  get(id: string): Promise<HostRow | undefined>;
  /**
   * Marks the host draining since `at` (kept when it already is: the first drain's time stands) or, with null, no
   * longer draining. Undefined when no host has the id; `changed` says whether this call changed the column.
   */
  setDraining(id: string, at: Date | null): Promise<{ host: HostRow; changed: boolean } | undefined>;
}

export interface HostRepoOptions {
  /** A host whose last heartbeat is older than this is not live (HOST_LIVE_WINDOW_MS, as placement decides). */
  liveWindowMs: number;
}

interface Raw {
  id: string;
  url: string | null;
  driver: string;
  capacity_mib: number;
  used_mib: number;
  awake_agents: number;
  clock_skew_ms: number;
  last_heartbeat_at: Date | string;
  started_at: Date | string;
  draining_at: Date | string | null;
  heartbeat_age_ms: number | string;
  agents: number | string;
}

export function createHostRepo(db: Db, opts: HostRepoOptions): HostRepo {
  const toRow = (r: Raw): HostRow => {
    const heartbeatAgeMs = Math.max(0, Math.round(Number(r.heartbeat_age_ms)));
    return {
      id: r.id,
      url: r.url,
      driver: r.driver,
      capacityMiB: r.capacity_mib,
      usedMiB: r.used_mib,
      awakeAgents: r.awake_agents,
      agents: Number(r.agents),
      clockSkewMs: r.clock_skew_ms,
      live: Number(r.heartbeat_age_ms) < opts.liveWindowMs,
      lastHeartbeatAt: new Date(r.last_heartbeat_at),
      heartbeatAgeMs,
      startedAt: new Date(r.started_at),
      drainingAt: r.draining_at === null ? null : new Date(r.draining_at),
    };
  };

  // One pass over the page's agents (agents.host_id has no index: a count per host would scan once per host).
  async function select(where: SQL, limit: number): Promise<HostRow[]> {
    const rows = await queryRows<Raw>(
      db,
      sql`with page as (select * from hosts where ${where} order by id limit ${limit})
          select p.id, p.url, p.driver, p.capacity_mib, p.used_mib, p.awake_agents, p.clock_skew_ms,
                 p.last_heartbeat_at, p.started_at, p.draining_at,
                 extract(epoch from (now() - p.last_heartbeat_at))::float8 * 1000 as heartbeat_age_ms,
                 coalesce(c.n, 0) as agents
          from page p
          left join (select host_id, count(*)::int as n from agents
                     where deleted_at is null and host_id in (select id from page) group by host_id) c on c.host_id = p.id
          order by p.id`,
    );
    return rows.map(toRow);
  }

  const get = async (id: string) => (await select(sql`id = ${id}`, 1))[0];

  return {
    list: (page) => select(page.after === undefined ? sql`true` : sql`id > ${page.after}`, page.limit),
    get,
    async setDraining(id, at) {
      const changed =
        at === null
          ? await queryRows<{ id: string }>(db, sql`update hosts set draining_at = null where id = ${id} and draining_at is not null returning id`)
          : await queryRows<{ id: string }>(
              db,
              sql`update hosts set draining_at = ${at.toISOString()}::timestamptz where id = ${id} and draining_at is null returning id`,
            );
      const host = await get(id);
      return host ? { host, changed: changed.length > 0 } : undefined;
    },
  };
}

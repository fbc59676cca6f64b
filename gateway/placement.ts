// Which host runs an agent: the one in `agents.host_id` while its lease holds (heartbeat within the live window), else a
// healthy host with the most free memory, recorded atomically with a new lease generation (a dead host's agents move).
import { sql } from "drizzle-orm";
import type { Clock } from "../lib/clock.ts";
import { AppError } from "../lib/errors.ts";
import { type AgentSpec, vmIdFor } from "../contracts/agent.ts";
import { queryRows, type Db } from "../schema/postgres.ts";
import { asDatabaseError, isDatabaseUnavailable, isTransactionConflict } from "../schema/db-errors.ts";

export interface PlacedHost {
  id: string;
  /** Base URL of the host's ingress. */
  url: string;
  /** Heartbeat within the live window (a host that is not live is still tried for the agents it holds). */
  live: boolean;
  /** The agent's lease generation on this host (`agents.generation`): calls carry it so a stale host refuses them. */
  generation: number;
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
  /** A call to the host at this URL failed to connect: no new agents go there until a probe reaches it again (or it registers another URL). */
  unreachable?(host: { id: string; url: string }): void;
}

/** Asks whether the gateway can reach a host's ingress now (its `/healthz` answers with its id); cached by the placement. */
export type HostProbe = (host: { id: string; url: string }) => Promise<boolean>;

export interface PlacementOptions {
  /** A host whose last heartbeat is older than this is not live: no new agents go there. */
  liveWindowMs: number;
  /** How long an agent → host answer is reused before asking the database again (0: always ask). */
  cacheTtlMs: number;
  clock: Clock;
  /** Told once per outage that kept answers are being used (the database is unavailable). */
  onOutage?: (err: unknown) => void;
  /** A host whose clock differs from the database's by more than this (it reports its own at each heartbeat) takes no new agents, ms. Default 2000. */
  maxClockSkewMs?: number;
  /** Memory kept free on every host (not offered to agents), MiB. Default 0. */
  reserveMiB?: number;
  /** Reachability of a candidate host, asked before placing on it (answers kept `probeTtlMs`); none: every live host counts as reachable. */
  probe?: HostProbe;
  probeTtlMs?: number;
  /** Told of each agent moved off a host whose lease ended (failover) or that is draining. */
  onMove?: (move: AgentMove) => void;
}

/** One agent moved to another host: its lease generation rose from `generation - 1`. */
export interface AgentMove {
  agentId: string;
  fromHostId: string;
  toHostId: string;
  generation: number;
  /** `host_lost`: the old host's lease ended; `drain`: an operator drains it. */
  reason: "host_lost" | "drain";
}

/** A host as placement weighs it: a healthy one (live, clock within bounds, not draining) with an ingress URL. */
export interface HostLoad {
  id: string;
  url: string;
  capacityMiB: number;
  /** Memory of the host's awake agents as it reported at its last heartbeat; hibernated ones cost disk only. */
  usedMiB: number;
  /** Memory of agents placed on it that have not run yet (they wake there at their first call). */
  pendingMiB: number;
  /** Its agents (not deleted), whatever their state. */
  agents: number;
}

/**
 * The host a new agent goes to: one whose reported free memory (capacity − reserve − used) fits it; among them the
 * most free once agents placed but not yet run are counted too (so a burst of creates spreads before any heartbeat
 * reports them), then the fewest agents, then the id.
 */
export function chooseHost(hosts: readonly HostLoad[], memMiB: number, reserveMiB = 0): HostLoad | undefined {
  const free = (h: HostLoad) => h.capacityMiB - reserveMiB - h.usedMiB;
  return hosts
    .filter((h) => free(h) >= memMiB)
    .sort((a, b) => free(b) - b.pendingMiB - (free(a) - a.pendingMiB) || a.agents - b.agents || a.id.localeCompare(b.id))[0];
}

/** A cache shared by the placements of one process (a Worker builds a placement per request over its own db client). */
export type PlacementCache = Map<string, { host: PlacedHost; at: number }>;

/** Agents whose host a placement cache keeps at most (the oldest answer goes first). */
const maxCachedPlacements = 100_000;

export function createDbPlacement(db: Db, opts: PlacementOptions, cache: PlacementCache = new Map()): Placement {
  const liveWindow = sql`make_interval(secs => ${opts.liveWindowMs / 1000})`;

  const maxSkew = opts.maxClockSkewMs ?? 2000;
  const probeTtlMs = opts.probeTtlMs ?? 5000;
  /**
   * This process's last probe of each host: a host it could not reach takes no new agents until a probe succeeds. An
   * answer is about one URL: a host that restarted at another one is asked again at once.
   */
  const reach = new Map<string, { ok: boolean; at: number; url: string }>();
  /**
   * Memory this process just moved onto each host (a failover, a drain): a moved agent sleeps there, so neither the
   * host's report (awake agents) nor the agents placed but not yet run count it until it wakes and the next heartbeat
   * says so. Counted as used for `movedInMs`, so a burst of moves spreads over the hosts and stays within their
   * capacity instead of all landing on the one that looked emptiest.
   */
  const movedIn = new Map<string, { mib: number; at: number }[]>();
  const movedInMs = 5000;
  function movedInMiB(hostId: string): number {
    const now = opts.clock.monotonic();
    const kept = (movedIn.get(hostId) ?? []).filter((m) => now - m.at < movedInMs);
    if (kept.length > 0) movedIn.set(hostId, kept);
    else movedIn.delete(hostId);
    return kept.reduce((sum, m) => sum + m.mib, 0);
  }

  async function reachable(h: { id: string; url: string }): Promise<boolean> {
    const kept = reach.get(h.id);
    const same = kept !== undefined && kept.url === h.url;
    if (kept && same && opts.clock.monotonic() - kept.at < probeTtlMs) return kept.ok;
    if (!opts.probe) return same ? kept.ok : true;
    const ok = await opts.probe(h).catch(() => false);
    reach.set(h.id, { ok, at: opts.clock.monotonic(), url: h.url });
    return ok;
  }

  /** The agent's row and its host's as placement weighs them (one query). */
  async function current(agentId: string): Promise<{
    found: boolean;
    state: string;
    host: PlacedHost | undefined;
    hostId: string | null;
    generation: number;
    /** Its host is live, its clock within bounds, not draining, and reachable from here: it may take the agent's first run. */
    healthy: boolean;
    draining: boolean;
    /** Another host can take the agent with its state: the process driver keeps none, or its last hibernation is committed to the shared store. */
    carryable: boolean;
  }> {
    const rows = await queryRows<{
      host_id: string | null;
      state: string;
      generation: number;
      url: string | null;
      live: boolean | null;
      skew: number | null;
      draining: boolean | null;
      carryable: boolean | null;
    }>(
      db,
      sql`select a.host_id, a.state, a.generation, h.url, h.last_heartbeat_at > now() - ${liveWindow} as live,
                 h.clock_skew_ms as skew, h.draining_at is not null as draining,
                 (h.driver = 'process' or exists (
                   select 1 from agent_commits c
                   where c.agent_id = a.id and c.generation = a.generation
                     and c.snapshot_at >= coalesce((select max(r.slept_at) from runs r where r.agent_id = a.id and r.host_id = a.host_id), '-infinity'::timestamptz)
                 )) as carryable
          from agents a left join hosts h on h.id = a.host_id
          where a.id = ${agentId} and a.deleted_at is null`,
    );
    const row = rows[0];
    if (!row) return { found: false, state: "", host: undefined, hostId: null, generation: 0, healthy: false, draining: false, carryable: false };
    const generation = Number(row.generation);
    const host = row.host_id && row.url ? { id: row.host_id, url: row.url, live: row.live === true, generation } : undefined;
    // A host whose clock is off drains itself (its gateways' tokens are refused there): its agents leave as a drain's do.
    const draining = row.draining === true || Math.abs(Number(row.skew ?? 0)) > maxSkew;
    const healthy = host?.live === true && !draining && (await reachable(host));
    return { found: true, state: row.state, host, hostId: row.host_id, generation, healthy, draining, carryable: row.carryable === true };
  }

  /** Hosts that may take new agents: live, an ingress URL, the clock within bounds, not draining, reachable from here. */
  async function candidates(): Promise<HostLoad[]> {
    const rows = await queryRows<{ id: string; url: string; capacity_mib: number; used_mib: number; pending_mib: string | number; agents: string | number }>(
      db,
      sql`select h.id, h.url, h.capacity_mib, h.used_mib,
                 coalesce(sum(a.mem_mib) filter (where a.deleted_at is null and a.state = 'creating'), 0) as pending_mib,
                 count(a.id) filter (where a.deleted_at is null) as agents
          from hosts h left join agents a on a.host_id = h.id
          where h.url is not null and h.last_heartbeat_at > now() - ${liveWindow}
            and abs(h.clock_skew_ms) <= ${maxSkew} and h.draining_at is null
          group by h.id`,
    );
    const loads = rows.map((r) => ({
      id: r.id,
      url: r.url,
      capacityMiB: r.capacity_mib,
      usedMiB: Number(r.used_mib),
      pendingMiB: Number(r.pending_mib),
      agents: Number(r.agents),
    }));
    const ok = await Promise.all(loads.map((h) => reachable(h)));
    return loads.filter((_, i) => ok[i]);
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
      return (await candidates()).map((h) => ({ id: h.id, url: h.url, live: true, generation: 0 })).sort((a, b) => a.id.localeCompare(b.id));
    },
    unreachable(host) {
      reach.set(host.id, { ok: false, at: opts.clock.monotonic(), url: host.url });
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
        const rows = await queryRows<{ id: string; host_id: string; url: string; live: boolean | null; generation: number }>(
          db,
          sql`select a.id, a.host_id, a.generation, h.url, h.last_heartbeat_at > now() - ${liveWindow} as live
              from agents a join hosts h on h.id = a.host_id
              where a.id in (${sql.join(
                asked.map((id) => sql`${id}`),
                sql`, `,
              )}) and a.deleted_at is null and h.url is not null`,
        );
        outage = false;
        for (const r of rows) out.set(r.id, remember(r.id, { id: r.host_id, url: r.url, live: r.live === true, generation: Number(r.generation) }));
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

  /**
   * An agent stays on its host while that host's lease holds (its heartbeat is within the live window), unless the host
   * drains (an operator's drain, or its clock off past MAX_CLOCK_SKEW_MS) and the agent sleeps with its state
   * carryable: then it moves. One that never ran also leaves a host that is
   * unhealthy now (skewed clock, draining, unreachable from here): it has nothing there. One whose host's lease ended
   * moves when its state is carryable (the process driver, or its last hibernation committed to the shared store);
   * otherwise it waits for that host (503). A moved agent gets a new lease generation; the old host, if it comes back,
   * sees it and stops its copy (fleet-agent/host.ts `fence`). Its open runs there end at that host's last heartbeat:
   * what it did after that is not billed (at most one heartbeat of metering is lost).
   */
  async function place(agent: AgentSpec): Promise<PlacedHost> {
    for (let attempt = 0; attempt < 3; attempt++) {
      const now = await current(agent.id);
      if (!now.found) throw new AppError("not_found", `agent ${agent.id} not found`);
      const fresh = now.state === "creating";
      let reason: AgentMove["reason"] | undefined;
      if (now.host) {
        const asleep = now.state === "hibernated" || now.state === "stopped";
        if (fresh ? now.healthy : now.host.live && !(now.draining && asleep && now.carryable)) return remember(agent.id, now.host);
        if (!fresh && !now.host.live && !now.carryable) {
          throw new AppError(
            "host_unavailable",
            `agent ${agent.id}'s host ${now.host.id} is not live, and its last snapshot is on that host only (no commit in the shared store): it answers again when the host is back`,
            { retryAfterS: 10 },
          );
        }
        if (!fresh) reason = now.host.live ? "drain" : "host_lost";
      } else if (now.hostId && !fresh) {
        throw new AppError("wake_failed", `agent ${agent.id} is on host ${now.hostId}, which has no ingress URL`, { retryAfterS: 10 });
      }
      const loads = (await candidates()).filter((h) => h.id !== now.hostId);
      const choice = chooseHost(
        loads.map((h) => ({ ...h, usedMiB: h.usedMiB + movedInMiB(h.id) })),
        agent.memMiB,
        opts.reserveMiB,
      );
      // Noted before the move is awaited: the moves of a burst decided meanwhile see it.
      if (choice && reason) movedIn.set(choice.id, [...(movedIn.get(choice.id) ?? []), { mib: agent.memMiB, at: opts.clock.monotonic() }]);
      if (!choice) {
        if (reason === "drain") return remember(agent.id, now.host!); // nowhere to go: it stays on the draining host for now
        if (reason)
          throw new AppError(
            "host_unavailable",
            `agent ${agent.id}'s host ${now.host!.id} is not live, and no other host has ${agent.memMiB} MiB free for it`,
            { retryAfterS: 5 },
          );
        throw new AppError("wake_failed", `no live host has ${agent.memMiB} MiB free for agent ${agent.id}`, { retryAfterS: 10 });
      }
      const moved = await moveAgent(agent.id, now.hostId, now.generation, choice.id, reason);
      if (moved !== undefined) {
        if (reason) opts.onMove?.({ agentId: agent.id, fromHostId: now.hostId!, toHostId: choice.id, generation: moved, reason });
        return remember(agent.id, { id: choice.id, url: choice.url, live: true, generation: moved });
      }
    }
    throw new AppError("conflict", `agent ${agent.id} is being placed concurrently; retry`, { retryAfterS: 1 });
  }

  /**
   * Compare-and-set of the agent's host and generation (gateways racing: one wins, the others read it on the next round).
   * An agent taken from a host whose lease ended (`lost`) gets state `stopped` (that VM is gone for this fleet) and its
   * open runs there end at the old host's last heartbeat, in the same transaction. Answers the new generation, or
   * undefined when it lost the race.
   */
  function moveAgent(
    agentId: string,
    fromHostId: string | null,
    generation: number,
    toHostId: string,
    reason: AgentMove["reason"] | undefined,
  ): Promise<number | undefined> {
    const lost = reason === "host_lost";
    return (
      db
        .transaction(async (tx) => {
          const updated = await queryRows<{ generation: number; state: string }>(
            tx as unknown as Db,
            // From a live host (a drain, a skewed clock, a first run elsewhere) only a row that still says the agent sleeps
            // (or never ran): that host marks the row waking before it wakes one (fleet-agent/store.ts `claimWake`), so of
            // a wake there and this move exactly one goes ahead, never two copies. A lost host's agents move as they are.
            sql`update agents set host_id = ${toHostId}, generation = generation + 1${lost ? sql`, state = 'stopped'` : sql``}
            where id = ${agentId} and host_id is not distinct from ${fromHostId} and generation = ${generation}
              ${lost ? sql`` : sql`and state in ('hibernated', 'stopped', 'creating')`}
            returning generation, state`,
          );
          if (updated.length !== 1) return undefined;
          // The move in the agent's event log (a first placement is none): from the old host, in the same transaction.
          if (fromHostId && reason)
            await queryRows(
              tx as unknown as Db,
              sql`insert into vm_events (host_id, agent_id, vm_id, from_state, to_state, reason, detail)
              values (${fromHostId}, ${agentId}, ${vmIdFor(agentId)}, ${updated[0]!.state}, ${updated[0]!.state}, 'moved',
                      ${JSON.stringify({ why: reason, fromHostId, toHostId, generation: Number(updated[0]!.generation) })}::jsonb)`,
            );
          if (fromHostId && lost) {
            await queryRows(
              tx as unknown as Db,
              sql`update runs set slept_at = greatest(runs.woke_at, h.last_heartbeat_at), sleep_reason = 'host_lost'
              from hosts h
              where h.id = runs.host_id and runs.agent_id = ${agentId} and runs.host_id = ${fromHostId} and runs.slept_at is null`,
            );
          }
          return Number(updated[0]!.generation);
        })
        // Aborted against another transaction (a lease expiry pass, a racing gateway): as if it lost the race; the caller reads again.
        .catch((err: unknown) => {
          if (isTransactionConflict(err)) return undefined;
          throw err;
        })
    );
  }
}

/**
 * Corrects the rows of hosts whose lease ended (no heartbeat within `liveWindowMs`): their agents' rows that still say
 * an awake state become `stopped`, and their open runs end at the host's last heartbeat (reason `host_lost`), so
 * listings and usage stop counting a dead host's agents as awake before anyone calls them. The agents stay on that host
 * until a call moves them (placement) or it comes back. Idempotent: every gateway may run it. Answers what it changed.
 */
/** The advisory lock key of lease expiry passes (any constant no other part of the system takes). */
const leaseExpiryLock = 0x6c656173; // "leas"

export async function expireHostLeases(db: Db, liveWindowMs: number): Promise<{ agents: number; runs: number }> {
  const window = sql`make_interval(secs => ${liveWindowMs / 1000})`;
  // Agents' rows first, then runs: the order a move locks them in (moveAgent). One pass at a time across gateways (a
  // transaction-scoped advisory lock): a pass that finds another under way skips.
  return db.transaction(async (tx) => {
    const [lock] = await queryRows<{ ok: boolean }>(tx as unknown as Db, sql`select pg_try_advisory_xact_lock(${leaseExpiryLock}::bigint) as ok`);
    if (!lock?.ok) return { agents: 0, runs: 0 };
    // Each agent's row stops saying it is awake, and its event log says why (at the host's last heartbeat, naming the
    // run that ends), before the runs are closed.
    const stopped = await queryRows<{ id: string }>(
      tx as unknown as Db,
      sql`with lost as (
            select a.id, a.state, a.host_id, h.last_heartbeat_at as seen
            from agents a join hosts h on h.id = a.host_id
            where a.deleted_at is null and h.last_heartbeat_at < now() - ${window}
              and a.state in ('booting', 'running', 'dozing', 'restoring', 'snapshotting')
            for update of a
          ), stopped as (
            update agents set state = 'stopped' from lost where agents.id = lost.id
            returning agents.id, lost.state as from_state, lost.host_id, lost.seen
          )
          insert into vm_events (at, host_id, agent_id, vm_id, run_id, from_state, to_state, reason, detail)
          select s.seen, s.host_id, s.id, 'vm_' || substr(s.id, 5),
                 (select r.id from runs r where r.agent_id = s.id and r.host_id = s.host_id and r.slept_at is null order by r.woke_at desc limit 1),
                 s.from_state, 'stopped', 'host_lost', jsonb_build_object('lastHeartbeatAt', s.seen)
          from stopped s
          returning agent_id as id`,
    );
    const closed = await queryRows<{ id: string }>(
      tx as unknown as Db,
      sql`update runs set slept_at = greatest(runs.woke_at, h.last_heartbeat_at), sleep_reason = 'host_lost'
          from hosts h
          where h.id = runs.host_id and runs.slept_at is null and h.last_heartbeat_at < now() - ${window}
          returning runs.id`,
    );
    return { agents: stopped.length, runs: closed.length };
  });
}

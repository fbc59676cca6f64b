// Agents and tenants as the gateway reads and writes them (drizzle; Postgres or PGlite).
import { and, asc, desc, eq, getTableColumns, isNull, lt, sql, type SQL } from "drizzle-orm";
import type { Db } from "../../schema/db.ts";
import { agents, checkpoints, tenants, vmEvents, type NonWakingRules } from "../../schema/core.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import type { Caller } from "../../contracts/caller.ts";
import { AppError } from "../../lib/errors.ts";
import { isId } from "../../lib/ids.ts";

export type AgentRow = typeof agents.$inferSelect;
export type NewAgent = Omit<typeof agents.$inferInsert, "createdAt" | "deletedAt" | "state" | "lastWakeAt">;
export type VmEventRow = typeof vmEvents.$inferSelect;

/** Where a page of agents starts: after this agent in the order (createdAt, id); `createdAtUs` is µs since the epoch, as stored. */
export interface AgentPosition {
  createdAtUs: number;
  id: string;
}

/** A page of a tenant's live agents, oldest first: `limit` rows after `after`, filtered. */
export interface AgentPageQuery {
  limit: number;
  after?: AgentPosition | undefined;
  /** The state the database last recorded (`agents.state`). */
  state?: string | undefined;
  namePrefix?: string | undefined;
  /** The agent's `image` (`demo`, `name:tag`), or its `imageDigest` when it starts with `sha256:`. */
  image?: string | undefined;
}

/** A listed agent with its position in the order (the cursor after it). */
export type PagedAgentRow = AgentRow & { createdAtUs: number };

/** A page of an agent's event log, newest first: `limit` events older than `beforeId`, within [since, until). */
export interface EventPageQuery {
  limit: number;
  beforeId?: number | undefined;
  /** ISO-8601 instants (validated by the route), compared by Postgres in µs. */
  since?: string | undefined;
  until?: string | undefined;
}

export interface AgentRepo {
  /** A live (not deleted) agent by id, whatever its tenant: callers check the tenant. */
  get(id: string): Promise<AgentRow | undefined>;
  /** One query: the tenant's live agents in the order (createdAt, id), at most `limit` of them. */
  page(tenantId: string, query: AgentPageQuery): Promise<PagedAgentRow[]>;
  create(agent: NewAgent): Promise<AgentRow>;
  markDeleted(id: string): Promise<void>;
  /** One query: the agent's events, newest first, at most `limit` of them. */
  events(agentId: string, query: EventPageQuery): Promise<VmEventRow[]>;
  ensureTenant(id: string, name: string): Promise<void>;
}

export function createAgentRepo(db: Db): AgentRepo {
  return {
    async get(id) {
      const rows = await db
        .select()
        .from(agents)
        .where(and(eq(agents.id, id), isNull(agents.deletedAt)))
        .limit(1);
      return rows[0];
    },
    async page(tenantId, q) {
      // Postgres keeps created_at in µs; a JS Date has ms: the position is read and compared in µs, or a page would
      // repeat (or skip) agents created within the same millisecond.
      const where: (SQL | undefined)[] = [eq(agents.tenantId, tenantId), isNull(agents.deletedAt)];
      if (q.after) where.push(sql`(${agents.createdAt}, ${agents.id}) > (${microsIso(q.after.createdAtUs)}::timestamptz, ${q.after.id})`);
      if (q.state !== undefined) where.push(eq(agents.state, q.state));
      if (q.namePrefix !== undefined) where.push(sql`starts_with(${agents.name}, ${q.namePrefix})`);
      if (q.image !== undefined) where.push(q.image.startsWith("sha256:") ? eq(agents.imageDigest, q.image) : eq(agents.image, q.image));
      const rows = await db
        .select({ ...getTableColumns(agents), createdAtUs: sql<string>`(extract(epoch from ${agents.createdAt}) * 1000000)::bigint::text` })
        .from(agents)
        .where(and(...where))
        .orderBy(asc(agents.createdAt), asc(agents.id))
        .limit(q.limit);
      return rows.map((r) => ({ ...r, createdAtUs: Number(r.createdAtUs) }));
    },
    async create(agent) {
      const rows = await db.insert(agents).values(agent).returning();
      return rows[0]!;
    },
    async markDeleted(id) {
      // Its checkpoints go with it, also when its host is not live to delete them (that host removes their files at
      // its next start: fleet-agent/host.ts sweeps checkpoint directories without a live row). Storage billing ends now.
      await db.transaction(async (tx) => {
        const at = new Date();
        await tx.update(agents).set({ deletedAt: at, state: "destroyed" }).where(eq(agents.id, id));
        await tx
          .update(checkpoints)
          .set({ deletedAt: at })
          .where(and(eq(checkpoints.agentId, id), isNull(checkpoints.deletedAt)));
      });
    },
    events(agentId, q) {
      const where: (SQL | undefined)[] = [eq(vmEvents.agentId, agentId)];
      if (q.beforeId !== undefined) where.push(lt(vmEvents.id, q.beforeId));
      if (q.since !== undefined) where.push(sql`${vmEvents.at} >= ${q.since}::timestamptz`);
      if (q.until !== undefined) where.push(sql`${vmEvents.at} < ${q.until}::timestamptz`);
      return db
        .select()
        .from(vmEvents)
        .where(and(...where))
        .orderBy(desc(vmEvents.id))
        .limit(q.limit);
    },
    async ensureTenant(id, name) {
      await db.insert(tenants).values({ id, name }).onConflictDoNothing();
    },
  };
}

/** The caller's own live agent, or 404 (another tenant's agent does not exist for them); 400 for what is no agent id. */
export async function ownAgent(agents: AgentRepo, caller: Caller, id: string): Promise<AgentRow> {
  if (!isId("agent", id)) throw new AppError("invalid_id", `"${id.slice(0, 64)}" is not an agent id`);
  const row = await agents.get(id);
  if (!row || row.tenantId !== caller.tenantId) throw new AppError("not_found", `agent ${id} not found`);
  return row;
}

/** µs since the epoch as an ISO-8601 instant with all six fraction digits (what Postgres compares exactly). */
export function microsIso(us: number): string {
  const ms = Math.floor(us / 1000);
  return `${new Date(ms).toISOString().slice(0, 23)}${String(us - ms * 1000).padStart(3, "0")}Z`;
}

export function agentSpec(row: AgentRow): AgentSpec {
  return {
    id: row.id,
    tenantId: row.tenantId,
    image: row.imageDigest ?? row.image,
    vcpus: row.vcpus,
    memMiB: row.memMiB,
    diskMiB: row.diskMiB,
    idleTimeoutMs: row.idleTimeoutMs,
    streamIdleMs: row.streamIdleMs,
    allowEgress: row.allowEgress,
    ...(row.desktop ? { desktop: row.desktop } : {}),
  };
}

export type { NonWakingRules };

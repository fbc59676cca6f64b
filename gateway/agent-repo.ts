// Agents and tenants as the gateway reads and writes them (drizzle; Postgres or PGlite).
import { and, asc, desc, eq, isNull } from "drizzle-orm";
import type { Db } from "../schema/db.ts";
import { agents, tenants, vmEvents, type NonWakingRules } from "../schema/core.ts";
import type { AgentSpec } from "../contracts/agent.ts";
import type { Caller } from "../contracts/caller.ts";
import { AppError } from "../lib/errors.ts";
import { isId } from "../lib/ids.ts";

export type AgentRow = typeof agents.$inferSelect;
export type NewAgent = Omit<typeof agents.$inferInsert, "createdAt" | "deletedAt" | "state" | "lastWakeAt">;
export type VmEventRow = typeof vmEvents.$inferSelect;

export interface AgentRepo {
  /** A live (not deleted) agent by id, whatever its tenant: callers check the tenant. */
  get(id: string): Promise<AgentRow | undefined>;
  list(tenantId: string): Promise<AgentRow[]>;
  create(agent: NewAgent): Promise<AgentRow>;
  markDeleted(id: string): Promise<void>;
  events(agentId: string, limit: number): Promise<VmEventRow[]>;
  ensureTenant(id: string, name: string): Promise<void>;
}

export function createAgentRepo(db: Db): AgentRepo {
  return {
    async get(id) {
      const rows = await db.select().from(agents).where(and(eq(agents.id, id), isNull(agents.deletedAt))).limit(1);
      return rows[0];
    },
    list(tenantId) {
      return db.select().from(agents).where(and(eq(agents.tenantId, tenantId), isNull(agents.deletedAt))).orderBy(asc(agents.createdAt));
    },
    async create(agent) {
      const rows = await db.insert(agents).values(agent).returning();
      return rows[0]!;
    },
    async markDeleted(id) {
      await db.update(agents).set({ deletedAt: new Date(), state: "destroyed" }).where(eq(agents.id, id));
    },
    events(agentId, limit) {
      return db.select().from(vmEvents).where(eq(vmEvents.agentId, agentId)).orderBy(desc(vmEvents.id)).limit(limit);
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
  };
}

export type { NonWakingRules };

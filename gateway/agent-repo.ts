// Agents and tenants as the gateway reads and writes them (drizzle; Postgres or PGlite).
import { and, asc, desc, eq, isNull } from "drizzle-orm";
import type { Db } from "../schema/db.ts";
import { agents, tenants, vmEvents, type NonWakingRules } from "../schema/core.ts";
import type { AgentSpec } from "../contracts/agent.ts";

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

export function agentSpec(row: AgentRow): AgentSpec {
  return {
    id: row.id,
    tenantId: row.tenantId,
    image: row.image,
    vcpus: row.vcpus,
    memMiB: row.memMiB,
    idleTimeoutMs: row.idleTimeoutMs,
    streamIdleMs: row.streamIdleMs,
    allowEgress: row.allowEgress,
  };
}

export type { NonWakingRules };

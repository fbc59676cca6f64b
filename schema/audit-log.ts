// The append-only audit log as one port: every admin action, wake, hibernation and webhook delivery is recorded through it.
import { and, desc, eq, gte, lt, sql, type SQL } from "drizzle-orm";
import { verifyAllAuditChains, verifyAuditChain, type AuditChainVerdict } from "./audit-verify.ts";
import type { Caller } from "../contracts/caller.ts";
import { auditLog } from "./core.ts";
import type { Db } from "./postgres.ts";

export interface AuditEntry {
  /** When it happened; the database's clock (`now()`) when absent. */
  at?: Date;
  tenantId: string | null;
  /** Who did it: a caller's subject, a host id, `webhook-worker:<id>`, … */
  actor: string;
  action: string;
  /** What it was done to (an agent, endpoint or delivery id). */
  target: string;
  requestId?: string | null;
  detail?: Record<string, unknown> | null;
}

export interface AuditLog {
  record(entry: AuditEntry): Promise<void>;
}

/** What an API route records of a caller's action on something of its tenant (`detail` left out when absent). */
export function callerAction(
  caller: Pick<Caller, "tenantId" | "subject">,
  requestId: string | undefined,
  action: string,
  target: string,
  detail?: Record<string, unknown>,
): AuditEntry {
  return { tenantId: caller.tenantId, actor: caller.subject, action, target, requestId, ...(detail ? { detail } : {}) };
}

/** A transaction on a `Db`, as `db.transaction(async (tx) => …)` hands it out. */
export type DbTransaction = Parameters<Parameters<Db["transaction"]>[0]>[0];

/** The audit log in Postgres (or PGlite). */
export interface DbAuditLog extends AuditLog {
  /** The same log writing through `tx`: the row commits or rolls back with the change it records. */
  within(tx: DbTransaction): AuditLog;
}

/** The only writer of `audit_log` rows. */
export function createDbAuditLog(db: Db | DbTransaction): DbAuditLog {
  return {
    async record(e) {
      await db.insert(auditLog).values({
        ...(e.at ? { at: e.at } : {}),
        tenantId: e.tenantId,
        actor: e.actor,
        action: e.action,
        target: e.target,
        requestId: e.requestId ?? null,
        detail: e.detail ?? null,
      });
    },
    within: (tx) => createDbAuditLog(tx),
  };
}

/** A row as the read side shows it: the entry, its place in its tenant's chain and the hashes that link it. */
export interface AuditRecord {
  id: number;
  seq: number;
  at: Date;
  actor: string;
  action: string;
  target: string;
  requestId: string | null;
  detail: Record<string, unknown> | null;
  hash: string;
  prevHash: string;
}

export interface AuditQuery {
  tenantId: string;
  /** Rows with seq below this (keyset paging, newest first). */
  beforeSeq?: number;
  action?: string;
  target?: string;
  /** `at` at or after this instant. */
  since?: Date;
  /** `at` before this instant. */
  until?: Date;
  limit: number;
}

/** The read side of the audit log: one tenant's rows, newest first, and the chains verified (schema/audit-verify.ts). */
export interface AuditReader {
  list(q: AuditQuery): Promise<AuditRecord[]>;
  /** One chain: a tenant id, or '' for the rows without a tenant. */
  verify(chain: string): Promise<AuditChainVerdict>;
  verifyAll(): Promise<AuditChainVerdict[]>;
}

export function createDbAuditReader(db: Db): AuditReader {
  return {
    verify: (chain) => verifyAuditChain(db, chain),
    verifyAll: () => verifyAllAuditChains(db),
    async list(q) {
      const where: SQL[] = [eq(auditLog.tenantId, q.tenantId), sql`${auditLog.seq} is not null`];
      if (q.beforeSeq !== undefined) where.push(lt(auditLog.seq, q.beforeSeq));
      if (q.action !== undefined) where.push(eq(auditLog.action, q.action));
      if (q.target !== undefined) where.push(eq(auditLog.target, q.target));
      if (q.since) where.push(gte(auditLog.at, q.since));
      if (q.until) where.push(lt(auditLog.at, q.until));
      // audit_chain_idx is (coalesce(tenant_id, ''), seq): the same expression lets the planner walk it backwards.
      const rows = await db
        .select()
        .from(auditLog)
        .where(and(...where, sql`coalesce(${auditLog.tenantId}, '') = ${q.tenantId}`))
        .orderBy(desc(sql`coalesce(${auditLog.tenantId}, '')`), desc(auditLog.seq))
        .limit(q.limit);
      return rows.map((r) => ({
        id: r.id,
        seq: r.seq!,
        at: r.at,
        actor: r.actor,
        action: r.action,
        target: r.target,
        requestId: r.requestId,
        detail: r.detail,
        hash: r.hash ?? "",
        prevHash: r.prevHash ?? "",
      }));
    },
  };
}

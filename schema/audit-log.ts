// The append-only audit log as one port: every admin action, wake, hibernation and webhook delivery is recorded through it.
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

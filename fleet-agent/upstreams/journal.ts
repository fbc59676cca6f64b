// The operation records of calls through upstreams, in Postgres: inserted in flight (the (agent, Idempotency-Key) unique index arbitrates between hosts), finished with the outcome and its audit entry in one transaction.
import { and, eq, sql } from "drizzle-orm";
import { createDbAuditLog } from "../../schema/audit-log.ts";
import type { Db } from "../../schema/db.ts";
import { operations } from "../../schema/operations.ts";
import type { OperationJournal, RecordedOperation } from "../egress/upstreams.ts";

export function createOperationJournal(db: Db): OperationJournal {
  const audit = createDbAuditLog(db);
  return {
    async begin(op) {
      const row = {
        id: op.id,
        tenantId: op.tenantId,
        agentId: op.agentId,
        runId: op.runId ?? null,
        hostId: op.hostId,
        upstream: op.upstream,
        method: op.method,
        path: op.path,
        requestHash: op.requestHash,
        idempotencyKey: op.idempotencyKey ?? null,
        mode: "sync" as const,
        state: "in_flight" as const,
        sentAt: op.sentAt,
        requestBytes: op.requestBytes,
        attempts: 1,
        createdAt: op.sentAt,
      };
      if (op.idempotencyKey === undefined) {
        await db.insert(operations).values(row);
        return { claimed: true, id: op.id };
      }
      const inserted = await db
        .insert(operations)
        .values(row)
        .onConflictDoNothing({ target: [operations.agentId, operations.idempotencyKey], where: sql`${operations.idempotencyKey} is not null` })
        .returning({ id: operations.id });
      if (inserted[0]) return { claimed: true, id: inserted[0].id };
      // The key was used before. A first call that failed (no answer) with the same request is tried again under its id.
      const key = and(eq(operations.agentId, op.agentId), eq(operations.idempotencyKey, op.idempotencyKey));
      const retried = await db
        .update(operations)
        .set({
          state: "in_flight",
          runId: op.runId ?? null,
          hostId: op.hostId,
          sentAt: op.sentAt,
          requestBytes: op.requestBytes,
          status: null,
          error: null,
          firstByteAt: null,
          endedAt: null,
          responseBytes: 0,
          responseHeaders: null,
          responseBody: null,
          attempts: sql`${operations.attempts} + 1`,
        })
        .where(and(key, eq(operations.state, "failed"), eq(operations.requestHash, op.requestHash)))
        .returning({ id: operations.id });
      if (retried[0]) return { claimed: true, id: retried[0].id };
      const existing = await db
        .select({
          id: operations.id,
          requestHash: operations.requestHash,
          state: operations.state,
          status: operations.status,
          responseHeaders: operations.responseHeaders,
          responseBody: operations.responseBody,
        })
        .from(operations)
        .where(key)
        .limit(1);
      const first: RecordedOperation | undefined = existing[0];
      // Gone between the insert and this read (it cannot be deleted today): answered as in flight, the agent retries.
      return {
        claimed: false,
        existing: first ?? { id: "", requestHash: op.requestHash, state: "in_flight", status: null, responseHeaders: null, responseBody: null },
      };
    },

    async finish(op, o) {
      await db.transaction(async (tx) => {
        await tx
          .update(operations)
          .set({
            state: o.state,
            status: o.status,
            error: o.error,
            firstByteAt: o.firstByteAt,
            endedAt: o.endedAt,
            responseBytes: o.responseBytes,
            responseHeaders: o.responseHeaders,
            requestBody: o.requestBody,
            responseBody: o.responseBody,
            model: o.usage.model ?? null,
            inputTokens: o.usage.inputTokens ?? null,
            outputTokens: o.usage.outputTokens ?? null,
          })
          .where(eq(operations.id, op.id));
        // Who (the agent) called what (upstream, method, path) and how it ended: no header, no body.
        await audit.within(tx).record({
          at: o.endedAt,
          tenantId: op.tenantId,
          actor: op.agentId,
          action: "upstream.call",
          target: op.id,
          detail: {
            upstream: op.upstream,
            method: op.method,
            path: op.path.slice(0, 500),
            state: o.state,
            status: o.status,
            ...(o.error ? { error: o.error.code } : {}),
          },
        });
      });
    },
  };
}

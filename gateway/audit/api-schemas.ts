// Schemas of the audit API: the list's query (paging, filters), an entry with its chain links, and the operator's verification report.
import { instantQuery, NextCursor, PageQuery, z } from "../../lib/api.ts";

const word = (description: string, example: string) => z.string().min(1).max(200).optional().openapi({ description, example });

export const AuditListQuery = z.strictObject({
  ...PageQuery.shape,
  action: word("Only entries of this action (exact)", "agent.create"),
  target: word("Only entries about this target (an agent, endpoint, delivery or image id; exact)", "agt_0123456789abcdef"),
  since: instantQuery("Only entries at or after this instant"),
  until: instantQuery("Only entries before this instant"),
});

export const AuditEntrySchema = z
  .object({
    id: z.number().int().openapi({ description: "The row's number in the whole log (all tenants)" }),
    seq: z.number().int().openapi({ description: "Its place in the tenant's hash chain: 1, 2, … without gaps" }),
    at: z.iso.datetime(),
    actor: z.string().openapi({ description: "Who: a token's subject, a host id (`host_…`), `webhook-worker:<id>`, …", example: "user_42" }),
    action: z.string().openapi({ example: "agent.create" }),
    target: z.string().openapi({ example: "agt_0123456789abcdef" }),
    requestId: z.string().nullable().openapi({ description: "The API request that did it, where there was one" }),
    detail: z.record(z.string(), z.unknown()).nullable(),
    hash: z.string().openapi({ description: "hex SHA-256 over prevHash and this entry's fields (README: audit log)" }),
    prevHash: z.string().openapi({ description: "The previous entry's hash; empty for the first" }),
  })
  .openapi("AuditEntry");

export const AuditListSchema = z.object({ entries: z.array(AuditEntrySchema), nextCursor: NextCursor }).openapi("AuditList");

export const AuditVerifyQuery = z.strictObject({
  tenant: z
    .string()
    .max(200)
    .optional()
    .openapi({ description: "Verify this tenant's chain only (an empty value: the rows without a tenant); absent: every chain" }),
});

const BrokenRowSchema = z.object({
  problem: z.enum(["unchained_row", "seq_gap", "prev_hash_mismatch", "hash_mismatch", "head_mismatch"]),
  seq: z.number().int().nullable(),
  id: z.number().int().nullable(),
  message: z.string(),
});

export const AuditVerifySchema = z
  .object({
    ok: z.boolean().openapi({ description: "True when every chain verified" }),
    chains: z.array(
      z.object({
        chain: z.string().openapi({ description: "A tenant id; empty: the rows without a tenant" }),
        ok: z.boolean(),
        rows: z.number().int().openapi({ description: "Rows verified (before the broken one)" }),
        broken: BrokenRowSchema.optional().openapi({ description: "The first broken row" }),
      }),
    ),
  })
  .openapi("AuditVerification");

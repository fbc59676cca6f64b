// The tenants API's schemas: what the operator's routes validate and answer, as the OpenAPI document names them.
import { NextCursor, PageQuery, z } from "../../lib/api.ts";
import { tenantIdPattern } from "./gate.ts";

const idHint = "must be 1–64 letters, digits, '_', '-' or '.', starting with a letter or digit";
const TenantId = z.string({ error: idHint }).regex(tenantIdPattern, { error: idHint });

/** An IANA zone the runtime knows (`UTC`, `Europe/Berlin`). */
function isTimeZone(zone: string): boolean {
  try {
    new Intl.DateTimeFormat("en", { timeZone: zone });
    return true;
  } catch {
    return false;
  }
}

export const TenantStatusSchema = z.enum(["active", "suspended", "deleted"]).openapi("TenantStatus");

export const TenantSchema = z
  .object({
    id: z.string(),
    name: z.string(),
    timeZone: z.string(),
    status: TenantStatusSchema,
    statusReason: z.string().nullable().openapi({ description: "What the operator said when suspending or deleting it" }),
    createdAt: z.string(),
    suspendedAt: z.string().nullable(),
    deletedAt: z.string().nullable(),
  })
  .openapi("Tenant");

export const CreateTenantBody = z
  .strictObject({
    id: TenantId.optional().openapi({ description: "Default: a new `ten_…` id. Give one to match your identity provider's tenant claim" }),
    name: z.string({ error: "must be 1–200 characters" }).min(1, { error: "must be 1–200 characters" }).max(200, { error: "must be 1–200 characters" }),
    timeZone: z
      .string({ error: "must be an IANA time zone" })
      .max(64, { error: "must be an IANA time zone" })
      .refine(isTimeZone, { error: "must be an IANA time zone (UTC, Europe/Berlin, …)" })
      .optional()
      .openapi({ description: "Invoices and default reports use it (default UTC)" }),
  })
  .openapi("NewTenant");

export const ReasonBody = z
  .strictObject({
    reason: z
      .string({ error: "must be at most 500 characters" })
      .max(500, { error: "must be at most 500 characters" })
      .optional()
      .openapi({ description: "Shown to the tenant's callers in the 403" }),
  })
  .openapi("TenantStatusChange");

export const TenantParams = z.object({ id: TenantId.openapi({ param: { name: "id", in: "path" }, example: "ten_demo" }) });

export const TenantListQuery = PageQuery.extend({
  status: TenantStatusSchema.optional().openapi({ description: "Only tenants in this status" }),
});

export const TenantListSchema = z.object({ tenants: z.array(TenantSchema), nextCursor: NextCursor }).openapi("TenantList");

export const TenantSuspendedSchema = z
  .object({
    tenant: TenantSchema,
    hibernated: z.array(z.string()).openapi({ description: "Agents that were awake and are now hibernated" }),
    failed: z
      .array(z.object({ agentId: z.string(), error: z.string() }))
      .openapi({ description: "Agents whose hibernation failed (they refuse calls all the same); suspend again to retry" }),
  })
  .openapi("TenantSuspended");

export const TenantDeletedSchema = z
  .object({
    tenant: TenantSchema,
    destroyed: z.array(z.string()).openapi({ description: "Agents destroyed by this call" }),
  })
  .openapi("TenantDeleted");

// Postgres adapter of the webhook module: endpoints, the durable inbox, claims with leases, attempts, audit rows.
import type { DbAuditLog } from "../../schema/audit-log.ts";
import type { Db } from "../../schema/postgres.ts";
import { createDbClaimStore } from "./claim-store.ts";
import { createDbDeliveryAdminStore } from "./delivery-admin-store.ts";
import { createDbEndpointStore } from "./endpoint-store.ts";
import { createDbIntakeStore } from "./intake-store.ts";
import type { WebhookStore } from "./store-types.ts";

/** `auditLog` writes each audit row in the transaction of the change it records. */
export function createDbWebhookStore(db: Db, auditLog: DbAuditLog): WebhookStore {
  return {
    ...createDbEndpointStore(db, auditLog),
    ...createDbIntakeStore(db),
    ...createDbClaimStore(db, auditLog),
    ...createDbDeliveryAdminStore(db, auditLog),
  };
}

// The webhook module's dependencies with their store settled: what the routes and the delivery worker run on.
import { createDbAuditLog } from "../../schema/audit-log.ts";
import { createDbWebhookStore } from "./store.ts";
import type { ResolvedWebhookDeps, WebhookDeps } from "./types.ts";

/** The deps' store, or the Postgres one over `deps.db` (audit rows in the same database, in the same transactions). */
export function withWebhookStore(deps: WebhookDeps): ResolvedWebhookDeps {
  if (deps.store) return { ...deps, store: deps.store };
  return { ...deps, store: createDbWebhookStore(deps.db, createDbAuditLog(deps.db)) };
}

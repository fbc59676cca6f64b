// Per-agent proxy limits: overrides of the gateway's global response timeout, silent-connection cutoff and body limit.
import { bigint, integer, pgTable, text, timestamp } from "drizzle-orm/pg-core";
import { agents } from "./core.ts";

/** One row per agent that overrides a default; a null column means "the gateway's global value". */
export const agentProxyLimits = pgTable("agent_proxy_limits", {
  agentId: text("agent_id")
    .primaryKey()
    .references(() => agents.id),
  /** The agent must send its response headers within this many ms of the request being sent (else 504). */
  responseTimeoutMs: integer("response_timeout_ms"),
  /** A proxied request, stream or WebSocket that moves no bytes either way for this long is ended. */
  proxyIdleTimeoutMs: integer("proxy_idle_timeout_ms"),
  /** Largest request body for this agent, bytes (never above the gateway's global limit). */
  maxBodyBytes: bigint("max_body_bytes", { mode: "number" }),
  updatedAt: timestamp("updated_at", { withTimezone: true, mode: "date" }).notNull().defaultNow(),
});

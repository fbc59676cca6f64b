// What the gateway app is built from: its configuration and the dependencies injected into it (no runtime here either).
import type { Context, Hono } from "hono";
import type { GatewayEnv } from "../contracts/caller.ts";
import type { Fleet } from "../contracts/fleet.ts";
import type { Logger } from "../lib/log.ts";
import type { Metrics } from "../lib/metrics.ts";
import type { ReadinessChecks } from "../lib/readiness.ts";
import type { AuditLog, AuditReader } from "../schema/audit-log.ts";
import type { CheckpointRepo } from "./checkpoints/repo.ts";
import type { PoolKeeper } from "./pools/keeper.ts";
import type { DesktopSessions } from "./desktop/sessions.ts";
import type { AgentRepo } from "./agents/repo.ts";
import type { Authenticator } from "./auth.ts";
import type { ProxyConfig, ProxyCore } from "./proxy/core.ts";
import type { AgentSettingsStore } from "./proxy/agents.ts";
import type { ImageCatalog } from "../contracts/image.ts";
import type { TenantGate, TenantGateConfig } from "./tenants/gate.ts";

export interface GatewayConfig {
  /** When set, `{agentId}.{domain}` hosts route to the agent like `/a/{agentId}/…`. */
  domain: string | undefined;
  /** Largest request body the proxy accepts, bytes. */
  maxBodyBytes: number;
  /** Largest JSON body of the admin API, bytes. */
  maxApiBodyBytes: number;
  /** Images an agent may be created with (what the hosts' driver can run). */
  images: readonly string[];
  agentDefaults: { vcpus: number; memMiB: number; idleTimeoutMs: number; streamIdleMs: number; diskMiB?: number };
  /** Proxy timeouts and limits (gateway/proxy/core.ts); defaults when absent. */
  proxy?: ProxyConfig;
  /** How tenant statuses are cached and whether unknown tenants are created on first use (gateway/tenants/gate.ts); defaults when absent. */
  tenants?: TenantGateConfig;
}

export interface GatewayDeps {
  agents: AgentRepo;
  fleet: Fleet;
  /** Where admin actions are recorded (the append-only audit log). */
  audit: AuditLog;
  /** The read side of the audit log (`GET /v1/audit`, `/v1/audit/verify`); none: those routes answer 503. */
  auditReader?: AuditReader;
  auth: Authenticator;
  log: Logger;
  config: GatewayConfig;
  /** The client's address as the runtime sees it (for X-Forwarded-For). */
  clientIp?: (c: Context<GatewayEnv>) => string | undefined;
  /** More routes mounted at the root (billing, webhooks); they see the same request id and caller. */
  routes?: Hono<GatewayEnv>[];
  /** Per-agent settings (PATCH /v1/agents/:id, per-agent limits); without it they are read-only defaults. */
  settings?: AgentSettingsStore;
  /** The proxy's shared state (agent cache, tenant limiter), when the Node fast path shares it; else one is made here. */
  proxy?: ProxyCore;
  /** Built images agents may name (`name:tag` or a digest) besides the built-in `images`; none: built-in only. */
  imageCatalog?: ImageCatalog;
  /** What `GET /readyz` checks (the database); none: it answers ready. */
  readiness?: ReadinessChecks;
  /** Where the proxy counts its calls (by status class); none: nowhere (`noopMetrics`). */
  metrics?: Metrics;
  /**
   * Tenant statuses: every verified token's tenant (outside the operator routes) and every called agent's tenant must
   * be active (403 tenant_not_found / tenant_suspended / tenant_deleted). Every program passes one (compose/gateway-app.ts);
   * none: tenants are not checked (unit tests of other parts).
   */
  tenants?: TenantGate;
  /** Checkpoints' rows (hosts write them; the checkpoint routes and forks read them); none: those answer 501 checkpoints_unsupported. */
  checkpoints?: CheckpointRepo;
  /** Warm pools (their rows, hand-outs, top-ups); none: the pool routes answer 501. */
  pools?: PoolKeeper;
  /** Viewers' sessions on desktop agents (who holds control, shared by gateways); none: kept in this process only. */
  desktopSessions?: DesktopSessions;
}

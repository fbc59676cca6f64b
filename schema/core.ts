// Core tables: tenants, agents, hosts, checkpoints, the append-only VM event log and awake runs, the audit log.
import { sql } from "drizzle-orm";
import { bigint, bigserial, boolean, index, integer, jsonb, pgTable, text, timestamp, uniqueIndex } from "drizzle-orm/pg-core";
import type { DesktopSize, TransitionTimings, WakeTimings } from "../contracts/agent.ts";

const tz = (name: string) => timestamp(name, { withTimezone: true, mode: "date" });

export const tenants = pgTable("tenants", {
  id: text("id").primaryKey(),
  name: text("name").notNull(),
  /** IANA zone the tenant's invoices and default reports use. */
  timeZone: text("time_zone").notNull().default("UTC"),
  createdAt: tz("created_at").notNull().defaultNow(),
  /** active | suspended (its agents refuse calls and are hibernated) | deleted (agents destroyed, usage kept). */
  status: text("status").$type<TenantStatus>().notNull().default("active"),
  /** Why an operator suspended or deleted it, as they said. */
  statusReason: text("status_reason"),
  suspendedAt: tz("suspended_at"),
  deletedAt: tz("deleted_at"),
});

export type TenantStatus = "active" | "suspended" | "deleted";

/** Rules for traffic the gateway answers itself without waking the agent (probes, uptime bots). */
export interface NonWakingRules {
  paths: string[];
  methods: string[];
  userAgents: string[];
}

export const agents = pgTable(
  "agents",
  {
    id: text("id").primaryKey(),
    tenantId: text("tenant_id")
      .notNull()
      .references(() => tenants.id),
    name: text("name").notNull(),
    /** The image as the agent was created with it: a built-in one (`demo`), `name:tag` or a digest. */
    image: text("image").notNull(),
    /** The built image `image` resolved to at creation (`sha256:…`); null for a built-in image. */
    imageDigest: text("image_digest"),
    vcpus: integer("vcpus").notNull().default(1),
    memMiB: integer("mem_mib").notNull().default(256),
    /** The agent's persistent disk (the writable layer over a built image), MiB. */
    diskMiB: integer("disk_mib").notNull().default(1024),
    idleTimeoutMs: integer("idle_timeout_ms").notNull().default(60_000),
    /** Open streams keep the agent awake only while they moved bytes within this window. */
    streamIdleMs: integer("stream_idle_ms").notNull().default(60_000),
    public: boolean("public").notNull().default(false),
    allowEgress: boolean("allow_egress").notNull().default(false),
    nonWaking: jsonb("non_waking").$type<NonWakingRules>(),
    /** A desktop agent's display size (docs/desktop.md); null for an agent without a desktop. */
    desktop: jsonb("desktop").$type<DesktopSize>(),
    hostId: text("host_id"),
    /**
     * The lease generation of `host_id`'s ownership: raised by one each time the agent moves to another host (failover,
     * drain). A host runs the agent only under the generation it was handed; one that sees a newer one stops its copy.
     */
    generation: integer("generation").notNull().default(0),
    /** Last state the owning host reported; the host itself is the authority. */
    state: text("state").notNull().default("creating"),
    lastWakeAt: tz("last_wake_at"),
    /** The checkpoint this agent was forked from (`POST /v1/agents {fromCheckpoint}`); null for one created fresh. */
    forkedFrom: text("forked_from"),
    /** The warm pool the agent belongs to (`pools.id`); null for one outside any pool. */
    poolId: text("pool_id"),
    /** Where it is in its pool: ready to hand out, handed out (`in_use`), or being made ready (forked, reset); null outside a pool. */
    poolState: text("pool_state").$type<PoolAgentState>(),
    /** When the pool last handed it out; null while it waits in the pool. */
    poolAcquiredAt: tz("pool_acquired_at"),
    createdAt: tz("created_at").notNull().defaultNow(),
    deletedAt: tz("deleted_at"),
  },
  (t) => [
    // A pool's acquire takes its oldest ready agent; its counts group its live agents by state.
    index("agents_pool_idx").on(t.poolId, t.poolState, t.createdAt).where(sql`deleted_at is null and pool_id is not null`),
    index("agents_tenant_idx").on(t.tenantId),
    // GET /v1/agents pages a tenant's live agents in this order (keyset over created_at, id).
    index("agents_tenant_page_idx").on(t.tenantId, t.createdAt, t.id).where(sql`deleted_at is null`),
    // Placement weighs each host by its agents; the hosts API counts them.
    index("agents_host_idx").on(t.hostId).where(sql`deleted_at is null`),
  ],
);

/** An agent's place in its warm pool. */
export type PoolAgentState = "ready" | "in_use" | "resetting";

/** What a pool is doing: keeping its agents (`active`), or being deleted (its idle agents removed, no more handed out). */
export type PoolState = "active" | "deleting";

/**
 * A warm pool: `size` forks of one checkpoint kept ready (hibernated) to hand out one at a time, reset to the checkpoint
 * when given back; at most `max_size` agents in all. Its agents name it in `agents.pool_id`. A deleted one keeps its row.
 */
export const pools = pgTable(
  "pools",
  {
    id: text("id").primaryKey(),
    tenantId: text("tenant_id")
      .notNull()
      .references(() => tenants.id),
    /** Unique per tenant among live pools. */
    name: text("name").notNull(),
    /** The checkpoint its agents are forked from and reset to (`checkpoints.id`). */
    fromCheckpoint: text("from_checkpoint").notNull(),
    /** How many ready agents it keeps; and how many agents (ready, in use, being made ready) it may hold in all. */
    size: integer("size").notNull(),
    maxSize: integer("max_size").notNull(),
    state: text("state").$type<PoolState>().notNull().default("active"),
    createdAt: tz("created_at").notNull().defaultNow(),
    updatedAt: tz("updated_at").notNull().defaultNow(),
    deletedAt: tz("deleted_at"),
  },
  (t) => [
    uniqueIndex("pools_tenant_name_idx").on(t.tenantId, t.name).where(sql`deleted_at is null`),
    index("pools_tenant_idx").on(t.tenantId, t.createdAt, t.id).where(sql`deleted_at is null`),
  ],
);

export const hosts = pgTable("hosts", {
  id: text("id").primaryKey(),
  /** Base URL of the host's ingress, for gateways in other processes; null when in-process only. */
  url: text("url"),
  driver: text("driver").notNull(),
  capacityMiB: integer("capacity_mib").notNull(),
  lastHeartbeatAt: tz("last_heartbeat_at").notNull().defaultNow(),
  startedAt: tz("started_at").notNull().defaultNow(),
  /** sha256 (hex) of the secret the host made at its first start and keeps in its data directory: a second process with the same id and another secret is refused. */
  secretHash: text("secret_hash"),
  /** The host's own clock at its last heartbeat minus the database's (ms): a host beyond the allowed skew gets no new agents. */
  clockSkewMs: integer("clock_skew_ms").notNull().default(0),
  /** Memory of the host's awake agents at its last heartbeat, MiB, and how many they were (what placement weighs). */
  usedMiB: integer("used_mib").notNull().default(0),
  awakeAgents: integer("awake_agents").notNull().default(0),
  /** When an operator asked to drain the host: it takes no new agents, and its agents move to other hosts. */
  drainingAt: tz("draining_at"),
});

/**
 * The last snapshot of each agent committed to the shared artifact store: the blobs (content-addressed) a host needs to
 * restore the agent anywhere. Written after a hibernation's files are in the store; read by the host an agent moves to.
 */
export const agentCommits = pgTable("agent_commits", {
  agentId: text("agent_id")
    .primaryKey()
    .references(() => agents.id),
  /** The host that took it, and the lease generation it ran under. */
  hostId: text("host_id").notNull(),
  generation: integer("generation").notNull(),
  /** The files of the snapshot, by name: their blob digests (`sha256:…`) and sizes. */
  files: jsonb("files").$type<Record<string, { digest: string; bytes: number }>>().notNull(),
  bytes: bigint("bytes", { mode: "number" }).notNull(),
  /** When the snapshot was taken (the VM's hibernation), and when its blobs were all in the store. */
  snapshotAt: tz("snapshot_at").notNull(),
  committedAt: tz("committed_at").notNull().defaultNow(),
});

/** Append-only: one row per VM state transition, with its reason and timings. */
export const vmEvents = pgTable(
  "vm_events",
  {
    id: bigserial("id", { mode: "number" }).primaryKey(),
    at: tz("at").notNull().defaultNow(),
    hostId: text("host_id").notNull(),
    agentId: text("agent_id").notNull(),
    vmId: text("vm_id").notNull(),
    runId: text("run_id"),
    fromState: text("from_state").notNull(),
    toState: text("to_state").notNull(),
    reason: text("reason").notNull(),
    /** Millisecond timings of the transition (restoreMs, clockFixMs, snapshotMs, skewBeforeMs, …). */
    timings: jsonb("timings").$type<TransitionTimings>(),
    detail: jsonb("detail").$type<Record<string, unknown>>(),
  },
  // By time too: billing reads each agent's hibernated time in a window from these rows.
  (t) => [index("vm_events_agent_idx").on(t.agentId, t.id), index("vm_events_agent_at_idx").on(t.agentId, t.at)],
);

/** One awake period of an agent: from the wake to the hibernation, with what caused each. */
export const runs = pgTable(
  "runs",
  {
    id: text("id").primaryKey(),
    agentId: text("agent_id").notNull(),
    tenantId: text("tenant_id").notNull(),
    hostId: text("host_id").notNull(),
    vmId: text("vm_id").notNull(),
    wokeAt: tz("woke_at").notNull(),
    wakeReason: text("wake_reason").notNull(),
    /** restore | boot */
    wakeMode: text("wake_mode").notNull(),
    timings: jsonb("timings").$type<WakeTimings>(),
    sleptAt: tz("slept_at"),
    sleepReason: text("sleep_reason"),
  },
  (t) => [index("runs_agent_idx").on(t.agentId, t.wokeAt)],
);

/** Append-only record of every admin action, wake, hibernation and webhook delivery. */
export const auditLog = pgTable(
  "audit_log",
  {
    id: bigserial("id", { mode: "number" }).primaryKey(),
    at: tz("at").notNull().default(sql`now()`),
    tenantId: text("tenant_id"),
    actor: text("actor").notNull(),
    action: text("action").notNull(),
    target: text("target").notNull(),
    requestId: text("request_id"),
    detail: jsonb("detail").$type<Record<string, unknown>>(),
    /** Position in its tenant's hash chain (1, 2, …), set by the insert trigger under the chain head's row lock. */
    seq: bigint("seq", { mode: "number" }),
    /** The hash of the previous row of the chain (empty for the first), and this row's hash over it and its fields. */
    prevHash: text("prev_hash"),
    hash: text("hash"),
  },
  (t) => [index("audit_tenant_idx").on(t.tenantId, t.id), uniqueIndex("audit_chain_idx").on(sql`coalesce(${t.tenantId}, '')`, t.seq)],
);

/** The last row of each tenant's audit chain ('' = rows without a tenant): the trigger locks and advances it. */
export const auditChainHeads = pgTable("audit_chain_heads", {
  chain: text("chain").primaryKey(),
  seq: bigint("seq", { mode: "number" }).notNull(),
  hash: text("hash").notNull(),
});

/** Who asked for a checkpoint: the API, or the workload from inside its VM (through the guest agent). */
export type CheckpointOrigin = "api" | "guest";

/**
 * Immutable generations of an agent's memory and disk, kept as files under `<data dir>/hosts/<host>/checkpoints/<id>` on
 * the host that took them. A deleted one keeps its row (`deleted_at`): storage is billed from `created_at` to then.
 */
export const checkpoints = pgTable(
  "checkpoints",
  {
    id: text("id").primaryKey(),
    tenantId: text("tenant_id")
      .notNull()
      .references(() => tenants.id),
    /** The agent it was taken of (a fork is another agent, with `agents.forked_from` naming this row). */
    agentId: text("agent_id")
      .notNull()
      .references(() => agents.id),
    /** Where its files are: restores and forks of it run there. */
    hostId: text("host_id").notNull(),
    /** Unique per agent among live checkpoints; null for an unnamed one. */
    name: text("name"),
    origin: text("origin").$type<CheckpointOrigin>().notNull(),
    /** What its files hold (their sizes; reflinked blocks shared with the agent's own files count here too). */
    bytes: bigint("bytes", { mode: "number" }).notNull(),
    /** How long the guest was paused for it (0 when taken from a hibernated agent's snapshot). */
    pausedMs: integer("paused_ms").notNull(),
    createdAt: tz("created_at").notNull().defaultNow(),
    deletedAt: tz("deleted_at"),
    /** The API call that asked for it; null for a guest's request. */
    requestId: text("request_id"),
  },
  (t) => [
    uniqueIndex("checkpoints_agent_name_idx").on(t.agentId, t.name).where(sql`deleted_at is null and name is not null`),
    // GET /v1/agents/{id}/checkpoints pages an agent's live checkpoints in this order (keyset over created_at, id).
    index("checkpoints_agent_page_idx").on(t.agentId, t.createdAt, t.id).where(sql`deleted_at is null`),
    // Billing reads a tenant's checkpoints over a period, deleted ones included.
    index("checkpoints_tenant_idx").on(t.tenantId, t.createdAt),
  ],
);

export type DesktopSessionMode = "view" | "control";

/**
 * A viewer's connection to a desktop agent's screen (`GET /v1/agents/{id}/desktop/vnc`, gateway/desktop/vnc.ts): who,
 * watching or in control, from when to when. Shared by every gateway: at most one live `control` session an agent (the
 * unique index), so behind several gateways one human holds a desktop and the actions API of every gateway refuses
 * while they do. The gateway relaying it renews `expires_at` while the socket is open; a session whose gateway died is
 * over at its `expires_at` (the next open of the agent's sessions ends it there).
 */
export const desktopSessions = pgTable(
  "desktop_sessions",
  {
    id: text("id").primaryKey(),
    tenantId: text("tenant_id")
      .notNull()
      .references(() => tenants.id),
    agentId: text("agent_id")
      .notNull()
      .references(() => agents.id),
    mode: text("mode").$type<DesktopSessionMode>().notNull(),
    /** The caller's subject (the audit log's actor). */
    actor: text("actor").notNull(),
    /** The upgrade request that opened it. */
    requestId: text("request_id").notNull(),
    startedAt: tz("started_at").notNull(),
    /** Until when it counts as live unless renewed. */
    expiresAt: tz("expires_at").notNull(),
    endedAt: tz("ended_at"),
  },
  (t) => [
    uniqueIndex("desktop_sessions_control_idx").on(t.agentId).where(sql`mode = 'control' and ended_at is null`),
    index("desktop_sessions_agent_idx").on(t.agentId, t.startedAt),
  ],
);

// Billing tables: raw meter segments (idempotent by id), ingest-time rollups, conflicts, rate cards and invoices.
import { sql } from "drizzle-orm";
import { bigint, bigserial, check, customType, index, integer, jsonb, numeric, pgTable, primaryKey, text, timestamp, uniqueIndex } from "drizzle-orm/pg-core";

const tz = (name: string) => timestamp(name, { withTimezone: true, mode: "date" });
const count = (name: string) => bigint(name, { mode: "number" });

/** Opaque ids compared byte-wise: the "C" collation makes the hot unique index cheaper than a locale's rules. */
const idText = customType<{ data: string }>({ dataType: () => 'text COLLATE "C"' });

/** Sets of half-open epoch-millisecond ranges, in Postgres' text form (`{[1,5),[7,9)}`; `{}` is empty). */
const msRanges = customType<{ data: string }>({ dataType: () => "int8multirange" });

/**
 * One row per metered segment `[started_at, ended_at)`, written once: the primary key makes ingest idempotent.
 * BRIN indexes stay tiny because rows arrive roughly in time order; they serve the late-arrival and raw-scan paths.
 * Two hosts that report the same agent's time are billed for it once: the later segment only for what
 * `meter_coverage` says was not yet covered.
 */
export const meterSegments = pgTable(
  "meter_segments",
  {
    /** `hostId:vmId:seq`. */
    id: idText("id").primaryKey(),
    tenantId: idText("tenant_id").notNull(),
    agentId: idText("agent_id").notNull(),
    runId: idText("run_id").notNull(),
    startedAt: tz("started_at").notNull(),
    endedAt: tz("ended_at").notNull(),
    vcpus: integer("vcpus").notNull(),
    memMiB: integer("mem_mib").notNull(),
    startReason: text("start_reason").notNull(),
    endReason: text("end_reason").notNull(),
    /** active: the VM ran; dozing: its vCPUs were stopped while every open call waited on an outbound call (priced apart). */
    state: text("state").$type<"active" | "dozing">().notNull().default("active"),
    /** Billing's clock when the segment was written: invoices count segments received before their cutoff. */
    receivedAt: tz("received_at").notNull(),
    /**
     * The parts of `[started_at, ended_at)` billed, in epoch ms, when segments of the same agent received earlier (any
     * host) had already billed the rest; null: all of it (the rollups hold exactly these parts).
     */
    billedSpans: msRanges("billed_spans"),
    /** Ms of the segment that earlier segments of the same agent had already billed: kept, not billed again. */
    overlapMs: count("overlap_ms").notNull().default(0),
  },
  (t) => [
    index("meter_segments_received_brin").using("brin", t.receivedAt),
    index("meter_segments_started_brin").using("brin", t.startedAt),
    check("meter_segments_positive", sql`${t.endedAt} > ${t.startedAt}`),
  ],
);

/**
 * The time each agent's stored segments cover, merged: disjoint spans that do not touch, in epoch ms (a run's
 * segments touch, so a run is one row, extended as its segments arrive). Kept by ingest in its transaction under a
 * per-agent lock; a new segment bills only what no row covers. Far fewer rows than segments: the hot path indexes
 * about one row per agent per batch instead of every segment.
 */
export const meterCoverage = pgTable(
  "meter_coverage",
  {
    tenantId: idText("tenant_id").notNull(),
    agentId: idText("agent_id").notNull(),
    startMs: count("start_ms").notNull(),
    endMs: count("end_ms").notNull(),
    /** Hosts whose segments make up the span (named in the warning when a later segment overlaps it). */
    hostIds: text("host_ids").array().notNull(),
  },
  (t) => [primaryKey({ columns: [t.tenantId, t.agentId, t.startMs] }), check("meter_coverage_positive", sql`${t.endMs} > ${t.startMs}`)],
);

/** Usage per tenant × agent × 15-minute UTC bucket, kept in the ingest transaction; sums equal the raw segments split by overlap. */
export const usageQuarterHours = pgTable(
  "usage_quarter_hours",
  {
    tenantId: idText("tenant_id").notNull(),
    bucketStart: tz("bucket_start").notNull(),
    agentId: idText("agent_id").notNull(),
    activeMs: count("active_ms").notNull(),
    vcpuMs: count("vcpu_ms").notNull(),
    /** Memory-time in MiB-milliseconds. */
    mibMs: count("mib_ms").notNull(),
    /** Dozing time (not in the active columns above), its vCPU-time and its memory-time in MiB-milliseconds. */
    dozedMs: count("dozed_ms").notNull().default(0),
    dozedVcpuMs: count("dozed_vcpu_ms").notNull().default(0),
    dozedMibMs: count("dozed_mib_ms").notNull().default(0),
  },
  (t) => [primaryKey({ columns: [t.tenantId, t.bucketStart, t.agentId] })],
);

/** Metered totals per awake run, kept in the ingest transaction, for the runs report. */
export const runUsage = pgTable("run_usage", {
  runId: idText("run_id").primaryKey(),
  tenantId: idText("tenant_id").notNull(),
  agentId: idText("agent_id").notNull(),
  activeMs: count("active_ms").notNull(),
  vcpuMs: count("vcpu_ms").notNull(),
  mibMs: count("mib_ms").notNull(),
  dozedMs: count("dozed_ms").notNull().default(0),
  dozedVcpuMs: count("dozed_vcpu_ms").notNull().default(0),
  dozedMibMs: count("dozed_mib_ms").notNull().default(0),
  segments: integer("segments").notNull(),
  /** Ms of the run's segments not billed because another segment of the agent (another host's) had billed that time. */
  overlapMs: count("overlap_ms").notNull().default(0),
  firstStartedAt: tz("first_started_at").notNull(),
  lastEndedAt: tz("last_ended_at").notNull(),
});

/** A segment id shipped again with a different body: refused, and kept here for an operator to look at. */
export const meterConflicts = pgTable(
  "meter_conflicts",
  {
    id: bigserial("id", { mode: "number" }).primaryKey(),
    segmentId: text("segment_id").notNull(),
    receivedAt: tz("received_at").notNull(),
    incoming: jsonb("incoming").$type<Record<string, unknown>>().notNull(),
    existing: jsonb("existing").$type<Record<string, unknown>>(),
  },
  (t) => [index("meter_conflicts_segment_idx").on(t.segmentId)],
);

/**
 * Prices in nano-cents (1e-9 of a cent) per unit, one row per version: a version applies from `effective_from` until
 * the next version of the same card. `tenant_id` null is the default card (first version `rc_default`, seeded at first
 * use, effective from 1970); a tenant's versions override it from their instant on. Rows are never updated.
 */
export const rateCards = pgTable(
  "rate_cards",
  {
    id: text("id").primaryKey(),
    tenantId: text("tenant_id"),
    currency: text("currency").notNull().default("USD"),
    vcpuSecondNanocents: count("vcpu_second_nanocents").notNull(),
    gibSecondNanocents: count("gib_second_nanocents").notNull(),
    snapshotGibMonthNanocents: count("snapshot_gib_month_nanocents").notNull(),
    /** Dozing: vCPU-seconds (default 0) and GiB-seconds of memory (null: the snapshot rate, per second of billing's 730-hour storage month). */
    dozeVcpuSecondNanocents: count("doze_vcpu_second_nanocents").notNull().default(0),
    dozeGibSecondNanocents: count("doze_gib_second_nanocents"),
    /** When this version was written. */
    updatedAt: tz("updated_at").notNull().defaultNow(),
    /** The instant this version applies from. */
    effectiveFrom: tz("effective_from").notNull().default(sql`'1970-01-01T00:00:00Z'`),
    /** Who wrote it (a caller's subject), null for the seeded default. */
    createdBy: text("created_by"),
  },
  (t) => [uniqueIndex("rate_cards_version_idx").on(sql`coalesce(${t.tenantId}, '')`, t.effectiveFrom)],
);

export type InvoiceStatus = "draft" | "final";

/** One invoice per tenant per calendar month of its time zone; lines are stored once final. */
export const invoices = pgTable(
  "invoices",
  {
    id: text("id").primaryKey(),
    tenantId: text("tenant_id").notNull(),
    /** `YYYY-MM` in `time_zone`. */
    month: text("month").notNull(),
    timeZone: text("time_zone").notNull(),
    periodStart: tz("period_start").notNull(),
    periodEnd: tz("period_end").notNull(),
    status: text("status").$type<InvoiceStatus>().notNull().default("draft"),
    /** Segments received before this instant are counted (set when final). */
    cutoffAt: tz("cutoff_at"),
    currency: text("currency").notNull().default("USD"),
    totalCents: count("total_cents"),
    /** Prices the final invoice used, frozen. */
    rates: jsonb("rates").$type<Record<string, unknown>>(),
    createdAt: tz("created_at").notNull().defaultNow(),
    finalizedAt: tz("finalized_at"),
  },
  (t) => [uniqueIndex("invoices_tenant_month_idx").on(t.tenantId, t.month)],
);

export const invoiceLines = pgTable(
  "invoice_lines",
  {
    invoiceId: text("invoice_id")
      .notNull()
      .references(() => invoices.id),
    lineNo: integer("line_no").notNull(),
    agentId: text("agent_id").notNull(),
    /** vcpu | memory | snapshot_storage */
    resource: text("resource").notNull(),
    /** In the base unit: vCPU-ms, MiB-ms or byte-ms (may exceed 64 bits for storage). */
    quantity: numeric("quantity", { precision: 40, scale: 0, mode: "string" }).notNull(),
    unit: text("unit").notNull(),
    unitPriceNanocents: count("unit_price_nanocents").notNull(),
    amountCents: count("amount_cents").notNull(),
    /** The rate-card version that priced this line (null on lines finalized before cards were versioned). */
    rateCardId: text("rate_card_id"),
  },
  (t) => [primaryKey({ columns: [t.invoiceId, t.lineNo] })],
);

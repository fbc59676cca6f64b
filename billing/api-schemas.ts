// The billing API's parameters and answers as zod schemas: what validates a request is what /openapi.json shows.
import { wakeTimingKeys } from "../contracts/agent.ts";
import { NextCursor, PageQuery, z } from "../lib/api.ts";
import { AppError } from "../lib/errors.ts";
import { maxDozeGibSecondNanocents, resources, storageMonthSeconds } from "./money.ts";
import { assertZone, instantYears, monthRange, readInstant } from "./zones.ts";

/** A domain check that throws `AppError` (zones, months) as a zod issue, so its message reaches the 400 answer. */
function issueOf(check: () => unknown, ctx: z.RefinementCtx): void {
  try {
    check();
  } catch (err) {
    if (!(err instanceof AppError)) throw err;
    ctx.addIssue({ code: "custom", message: err.message });
  }
}

const required = (what: string) => (issue: { input: unknown }) => (issue.input === undefined ? `is required (${what})` : undefined);

/**
 * An instant of a query, checked as written (years 1970–9999, real dates); kept as the string, because a bare date
 * means the start of that day in the request's zone, which the handler applies (`parseInstant`).
 */
function instantText(description: string, text: z.ZodString) {
  return text
    .superRefine((v, ctx) => {
      const read = readInstant(v);
      if ("problem" in read) ctx.addIssue({ code: "custom", message: read.problem });
    })
    .openapi({
      description: `${description}: an ISO 8601 instant with Z or an offset, or a date YYYY-MM-DD (years ${instantYears.first}–${instantYears.last})`,
      example: "2026-03-01",
    });
}
const requiredInstant = (description: string) => instantText(description, z.string({ error: required("an ISO 8601 instant or a YYYY-MM-DD date") }));
const optionalInstant = (description: string) => instantText(description, z.string()).optional();

/** `tz`: an IANA zone this runtime knows. */
const TimeZoneParam = z
  .string()
  .default("UTC")
  .superRefine((v, ctx) => issueOf(() => assertZone(v), ctx))
  .openapi({ description: "IANA time zone that local dates, hours and days are in (default UTC)", example: "Europe/Berlin" });

/** `YYYY-MM`, a month the calendar has (years 1970–9999). */
export const MonthParam = z
  .string()
  .superRefine((v, ctx) => issueOf(() => monthRange("UTC", v), ctx))
  .openapi({ description: "Calendar month YYYY-MM in the tenant's time zone", example: "2026-03" });

const FormatParam = z.enum(["json", "csv"]).optional().openapi({ description: "Answer as JSON or CSV; without it `Accept: text/csv` asks for CSV" });

/** A `tenantId` (or `tenant`) query parameter may only name the caller's own tenant: another answers 404. */
const tenantParams = {
  tenantId: z.string().max(200).optional().openapi({ description: "Only the caller's own tenant (another answers 404)" }),
  tenant: z.string().max(200).optional().openapi({ description: "Same as tenantId" }),
};

export type TimeGroupBy = { byAgent: boolean; time?: "hour" | "day"; names: string[] };

/** `groupBy=agent,day`: a comma list of agent, hour, day (or tenant, the default grouping). */
const GroupByParam = z
  .string()
  .max(200)
  .optional()
  .transform((raw, ctx): TimeGroupBy => {
    const names = (raw ?? "")
      .split(",")
      .map((s) => s.trim())
      .filter(Boolean);
    let byAgent = false;
    let time: "hour" | "day" | undefined;
    for (const n of names) {
      if (n === "agent") byAgent = true;
      else if (n === "hour" || n === "day") {
        if (time && time !== n) ctx.addIssue({ code: "custom", message: "takes hour or day, not both" });
        time = n;
      } else if (n !== "tenant") ctx.addIssue({ code: "custom", message: `must be a comma list of agent, hour, day (or tenant); got "${n.slice(0, 40)}"` });
    }
    return { byAgent, ...(time ? { time } : {}), names };
  })
  .openapi({ type: "string", description: "Comma list of agent, hour, day (or tenant): rows per agent and/or per local hour or day", example: "agent,day" });

export const UsageQuery = z.strictObject({
  from: requiredInstant("Start of the range (inclusive)"),
  to: requiredInstant("End of the range (exclusive)"),
  tz: TimeZoneParam,
  groupBy: GroupByParam,
  agentId: z.string().max(100).optional().openapi({ description: "Only this agent's usage" }),
  format: FormatParam,
  ...tenantParams,
});

export const RunsQuery = z.strictObject({
  ...PageQuery.shape,
  from: optionalInstant("Runs that woke at or after this instant (a bare date is a UTC day)"),
  until: optionalInstant("Runs that woke before this instant (a bare date is a UTC day)"),
  to: optionalInstant("Same as until"),
  format: FormatParam,
});

export const InvoicesQuery = z.strictObject({
  ...PageQuery.shape,
  month: MonthParam.optional().openapi({ description: "Answer this month's invoice (created, as a draft, on first use) instead of the list" }),
  format: FormatParam,
  ...tenantParams,
});

export const FormatQuery = z.strictObject({ format: FormatParam });

export const AgentIdParams = z.object({ id: z.string().max(100).openapi({ description: "Agent id", example: "agt_V1StGXR8Z5jdHi6B" }) });
export const InvoiceIdParams = z.object({ id: z.string().max(100).openapi({ description: "Invoice id", example: "inv_V1StGXR8Z5jdHi6B" }) });
export const MonthParams = z.object({ month: MonthParam });

// ---- Answers ----

/** A host's shipment: the segments are checked one by one (rejections are per segment), so the body schema is loose. */
export const MeterBatch = z
  .object({
    segments: z.array(
      z.unknown().openapi({
        type: "object",
        description:
          "A meter segment (contracts/meter.ts): id, hostId, vmId, seq, tenantId, agentId, runId, startedAt, endedAt, vcpus, memMiB, startReason, endReason",
      }),
    ),
  })
  .openapi("MeterBatch", { description: "At most 10,000 segments and 16 MiB; each is accepted, a duplicate, or rejected with its own code" });

export const MeterIngestResult = z
  .object({
    accepted: z.array(z.string()),
    duplicates: z.array(z.string()),
    rejected: z.array(z.object({ id: z.string(), code: z.string(), message: z.string() })),
  })
  .openapi("MeterIngestResult");

const ActiveSums = {
  activeMs: z.number().int().openapi({ description: "Milliseconds the VM ran (dozing and hibernation are not active time)" }),
  vcpuMs: z.number().int().openapi({ description: "vCPU-milliseconds while active" }),
  mibMs: z.number().int().openapi({ description: "MiB-milliseconds of configured memory while active" }),
};
const DozedSums = {
  dozedMs: z.number().int().openapi({ description: "Milliseconds the VM dozed: vCPUs stopped while every open call waited on an outbound call" }),
  dozedVcpuMs: z.number().int().openapi({ description: "vCPU-milliseconds while dozing (what the doze vCPU price multiplies)" }),
  dozedMibMs: z.number().int().openapi({ description: "MiB-milliseconds of configured memory while dozing" }),
};
const Sums = {
  ...ActiveSums,
  ...DozedSums,
  hibernatedMs: z
    .number()
    .int()
    .openapi({ description: "Milliseconds hibernated (no VM, its snapshot held; from the VM event log), summed over agents when not by agent" }),
};

export const Usage = z
  .object({
    tenantId: z.string(),
    from: z.string().openapi({ description: "ISO 8601 with the zone's offset" }),
    to: z.string(),
    timeZone: z.string(),
    groupBy: z.array(z.string()),
    agentId: z.string().optional(),
    source: z.enum(["rollup", "raw"]).openapi({ description: "rollup: 15-minute buckets; raw: segments split by overlap (ranges not on quarter hours)" }),
    rows: z.array(
      z.object({
        start: z.string(),
        end: z.string(),
        agentId: z.string().optional(),
        poolId: z
          .string()
          .optional()
          .openapi({ description: "By agent: the warm pool the agent belongs to (absent for one in none); a pooled agent is billed as any other" }),
        ...Sums,
      }),
    ),
    totals: z.object(Sums),
  })
  .openapi("Usage");

const timingShape = Object.fromEntries(wakeTimingKeys.map((k) => [k, z.number().optional()])) as {
  [K in (typeof wakeTimingKeys)[number]]: z.ZodOptional<z.ZodNumber>;
};
export const WakeTimings = z
  .object({
    ...timingShape,
    tier: z.enum(["kept", "prestarted", "files"]).optional().openapi({
      description: "a restore's sleep tier: kept (its QEMU, stopped), prestarted (a QEMU waiting for its state), files (a new QEMU)",
    }),
  })
  .openapi("WakeTimings", { description: "The wake's parts in ms, as the host recorded them, and a restore's sleep tier" });

export const Run = z
  .object({
    runId: z.string(),
    hostId: z.string(),
    vmId: z.string(),
    wokeAt: z.string(),
    wakeReason: z.string(),
    wakeMode: z.string().openapi({ description: "restore | boot" }),
    timings: WakeTimings,
    sleptAt: z.string().nullable(),
    sleepReason: z.string().nullable(),
    awakeMs: z.number().int().nullable(),
    ...ActiveSums,
    ...DozedSums,
    segments: z.number().int(),
    overlapMs: z.number().int().openapi({
      description:
        "Ms of the run's segments not billed: time of the agent that another segment (another host's, e.g. after a failover) had already billed; the sums above leave it out",
    }),
    operations: z.number().int().openapi({ description: "Calls through upstreams made during the run (operation records)" }),
    upstreamWaitMs: z.number().int().openapi({
      description: "Sum over those operations of first byte minus sent: the time the run waited on upstreams (calls without an answer add nothing)",
    }),
    inputTokens: z.number().int().openapi({ description: "Input tokens of those operations, where their completions said" }),
    outputTokens: z.number().int().openapi({ description: "Output tokens of those operations, where their completions said" }),
    viewerMs: z.number().int().openapi({
      description: "Of the run, how long a desktop viewer was connected (a viewer holds the agent awake; several at once count once)",
    }),
    controlMs: z.number().int().openapi({ description: "Of the run, how long a human held control of the desktop through the viewer" }),
  })
  .openapi("Run");

export const RunPage = z.object({ agentId: z.string(), runs: z.array(Run), nextCursor: NextCursor }).openapi("RunPage");

const Rates = z
  .object({
    currency: z.string(),
    vcpuSecondNanocents: z.number().int(),
    gibSecondNanocents: z.number().int(),
    snapshotGibMonthNanocents: z.number().int(),
    dozeVcpuSecondNanocents: z.number().int().openapi({ description: "Per vCPU-second while dozing (0: dozing vCPUs are free)" }),
    dozeGibSecondNanocents: z
      .number()
      .int()
      .nullable()
      .openapi({ description: "Per GiB-second of memory while dozing; null: the snapshot rate (snapshotGibMonthNanocents per 730 h)" }),
  })
  .openapi("Rates", { description: "Prices in nano-cents (10⁻⁹ cent) per priced unit" });

const InvoiceRateCard = Rates.extend({
  id: z.string(),
  tenantId: z.string().nullable().openapi({ description: "null for the default card" }),
  effectiveFrom: z.string().openapi({ description: "The instant the version applies from (UTC)" }),
  from: z.string().openapi({ description: "The part of the period it priced: from (in the invoice's zone)…" }),
  to: z.string().openapi({ description: "…to, exclusive" }),
}).openapi("InvoiceRateCard");

export const Invoice = z
  .object({
    id: z.string(),
    tenantId: z.string(),
    month: z.string(),
    timeZone: z.string(),
    periodStart: z.string(),
    periodEnd: z.string(),
    status: z.enum(["draft", "final"]),
    cutoffAt: z.string().openapi({ description: "Segments received before this instant are counted" }),
    finalizableAt: z.string(),
    currency: z.string(),
    rates: Rates.openapi({ description: "The card in effect at the period's start" }),
    rateCards: z
      .array(InvoiceRateCard)
      .openapi({ description: "Every card version that priced a part of the period, in order (empty on invoices finalized before cards were versioned)" }),
    lines: z.array(
      z.object({
        agentId: z.string().openapi({
          description:
            "Lines per agent, resource and card version: vcpu and memory while active, doze_vcpu and doze_memory while dozing (doze memory quoted per GiB-month), snapshot_storage",
        }),
        resource: z.enum(resources as readonly [string, ...string[]]),
        quantity: z.string().openapi({ description: "In `unit`, a decimal string (storage byte-ms exceed 2^53)" }),
        unit: z.string(),
        unitPriceNanocents: z.number().int(),
        priceUnit: z.string(),
        amountCents: z.number().int(),
        rateCardId: z
          .string()
          .nullable()
          .openapi({ description: "The card version that priced the line (one of `rateCards`; null on lines finalized before versions)" }),
      }),
    ),
    time: z.array(z.object({ agentId: z.string(), activeMs: z.number().int(), dozedMs: z.number().int(), hibernatedMs: z.number().int() })).openapi({
      description:
        "Per agent with usage in the period: ms active (the vcpu and memory lines), dozed (the doze lines) and hibernated (its snapshot, priced by size on snapshot_storage); empty on invoices finalized before dozing existed",
    }),
    totalCents: z.number().int(),
    total: z.string().openapi({ example: "0.45" }),
    metering: z.string().openapi({
      description: "How compute was metered, and what a host lost before it shipped its meter segments costs (at most its open segment per agent, not charged)",
    }),
  })
  .openapi("Invoice");

export const InvoiceSummary = z
  .object({
    id: z.string(),
    month: z.string(),
    status: z.enum(["draft", "final"]),
    totalCents: z.number().int().nullable().openapi({ description: "null for a draft (read it for its total)" }),
    currency: z.string(),
  })
  .openapi("InvoiceSummary");

export const InvoicePage = z.object({ invoices: z.array(InvoiceSummary), nextCursor: NextCursor }).openapi("InvoicePage");

export const RateCard = Rates.extend({
  id: z.string(),
  tenantId: z.string().nullable().openapi({ description: "null for the default card" }),
  units: z.object({
    vcpuSecondNanocents: z.string(),
    gibSecondNanocents: z.string(),
    snapshotGibMonthNanocents: z.string(),
    dozeVcpuSecondNanocents: z.string(),
    dozeGibSecondNanocents: z.string(),
  }),
}).openapi("RateCard");

// ---- Rate-card versions ----

const nanocents = (what: string) =>
  z
    .number()
    .int()
    .min(0)
    .max(Number.MAX_SAFE_INTEGER)
    .openapi({ description: `Nano-cents (10⁻⁹ cent) per ${what}, a non-negative integer` });

/** `effectiveFrom` of a new version: an absolute instant on a UTC quarter hour (the handler checks the alignment, with its own message). */
const EffectiveFromParam = z
  .string()
  .superRefine((v, ctx) => {
    const read = readInstant(v);
    if ("problem" in read) ctx.addIssue({ code: "custom", message: read.problem });
    else if (!("at" in read)) ctx.addIssue({ code: "custom", message: "must be an instant with a time and Z or an offset (a bare date would need a zone)" });
  })
  .openapi({
    description: "ISO 8601 instant (Z or an offset) on a UTC quarter hour; default: the next quarter hour at or after now",
    example: "2026-11-01T00:00:00Z",
  });

export const NewRateCardVersion = z
  .strictObject({
    currency: z.string().default("USD").openapi({ description: "ISO 4217 code, 3 upper-case letters (default USD)", example: "USD" }),
    vcpuSecondNanocents: nanocents("vCPU-second"),
    gibSecondNanocents: nanocents("GiB-second"),
    snapshotGibMonthNanocents: nanocents("GiB-month (730 h) of snapshot"),
    dozeVcpuSecondNanocents: nanocents("vCPU-second while dozing").default(0),
    dozeGibSecondNanocents: z
      .number()
      .int()
      .min(0)
      .max(maxDozeGibSecondNanocents)
      .nullable()
      .default(null)
      .openapi({
        description: `Nano-cents per GiB-second of memory while dozing, at most ${maxDozeGibSecondNanocents} (its GiB-month price, ×${storageMonthSeconds}, stays below 2^53); null (the default): the snapshot rate`,
      }),
    effectiveFrom: EffectiveFromParam.optional(),
  })
  .openapi("NewRateCardVersion", { description: "A new version of a card: it applies from `effectiveFrom` until the card's next version" });

export const RateCardsQuery = z.strictObject({ ...PageQuery.shape });

/** Largest body a rate-card version takes. */
export const maxRateCardBodyBytes = 16 * 1024;

export const TenantIdParams = z.object({ id: z.string().min(1).max(100).openapi({ description: "Tenant id", example: "ten_V1StGXR8Z5jdHi6B" }) });

export const RateCardVersion = Rates.extend({
  id: z.string(),
  tenantId: z.string().nullable().openapi({ description: "null for the default card" }),
  effectiveFrom: z.string().openapi({ description: "The instant it applies from (UTC)" }),
  createdAt: z.string(),
  createdBy: z.string().nullable().openapi({ description: "The subject of the token that wrote it (null for the seeded default)" }),
}).openapi("RateCardVersion");

export const RateCardVersionPage = z
  .object({
    tenantId: z.string().nullable().openapi({ description: "null: the default card" }),
    current: RateCardVersion.openapi({ description: "The version pricing the card's tenant now (a tenant without one of its own: the default card's)" }),
    versions: z.array(RateCardVersion).openapi({ description: "This card's versions, newest first (scheduled ones included)" }),
    nextCursor: NextCursor,
  })
  .openapi("RateCardVersionPage");

export const TenantRateCards = z
  .object({
    tenantId: z.string(),
    current: RateCardVersion,
    versions: z
      .array(RateCardVersion.extend({ until: z.string().nullable().openapi({ description: "When the next version takes over (null: none scheduled)" }) }))
      .openapi({ description: "Every version that priced, prices or will price the tenant (its own, and the default card's before its first), newest first" }),
    nextCursor: NextCursor,
  })
  .openapi("TenantRateCards");

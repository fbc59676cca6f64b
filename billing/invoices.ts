// Monthly invoices per tenant in its time zone: lines per agent, resource and rate-card version from segments received before a cutoff.
import { and, desc, eq, lt, sql } from "drizzle-orm";
import type { Clock } from "../lib/clock.ts";
import { AppError } from "../lib/errors.ts";
import { newId } from "../lib/ids.ts";
import type { DbAuditLog } from "../schema/audit-log.ts";
import type { Db } from "../schema/db.ts";
import { invoiceLines, invoices, type InvoiceStatus } from "../schema/billing.ts";
import { tenants } from "../schema/core.ts";
import { alignedToBuckets } from "./buckets.ts";
import { lineAmountCents, priceOf, resourceUnits, resources, type Rates, type Resource } from "./money.ts";
import { rateCardLockKey, rateCardTimeline, ratesOf, type RateCardPiece } from "./rates.ts";
import { hibernatedTime, snapshotStorage } from "./storage.ts";
import { addUsage, rawUsage, rollupUsage, type UsageSums } from "./usage.ts";
import { assertZone, monthRange } from "./zones.ts";

/** Late segments keep arriving for a while after a month ends (hosts that were cut off); finalize after this. */
export const defaultInvoiceGraceMs = 48 * 3_600_000;

export interface InvoiceLine {
  agentId: string;
  resource: Resource;
  /** In the base unit (`unit`), as a decimal string: storage byte-ms can exceed 2^53. */
  quantity: string;
  unit: string;
  unitPriceNanocents: number;
  priceUnit: string;
  amountCents: number;
  /** The rate-card version that priced it (null on lines finalized before cards were versioned). */
  rateCardId: string | null;
}

/** An agent's time in the invoice's period by state: what its compute, doze and snapshot lines priced. */
export interface InvoiceAgentTime {
  agentId: string;
  /** Metered while running (the vcpu and memory lines). */
  activeMs: number;
  /** Metered while dozing (the doze_vcpu and doze_memory lines). */
  dozedMs: number;
  /** Hibernated, from the VM event log (its snapshot is on the snapshot_storage line, priced by size). */
  hibernatedMs: number;
}

/** A card version an invoice used, and the part `[from, to)` of the period it priced. */
export interface InvoiceRateCard extends Rates {
  id: string;
  tenantId: string | null;
  effectiveFrom: number;
  from: number;
  to: number;
}

export interface Invoice {
  id: string;
  tenantId: string;
  month: string;
  timeZone: string;
  periodStart: number;
  periodEnd: number;
  status: InvoiceStatus;
  /** Segments received before this instant are counted; for a draft it is the time of computation. */
  cutoffAt: number;
  /** A final invoice needs the month to end plus this grace (ms) for late segments. */
  finalizableAt: number;
  currency: string;
  /** The card in effect at the period's start (what a single-card invoice was priced with). */
  rates: Rates;
  /** Every card version that priced a part of the period, in order (empty on invoices finalized before versions). */
  rateCards: InvoiceRateCard[];
  lines: InvoiceLine[];
  /** Per agent with usage: active, dozed and hibernated ms (empty on invoices finalized before dozing existed). */
  time: InvoiceAgentTime[];
  totalCents: number;
  /** How compute was metered, and what a lost host's metering costs the invoice (`meteringNote`). */
  metering: string;
}

/**
 * Said on every invoice: compute lines count the meter segments hosts shipped. A host lost before shipping them loses
 * what it had not shipped, at most its open segment per agent (one meter heartbeat, `METER_HEARTBEAT_MS`, 10 s by
 * default) plus what its spool held; that time is not charged. Its runs end at its last heartbeat.
 */
export const meteringNote =
  "Compute is billed from the meter segments each host ships (one segment at most every meter heartbeat, METER_HEARTBEAT_MS). A host that is lost before it ships loses at most its open segment per agent, which is not charged; an agent that moves to another host is metered there from its wake. Time of one agent that two hosts both report (a host that ran on, or shipped late, after the agent moved) is billed once: each segment only for what no segment received before it had billed (the run report's overlapMs).";

export interface InvoiceOptions {
  graceMs?: number;
}

/** Who finalizes: the `invoice.finalize` audit row is written in the transaction that freezes the invoice (once). */
export interface FinalizeAudit {
  log: DbAuditLog;
  actor: string;
  requestId: string | null;
}

/**
 * Active usage per agent in each window of `boundaries` (ascending), from segments received before `cutoff`: rollups
 * minus late arrivals. `nowMs`, when given and before the cutoff, says nothing can have been received at or after it
 * yet (a draft). Answers one map per window.
 */
export async function agentUsageByWindow(
  db: Db,
  tenantId: string,
  boundaries: readonly number[],
  cutoff: number,
  nowMs?: number,
): Promise<Map<string, UsageSums>[]> {
  const q = { tenantId, byAgent: true };
  const out = Array.from({ length: boundaries.length - 1 }, () => new Map<string, UsageSums>());
  if (!alignedToBuckets(boundaries)) {
    for (const w of await rawUsage(db, q, boundaries, { before: cutoff })) out[w.window]?.set(w.agentId as string, w);
    return out;
  }
  for (const { window, agentId, ...sums } of await rollupUsage(db, q, boundaries)) out[window]?.set(agentId as string, sums);
  if (nowMs !== undefined && nowMs < cutoff) return out;
  // rollups hold everything received so far; segments received at or after the cutoff are taken back out
  for (const late of await rawUsage(db, q, boundaries, { from: cutoff })) {
    const sums = out[late.window]?.get(late.agentId as string);
    if (sums) addUsage(sums, late, -1);
  }
  return out;
}

/** Active usage per agent in `[start, end)` from segments received before `cutoff` (see `agentUsageByWindow`). */
export async function agentUsageBefore(db: Db, tenantId: string, start: number, end: number, cutoff: number, nowMs?: number): Promise<Map<string, UsageSums>> {
  return (await agentUsageByWindow(db, tenantId, [start, end], cutoff, nowMs))[0] ?? new Map();
}

/**
 * The lines of a tenant's invoice for `[start, end)`, counting segments received (and events logged) before `cutoff`:
 * each piece of the period is priced with the card version of that piece (`pieces`, from `rateCardTimeline`), one line
 * per agent × resource × version, each rounded once, half up. Lines are ordered by agent, then piece, then resource.
 * With them, each agent's active, dozed and hibernated time over the period.
 */
export async function computeLines(
  db: Db,
  tenantId: string,
  start: number,
  end: number,
  cutoff: number,
  pieces: readonly RateCardPiece[],
  nowMs?: number,
): Promise<{ lines: InvoiceLine[]; time: InvoiceAgentTime[] }> {
  const until = Math.min(end, cutoff);
  const boundaries = [start, ...pieces.slice(1).map((p) => p.from), end];
  const metered = await agentUsageByWindow(db, tenantId, boundaries, cutoff, nowMs);
  const storage: Map<string, bigint>[] = [];
  for (const p of pieces) {
    const to = Math.min(p.to, until);
    storage.push(to > p.from ? await snapshotStorage(db, tenantId, p.from, to) : new Map<string, bigint>());
  }
  const hibernated = until > start ? await hibernatedTime(db, tenantId, [start, until]) : new Map<string, Map<number, number>>();
  const agentIds = [...new Set([...metered.flatMap((m) => [...m.keys()]), ...storage.flatMap((m) => [...m.keys()]), ...hibernated.keys()])].sort();
  const lines: InvoiceLine[] = [];
  const time: InvoiceAgentTime[] = [];
  for (const agentId of agentIds) {
    const spent: InvoiceAgentTime = { agentId, activeMs: 0, dozedMs: 0, hibernatedMs: hibernated.get(agentId)?.get(0) ?? 0 };
    pieces.forEach((piece, i) => {
      const usage = metered[i]?.get(agentId);
      spent.activeMs += usage?.activeMs ?? 0;
      spent.dozedMs += usage?.dozedMs ?? 0;
      const quantities: Record<Resource, bigint> = {
        vcpu: BigInt(usage?.vcpuMs ?? 0),
        memory: BigInt(usage?.mibMs ?? 0),
        // at the doze vCPU price, 0 by default
        doze_vcpu: BigInt(usage?.dozedVcpuMs ?? 0),
        doze_memory: BigInt(usage?.dozedMibMs ?? 0),
        snapshot_storage: storage[i]?.get(agentId) ?? 0n,
      };
      for (const resource of resources) {
        const quantity = quantities[resource];
        if (quantity <= 0n) continue;
        const price = priceOf(piece.card, resource);
        lines.push({
          agentId,
          resource,
          quantity: quantity.toString(),
          unit: resourceUnits[resource].unit,
          unitPriceNanocents: price,
          priceUnit: resourceUnits[resource].priceUnit,
          amountCents: Number(lineAmountCents(resource, quantity, price)),
          rateCardId: piece.card.id,
        });
      }
    });
    if (spent.activeMs > 0 || spent.dozedMs > 0 || spent.hibernatedMs > 0) time.push(spent);
  }
  return { lines, time };
}

/** The cards of an invoice as it shows them (and a final one stores them). */
function invoiceCards(pieces: readonly RateCardPiece[]): InvoiceRateCard[] {
  return pieces.map((p) => ({ id: p.card.id, tenantId: p.card.tenantId, effectiveFrom: p.card.effectiveFrom, from: p.from, to: p.to, ...ratesOf(p.card) }));
}

/** The period's pieces, refused (409) when its cards would mix currencies (versions are checked on creation; older rows may not be). */
async function pricedPieces(db: Db, tenantId: string, start: number, end: number): Promise<RateCardPiece[]> {
  const pieces = await rateCardTimeline(db, tenantId, start, end);
  const currencies = [...new Set(pieces.map((p) => p.card.currency))];
  if (currencies.length > 1)
    throw new AppError(
      "conflict",
      `the rate cards of this period are in ${currencies.join(" and ")}: an invoice has one currency (add a version in the first currency from the period's start)`,
    );
  return pieces;
}

async function tenantZone(db: Db, tenantId: string): Promise<string> {
  const [row] = await db.select({ timeZone: tenants.timeZone }).from(tenants).where(eq(tenants.id, tenantId));
  if (!row) throw new AppError("not_found", "tenant not found");
  return assertZone(row.timeZone);
}

type InvoiceRow = typeof invoices.$inferSelect;

/** The tenant's invoice row for `month`, created on first use. */
async function invoiceRow(db: Db, tenantId: string, month: string, clock: Clock): Promise<InvoiceRow> {
  const [existing] = await db
    .select()
    .from(invoices)
    .where(and(eq(invoices.tenantId, tenantId), eq(invoices.month, month)));
  if (existing) return existing;
  const zone = await tenantZone(db, tenantId);
  const { start, end } = monthRange(zone, month);
  if (start > clock.now()) throw new AppError("bad_request", `month ${month} has not started yet`);
  await db
    .insert(invoices)
    .values({ id: newId("invoice"), tenantId, month, timeZone: zone, periodStart: new Date(start), periodEnd: new Date(end) })
    .onConflictDoNothing();
  const [row] = await db
    .select()
    .from(invoices)
    .where(and(eq(invoices.tenantId, tenantId), eq(invoices.month, month)));
  if (!row) throw new AppError("internal", "invoice row vanished");
  return row;
}

async function present(db: Db, row: InvoiceRow, clock: Clock, graceMs: number): Promise<Invoice> {
  const start = row.periodStart.getTime();
  const end = row.periodEnd.getTime();
  const base = {
    id: row.id,
    tenantId: row.tenantId,
    month: row.month,
    timeZone: row.timeZone,
    periodStart: start,
    periodEnd: end,
    finalizableAt: end + graceMs,
    metering: meteringNote,
  };
  if (row.status === "final") {
    const stored = await db.select().from(invoiceLines).where(eq(invoiceLines.invoiceId, row.id)).orderBy(invoiceLines.lineNo);
    // the frozen cards and time ride with the rates (invoices finalized before either existed have none)
    const frozen = row.rates as unknown as Rates & { rateCards?: InvoiceRateCard[]; time?: InvoiceAgentTime[] };
    const { rateCards: storedCards = [], time = [], ...rates } = frozen;
    return {
      ...base,
      status: "final",
      cutoffAt: (row.cutoffAt as Date).getTime(),
      currency: row.currency,
      rates: ratesOf(rates),
      rateCards: storedCards.map((c) => ({ ...c, ...ratesOf(c) })),
      time,
      lines: stored.map((l) => ({
        agentId: l.agentId,
        resource: l.resource as Resource,
        quantity: l.quantity,
        unit: l.unit,
        unitPriceNanocents: l.unitPriceNanocents,
        priceUnit: resourceUnits[l.resource as Resource].priceUnit,
        amountCents: l.amountCents,
        rateCardId: l.rateCardId,
      })),
      totalCents: row.totalCents ?? 0,
    };
  }
  // a draft counts what has arrived so far, this millisecond included (never beyond the end of the grace period)
  const now = clock.now();
  const cutoff = Math.min(now + 1, end + graceMs);
  const pieces = await pricedPieces(db, row.tenantId, start, end);
  const rates = ratesOf((pieces[0] as RateCardPiece).card);
  const { lines, time } = await computeLines(db, row.tenantId, start, end, cutoff, pieces, now);
  return {
    ...base,
    status: "draft",
    cutoffAt: cutoff,
    currency: rates.currency,
    rates,
    rateCards: invoiceCards(pieces),
    lines,
    time,
    totalCents: lines.reduce((t, l) => t + l.amountCents, 0),
  };
}

/** The tenant's invoice for `month` (`YYYY-MM` in its time zone): stored if final, computed now if draft. */
export async function invoiceForMonth(db: Db, clock: Clock, tenantId: string, month: string, opts: InvoiceOptions = {}): Promise<Invoice> {
  const row = await invoiceRow(db, tenantId, month, clock);
  return present(db, row, clock, opts.graceMs ?? defaultInvoiceGraceMs);
}

/** An invoice by id, only if it belongs to `tenantId` (another tenant's answers not found). */
export async function invoiceById(db: Db, clock: Clock, tenantId: string, id: string, opts: InvoiceOptions = {}): Promise<Invoice> {
  const [row] = await db
    .select()
    .from(invoices)
    .where(and(eq(invoices.id, id), eq(invoices.tenantId, tenantId)));
  if (!row) throw new AppError("not_found", "invoice not found");
  return present(db, row, clock, opts.graceMs ?? defaultInvoiceGraceMs);
}

export interface InvoiceSummary {
  id: string;
  month: string;
  status: InvoiceStatus;
  totalCents: number | null;
  currency: string;
}

/**
 * The tenant's invoices (rows created so far), newest month first; drafts carry no total until read. A page: at most
 * `limit` rows, continuing after month `afterMonth` (keyset on the unique (tenant, month) index).
 */
export async function listInvoices(db: Db, tenantId: string, opts: { limit: number; afterMonth?: string }): Promise<InvoiceSummary[]> {
  const rows = await db
    .select()
    .from(invoices)
    .where(and(eq(invoices.tenantId, tenantId), opts.afterMonth === undefined ? undefined : lt(invoices.month, opts.afterMonth)))
    .orderBy(desc(invoices.month))
    .limit(opts.limit);
  return rows.map((r) => ({ id: r.id, month: r.month, status: r.status, totalCents: r.status === "final" ? r.totalCents : null, currency: r.currency }));
}

/** Same pieces: same versions over the same parts of the period. */
function samePieces(a: readonly RateCardPiece[], b: readonly RateCardPiece[]): boolean {
  return a.length === b.length && a.every((p, i) => p.card.id === b[i]?.card.id && p.from === b[i]?.from && p.to === b[i]?.to);
}

/**
 * Freezes the invoice: lines computed with cutoff = month end + grace, each with the card version that priced it, stored
 * with the cards used. Refused (409) before the grace period is over; finalizing twice returns the same invoice. Holds
 * the rate-card lock while it writes, and prices again if a version was added meanwhile.
 */
export async function finalizeInvoice(
  db: Db,
  clock: Clock,
  tenantId: string,
  month: string,
  opts: InvoiceOptions & { audit?: FinalizeAudit } = {},
): Promise<Invoice> {
  const graceMs = opts.graceMs ?? defaultInvoiceGraceMs;
  const row = await invoiceRow(db, tenantId, month, clock);
  const start = row.periodStart.getTime();
  const end = row.periodEnd.getTime();
  const cutoff = end + graceMs;
  if (row.status !== "final") {
    if (clock.now() < cutoff)
      throw new AppError(
        "conflict",
        `invoice ${month} can be finalized from ${new Date(cutoff).toISOString()} (month end + ${graceMs / 3_600_000} h grace for late meter segments)`,
      );
    for (let attempt = 0; ; attempt++) {
      const pieces = await pricedPieces(db, tenantId, start, end);
      const { lines, time } = await computeLines(db, tenantId, start, end, cutoff, pieces);
      const rates = ratesOf((pieces[0] as RateCardPiece).card);
      const written = await db.transaction(async (tx) => {
        await tx.execute(sql`select pg_advisory_xact_lock(${rateCardLockKey})`);
        const [locked] = await tx.select().from(invoices).where(eq(invoices.id, row.id)).for("update");
        if (!locked || locked.status === "final") return true; // someone else finalized it meanwhile
        // a version added between pricing and this lock: price again (never freeze prices the cards no longer say)
        if (!samePieces(pieces, await rateCardTimeline(tx as unknown as Db, tenantId, start, end))) return false;
        if (lines.length > 0) {
          await tx.insert(invoiceLines).values(
            lines.map((l, i) => ({
              invoiceId: row.id,
              lineNo: i + 1,
              agentId: l.agentId,
              resource: l.resource,
              quantity: l.quantity,
              unit: l.unit,
              unitPriceNanocents: l.unitPriceNanocents,
              amountCents: l.amountCents,
              rateCardId: l.rateCardId,
            })),
          );
        }
        await tx
          .update(invoices)
          .set({
            status: "final",
            cutoffAt: new Date(cutoff),
            currency: rates.currency,
            totalCents: lines.reduce((t, l) => t + l.amountCents, 0),
            rates: { ...rates, rateCards: invoiceCards(pieces), time },
            finalizedAt: new Date(clock.now()),
          })
          .where(eq(invoices.id, row.id));
        const a = opts.audit;
        if (a)
          await a.log.within(tx).record({
            tenantId,
            actor: a.actor,
            action: "invoice.finalize",
            target: row.id,
            requestId: a.requestId,
            detail: { month, currency: rates.currency, totalCents: lines.reduce((t, l) => t + l.amountCents, 0), lines: lines.length },
          });
        return true;
      });
      if (written) break;
      if (attempt >= 3) throw new AppError("conflict", "rate cards kept changing while the invoice was being finalized; try again");
    }
  }
  return invoiceById(db, clock, tenantId, row.id, { graceMs });
}

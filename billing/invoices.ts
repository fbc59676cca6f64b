// Monthly invoices per tenant in its time zone: lines per agent and resource from segments received before a cutoff.
import { and, desc, eq, lt } from "drizzle-orm";
import type { Clock } from "../lib/clock.ts";
import { AppError } from "../lib/errors.ts";
import { newId } from "../lib/ids.ts";
import type { Db } from "../schema/db.ts";
import { invoiceLines, invoices, type InvoiceStatus } from "../schema/billing.ts";
import { tenants } from "../schema/core.ts";
import { alignedToBuckets } from "./buckets.ts";
import { lineAmountCents, priceOf, resourceUnits, resources, type Rates, type Resource } from "./money.ts";
import { rateCardFor } from "./rates.ts";
import { snapshotStorage } from "./storage.ts";
import { rawUsage, rollupUsage, type UsageSums } from "./usage.ts";
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
  rates: Rates;
  lines: InvoiceLine[];
  totalCents: number;
}

export interface InvoiceOptions {
  graceMs?: number;
}

/**
 * Active usage per agent in `[start, end)` from segments received before `cutoff`: rollups minus late arrivals.
 * `nowMs`, when given and before the cutoff, says nothing can have been received at or after it yet (a draft).
 */
export async function agentUsageBefore(db: Db, tenantId: string, start: number, end: number, cutoff: number, nowMs?: number): Promise<Map<string, UsageSums>> {
  const boundaries = [start, end];
  const q = { tenantId, byAgent: true };
  const out = new Map<string, UsageSums>();
  if (!alignedToBuckets(boundaries)) {
    for (const w of await rawUsage(db, q, boundaries, { before: cutoff })) out.set(w.agentId as string, w);
    return out;
  }
  for (const w of await rollupUsage(db, q, boundaries)) out.set(w.agentId as string, { activeMs: w.activeMs, vcpuMs: w.vcpuMs, mibMs: w.mibMs });
  if (nowMs !== undefined && nowMs < cutoff) return out;
  // rollups hold everything received so far; segments received at or after the cutoff are taken back out
  for (const late of await rawUsage(db, q, boundaries, { from: cutoff })) {
    const sums = out.get(late.agentId as string);
    if (!sums) continue;
    sums.activeMs -= late.activeMs;
    sums.vcpuMs -= late.vcpuMs;
    sums.mibMs -= late.mibMs;
  }
  return out;
}

/** The lines of a tenant's invoice for `[start, end)`, counting segments received (and events logged) before `cutoff`. */
export async function computeLines(db: Db, tenantId: string, start: number, end: number, cutoff: number, rates: Rates, nowMs?: number): Promise<InvoiceLine[]> {
  const until = Math.min(end, cutoff);
  const active = await agentUsageBefore(db, tenantId, start, end, cutoff, nowMs);
  const storage = until > start ? await snapshotStorage(db, tenantId, start, until) : new Map<string, bigint>();
  const agentIds = [...new Set([...active.keys(), ...storage.keys()])].sort();
  const lines: InvoiceLine[] = [];
  for (const agentId of agentIds) {
    const quantities: Record<Resource, bigint> = {
      vcpu: BigInt(active.get(agentId)?.vcpuMs ?? 0),
      memory: BigInt(active.get(agentId)?.mibMs ?? 0),
      snapshot_storage: storage.get(agentId) ?? 0n,
    };
    for (const resource of resources) {
      const quantity = quantities[resource];
      if (quantity <= 0n) continue;
      const price = priceOf(rates, resource);
      lines.push({
        agentId,
        resource,
        quantity: quantity.toString(),
        unit: resourceUnits[resource].unit,
        unitPriceNanocents: price,
        priceUnit: resourceUnits[resource].priceUnit,
        amountCents: Number(lineAmountCents(resource, quantity, price)),
      });
    }
  }
  return lines;
}

async function tenantZone(db: Db, tenantId: string): Promise<string> {
  const [row] = await db.select({ timeZone: tenants.timeZone }).from(tenants).where(eq(tenants.id, tenantId));
  if (!row) throw new AppError("not_found", "tenant not found");
  return assertZone(row.timeZone);
}

type InvoiceRow = typeof invoices.$inferSelect;

/** The tenant's invoice row for `month`, created on first use. */
async function invoiceRow(db: Db, tenantId: string, month: string, clock: Clock): Promise<InvoiceRow> {
  const [existing] = await db.select().from(invoices).where(and(eq(invoices.tenantId, tenantId), eq(invoices.month, month)));
  if (existing) return existing;
  const zone = await tenantZone(db, tenantId);
  const { start, end } = monthRange(zone, month);
  if (start > clock.now()) throw new AppError("bad_request", `month ${month} has not started yet`);
  await db
    .insert(invoices)
    .values({ id: newId("invoice"), tenantId, month, timeZone: zone, periodStart: new Date(start), periodEnd: new Date(end) })
    .onConflictDoNothing();
  const [row] = await db.select().from(invoices).where(and(eq(invoices.tenantId, tenantId), eq(invoices.month, month)));
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
  };
  if (row.status === "final") {
    const stored = await db.select().from(invoiceLines).where(eq(invoiceLines.invoiceId, row.id)).orderBy(invoiceLines.lineNo);
    const rates = row.rates as unknown as Rates;
    return {
      ...base,
      status: "final",
      cutoffAt: (row.cutoffAt as Date).getTime(),
      currency: row.currency,
      rates,
      lines: stored.map((l) => ({
        agentId: l.agentId,
        resource: l.resource as Resource,
        quantity: l.quantity,
        unit: l.unit,
        unitPriceNanocents: l.unitPriceNanocents,
        priceUnit: resourceUnits[l.resource as Resource].priceUnit,
        amountCents: l.amountCents,
      })),
      totalCents: row.totalCents ?? 0,
    };
  }
  // a draft counts what has arrived so far, this millisecond included (never beyond the end of the grace period)
  const now = clock.now();
  const cutoff = Math.min(now + 1, end + graceMs);
  const card = await rateCardFor(db, row.tenantId);
  const rates: Rates = { currency: card.currency, vcpuSecondNanocents: card.vcpuSecondNanocents, gibSecondNanocents: card.gibSecondNanocents, snapshotGibMonthNanocents: card.snapshotGibMonthNanocents };
  const lines = await computeLines(db, row.tenantId, start, end, cutoff, rates, now);
  return { ...base, status: "draft", cutoffAt: cutoff, currency: rates.currency, rates, lines, totalCents: lines.reduce((t, l) => t + l.amountCents, 0) };
}

/** The tenant's invoice for `month` (`YYYY-MM` in its time zone): stored if final, computed now if draft. */
export async function invoiceForMonth(db: Db, clock: Clock, tenantId: string, month: string, opts: InvoiceOptions = {}): Promise<Invoice> {
  const row = await invoiceRow(db, tenantId, month, clock);
  return present(db, row, clock, opts.graceMs ?? defaultInvoiceGraceMs);
}

/** An invoice by id, only if it belongs to `tenantId` (another tenant's answers not found). */
export async function invoiceById(db: Db, clock: Clock, tenantId: string, id: string, opts: InvoiceOptions = {}): Promise<Invoice> {
  const [row] = await db.select().from(invoices).where(and(eq(invoices.id, id), eq(invoices.tenantId, tenantId)));
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

/**
 * Freezes the invoice: lines computed with cutoff = month end + grace, stored with the prices used.
 * Refused (409) before the grace period is over; finalizing twice returns the same invoice.
 */
export async function finalizeInvoice(db: Db, clock: Clock, tenantId: string, month: string, opts: InvoiceOptions = {}): Promise<Invoice> {
  const graceMs = opts.graceMs ?? defaultInvoiceGraceMs;
  const row = await invoiceRow(db, tenantId, month, clock);
  const end = row.periodEnd.getTime();
  const cutoff = end + graceMs;
  if (row.status !== "final") {
    if (clock.now() < cutoff) throw new AppError("conflict", `invoice ${month} can be finalized from ${new Date(cutoff).toISOString()} (month end + ${graceMs / 3_600_000} h grace for late meter segments)`);
    const card = await rateCardFor(db, tenantId);
    const rates: Rates = { currency: card.currency, vcpuSecondNanocents: card.vcpuSecondNanocents, gibSecondNanocents: card.gibSecondNanocents, snapshotGibMonthNanocents: card.snapshotGibMonthNanocents };
    const lines = await computeLines(db, tenantId, row.periodStart.getTime(), end, cutoff, rates);
    await db.transaction(async (tx) => {
      const [locked] = await tx.select().from(invoices).where(eq(invoices.id, row.id)).for("update");
      if (!locked || locked.status === "final") return; // someone else finalized it meanwhile
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
          rates: { ...rates },
          finalizedAt: new Date(clock.now()),
        })
        .where(eq(invoices.id, row.id));
    });
  }
  return invoiceById(db, clock, tenantId, row.id, { graceMs });
}

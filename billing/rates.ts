// Rate cards as versions: the default card (seeded at first use) and per-tenant cards, each version applying from its instant.
import { and, asc, eq, gt, isNull, lt, or, sql } from "drizzle-orm";
import { AppError } from "../lib/errors.ts";
import { newId } from "../lib/ids.ts";
import { createDbAuditLog, type DbAuditLog } from "../schema/audit-log.ts";
import type { Db } from "../schema/db.ts";
import { invoices, rateCards } from "../schema/billing.ts";
import { tenants } from "../schema/core.ts";
import { bucketMs } from "./buckets.ts";
import { defaultRates, maxDozeGibSecondNanocents, storageMonthSeconds, type Rates, type RatesInput } from "./money.ts";
import { sqlState } from "./sql-runner.ts";
import { assertZone, monthOf, monthRange } from "./zones.ts";

export const defaultRateCardId = "rc_default";

export interface RateCard extends Rates {
  id: string;
  /** null for the default card. */
  tenantId: string | null;
  /** Epoch ms this version applies from (until the next version of the same card). */
  effectiveFrom: number;
  /** When the version was written (epoch ms). */
  createdAt: number;
  /** The subject that wrote it; null for the seeded default. */
  createdBy: string | null;
}

/** `[from, to)` of a range priced by one card version. */
export interface RateCardPiece {
  from: number;
  to: number;
  card: RateCard;
}

/** The last instant a version may start at: the end of year 9999 (what the API's instants can say). */
export const latestRateInstant = Date.UTC(9999, 11, 31, 23, 45);

type RateCardRow = typeof rateCards.$inferSelect;

function cardOf(row: RateCardRow): RateCard {
  return {
    id: row.id,
    tenantId: row.tenantId,
    currency: row.currency,
    vcpuSecondNanocents: row.vcpuSecondNanocents,
    gibSecondNanocents: row.gibSecondNanocents,
    snapshotGibMonthNanocents: row.snapshotGibMonthNanocents,
    dozeVcpuSecondNanocents: row.dozeVcpuSecondNanocents,
    dozeGibSecondNanocents: row.dozeGibSecondNanocents,
    effectiveFrom: row.effectiveFrom.getTime(),
    createdAt: row.updatedAt.getTime(),
    createdBy: row.createdBy,
  };
}

/**
 * The prices of a card version, without its identity. Rates frozen on an invoice before doze prices existed have none:
 * they read as the defaults (doze vCPU free, doze memory at the snapshot rate), which is what such an invoice charged.
 */
export function ratesOf(card: RatesInput): Rates {
  return {
    currency: card.currency,
    vcpuSecondNanocents: card.vcpuSecondNanocents,
    gibSecondNanocents: card.gibSecondNanocents,
    snapshotGibMonthNanocents: card.snapshotGibMonthNanocents,
    dozeVcpuSecondNanocents: card.dozeVcpuSecondNanocents ?? 0,
    dozeGibSecondNanocents: card.dozeGibSecondNanocents ?? null,
  };
}

/** Inserts the default card's first version (from 1970) unless it exists (concurrent callers are fine). */
export async function ensureDefaultRateCard(db: Db): Promise<void> {
  await db
    .insert(rateCards)
    .values({ id: defaultRateCardId, tenantId: null, ...defaultRates, effectiveFrom: new Date(0) })
    .onConflictDoNothing();
}

/** The versions that can apply to `tenantId` (its own and the default card's), oldest first. */
async function versionsFor(db: Db, tenantId: string | null): Promise<{ own: RateCard[]; defaults: RateCard[] }> {
  const where = tenantId === null ? isNull(rateCards.tenantId) : or(eq(rateCards.tenantId, tenantId), isNull(rateCards.tenantId));
  let rows = await db.select().from(rateCards).where(where).orderBy(asc(rateCards.effectiveFrom));
  if (!rows.some((r) => r.id === defaultRateCardId)) {
    await ensureDefaultRateCard(db);
    rows = await db.select().from(rateCards).where(where).orderBy(asc(rateCards.effectiveFrom));
  }
  const cards = rows.map(cardOf);
  return { own: tenantId === null ? [] : cards.filter((c) => c.tenantId === tenantId), defaults: cards.filter((c) => c.tenantId === null) };
}

/** The latest of `versions` (oldest first) in effect at `t`. */
function latestAt(versions: readonly RateCard[], t: number): RateCard | undefined {
  let found: RateCard | undefined;
  for (const v of versions) {
    if (v.effectiveFrom > t) break;
    found = v;
  }
  return found;
}

/** A tenant's own versions override the default card's from their instant on; before the first, the default's apply. */
function cardAt(v: { own: readonly RateCard[]; defaults: readonly RateCard[] }, t: number): RateCard {
  const card = latestAt(v.own, t) ?? latestAt(v.defaults, t);
  if (!card) throw new AppError("internal", "no default rate card");
  return card;
}

function timelineOf(v: { own: readonly RateCard[]; defaults: readonly RateCard[] }, start: number, end: number): RateCardPiece[] {
  if (!(end > start)) return [];
  const cuts = [...new Set([start, ...[...v.own, ...v.defaults].map((c) => c.effectiveFrom).filter((t) => t > start && t < end)])].sort((a, b) => a - b);
  const pieces: RateCardPiece[] = [];
  cuts.forEach((from, i) => {
    const to = cuts[i + 1] ?? end;
    const card = cardAt(v, from);
    const last = pieces[pieces.length - 1];
    if (last && last.card.id === card.id) last.to = to;
    else pieces.push({ from, to, card });
  });
  return pieces;
}

/** The card version that prices `tenantId`'s usage at instant `t` (its own, else the default card's). */
export async function rateCardAt(db: Db, tenantId: string, t: number): Promise<RateCard> {
  return cardAt(await versionsFor(db, tenantId), t);
}

/** The default card's version in effect at `t`. */
export async function defaultRateCardAt(db: Db, t: number): Promise<RateCard> {
  return cardAt(await versionsFor(db, null), t);
}

/**
 * `[start, end)` cut into the pieces each priced by one card version, in order, adjacent and covering the range (a
 * tenant's own versions override the default card's from their instant on; before its first one the default's apply).
 */
export async function rateCardTimeline(db: Db, tenantId: string, start: number, end: number): Promise<RateCardPiece[]> {
  return timelineOf(await versionsFor(db, tenantId), start, end);
}

/** A card's versions (`tenantId` null: the default card's), newest first: at most `limit`, older than `before` (ms). */
export async function listRateCardVersions(db: Db, tenantId: string | null, opts: { limit: number; before?: number }): Promise<RateCard[]> {
  if (tenantId === null) await ensureDefaultRateCard(db);
  const rows = await db
    .select()
    .from(rateCards)
    .where(
      and(
        tenantId === null ? isNull(rateCards.tenantId) : eq(rateCards.tenantId, tenantId),
        opts.before === undefined ? undefined : lt(rateCards.effectiveFrom, new Date(opts.before)),
      ),
    )
    .orderBy(sql`${rateCards.effectiveFrom} DESC`)
    .limit(opts.limit);
  return rows.map(cardOf);
}

/** The versions that price (or will price) `tenantId` from 1970 on, newest first, each with the instant it stops (null: open). */
export async function tenantRateCardTimeline(db: Db, tenantId: string): Promise<RateCardPiece[]> {
  const pieces = timelineOf(await versionsFor(db, tenantId), 0, latestRateInstant + bucketMs);
  return pieces.reverse();
}

/** The first quarter-hour boundary (UTC) at or after `t`: where a version without a stated instant starts. */
export function nextQuarterHour(t: number): number {
  return Math.ceil(t / bucketMs) * bucketMs;
}

const currencyPattern = /^[A-Z]{3}$/;
const priceKeys = ["vcpuSecondNanocents", "gibSecondNanocents", "snapshotGibMonthNanocents", "dozeVcpuSecondNanocents"] as const;

/** Throws `bad_request` for prices that are not non-negative safe integers, a currency not 3 capitals, an instant off the quarter hours. */
export function assertVersionInput(rates: Rates, effectiveFrom: number): void {
  if (!currencyPattern.test(rates.currency))
    throw new AppError("bad_request", `currency must be 3 upper-case letters (ISO 4217), got "${String(rates.currency).slice(0, 20)}"`);
  for (const k of priceKeys) {
    const v = rates[k];
    if (!Number.isSafeInteger(v) || v < 0) throw new AppError("bad_request", `${k} must be a non-negative integer of nano-cents (at most 2^53 - 1)`);
  }
  const dozeGib = rates.dozeGibSecondNanocents;
  if (dozeGib !== null && (!Number.isSafeInteger(dozeGib) || dozeGib < 0 || dozeGib > maxDozeGibSecondNanocents))
    throw new AppError(
      "bad_request",
      `dozeGibSecondNanocents must be null (the snapshot rate) or a non-negative integer of nano-cents up to ${maxDozeGibSecondNanocents} (its GiB-month price, ${storageMonthSeconds} times it, must stay below 2^53)`,
    );
  if (!Number.isSafeInteger(effectiveFrom) || effectiveFrom < 0 || effectiveFrom > latestRateInstant)
    throw new AppError("bad_request", "effectiveFrom must be an instant in the years 1970 to 9999");
  if (effectiveFrom % bucketMs !== 0) {
    throw new AppError(
      "bad_request",
      `effectiveFrom must be on a quarter-hour boundary in UTC (minutes 00, 15, 30 or 45, no seconds), so invoices stay on the 15-minute rollups; got ${new Date(effectiveFrom).toISOString()}, the next one is ${new Date(nextQuarterHour(effectiveFrom)).toISOString()}`,
    );
  }
}

/** One key for every rate-card version write and every invoice finalize: a finalize never prices with a card being added. */
export const rateCardLockKey = 0x72617465; // "rate"

export interface AddVersionOptions {
  /** Where the `rate_card.create` row goes (in the version's transaction); default the Postgres audit log over `db`. */
  audit?: DbAuditLog;
  requestId?: string | null;
}

/**
 * Adds a version of `tenantId`'s card (null: the default card) applying from `effectiveFrom` (epoch ms, on a UTC quarter
 * hour). 404 for a tenant that does not exist; 409 for an instant that already has a version, an instant inside or
 * before the period of a final invoice the version would price, or a currency change inside a month (see
 * `assertOneCurrencyPerMonth`). The version and its audit row commit together.
 */
export async function addRateCardVersion(
  db: Db,
  tenantId: string | null,
  input: RatesInput,
  effectiveFrom: number,
  createdBy: string,
  opts: AddVersionOptions = {},
): Promise<RateCard> {
  const rates = ratesOf(input);
  assertVersionInput(rates, effectiveFrom);
  let zone = "UTC";
  if (tenantId !== null) {
    const [tenant] = await db.select({ timeZone: tenants.timeZone }).from(tenants).where(eq(tenants.id, tenantId));
    if (!tenant) throw new AppError("not_found", "tenant not found");
    zone = assertZone(tenant.timeZone);
  }
  await ensureDefaultRateCard(db);
  const audit = opts.audit ?? createDbAuditLog(db);
  const id = newId("rateCard");
  const at = new Date(effectiveFrom);
  try {
    await db.transaction(async (tx) => {
      await tx.execute(sql`select pg_advisory_xact_lock(${rateCardLockKey})`);
      const txDb = tx as unknown as Db;
      const same = await tx
        .select({ id: rateCards.id })
        .from(rateCards)
        .where(and(tenantId === null ? isNull(rateCards.tenantId) : eq(rateCards.tenantId, tenantId), eq(rateCards.effectiveFrom, at)));
      if (same.length > 0) throw sameInstant(at);
      await assertNoFinalInvoiceAffected(txDb, tenantId, effectiveFrom);
      await assertOneCurrencyPerMonth(txDb, tenantId, zone, rates.currency, effectiveFrom);
      const [row] = await tx
        .insert(rateCards)
        .values({ id, tenantId, ...ratesOf(rates), effectiveFrom: at, createdBy })
        .returning();
      if (!row) throw new AppError("internal", "rate card version not written");
      await audit.within(tx).record({
        tenantId,
        actor: createdBy,
        action: "rate_card.create",
        target: id,
        requestId: opts.requestId ?? null,
        detail: { effectiveFrom: at.toISOString(), ...ratesOf(rates) },
      });
    });
  } catch (err) {
    if (sqlState(err) === "23505" || sqlState((err as { cause?: unknown }).cause) === "23505") throw sameInstant(at);
    throw err;
  }
  const [row] = await db.select().from(rateCards).where(eq(rateCards.id, id));
  if (!row) throw new AppError("internal", "rate card version vanished");
  return cardOf(row);
}

const sameInstant = (at: Date) =>
  new AppError("conflict", `this card already has a version from ${at.toISOString()} (versions are never changed: add one at another instant)`);

/**
 * Final invoices never change: a tenant's version may not start inside or before the period of one of its final
 * invoices. A default-card version prices every tenant without a version of its own at that instant, so it is refused
 * when it would price a part of a final invoice of such a tenant (one that ends after it, while the default card still
 * applies to that tenant: before its first own version).
 */
async function assertNoFinalInvoiceAffected(db: Db, tenantId: string | null, effectiveFrom: number): Promise<void> {
  const at = new Date(effectiveFrom);
  if (tenantId !== null) {
    const [hit] = await db
      .select({ month: invoices.month })
      .from(invoices)
      .where(and(eq(invoices.tenantId, tenantId), eq(invoices.status, "final"), gt(invoices.periodEnd, at)))
      .orderBy(sql`${invoices.periodEnd} DESC`)
      .limit(1);
    if (hit)
      throw new AppError("conflict", `the invoice of ${hit.month} is final: a version may start only after its period ends (final invoices never change)`);
    return;
  }
  const [hit] = await db
    .select({ tenantId: invoices.tenantId, month: invoices.month })
    .from(invoices)
    .where(
      and(
        eq(invoices.status, "final"),
        gt(invoices.periodEnd, at),
        // the default card prices the tenant on [at, its first own version) ∩ the invoice's period
        sql`greatest(${invoices.periodStart}, ${at.toISOString()}::timestamptz) < coalesce((select min(r.effective_from) from rate_cards r where r.tenant_id = ${invoices.tenantId}), 'infinity'::timestamptz)`,
      ),
    )
    .limit(1);
  if (hit)
    throw new AppError(
      "conflict",
      `the invoice of ${hit.month} of tenant ${hit.tenantId} is final and priced by the default card: a default version may start only after its period ends`,
    );
}

/**
 * One invoice, one currency. A version whose currency differs from the card in effect just before it, or from the
 * tenant's next version, must start at the first instant of a month in the tenant's time zone (then no invoice mixes
 * currencies). The default card's currency never changes (it prices tenants in every zone at once).
 */
async function assertOneCurrencyPerMonth(db: Db, tenantId: string | null, zone: string, currency: string, effectiveFrom: number): Promise<void> {
  const v = await versionsFor(db, tenantId);
  const before = effectiveFrom > 0 ? cardAt(v, effectiveFrom - 1) : undefined;
  const next = (tenantId === null ? v.defaults : v.own).find((c) => c.effectiveFrom > effectiveFrom);
  // each change of currency, the one this version makes and the one its successor then makes, at a month's start
  const changes = [
    ...(before && before.currency !== currency ? [{ at: effectiveFrom, from: before.currency, to: currency }] : []),
    ...(next && next.currency !== currency ? [{ at: next.effectiveFrom, from: currency, to: next.currency }] : []),
  ];
  const first = changes[0];
  if (!first) return;
  if (tenantId === null)
    throw new AppError(
      "conflict",
      `the default card is priced in ${first.from === currency ? first.to : first.from}: its versions keep that currency (set a tenant's card for another one)`,
    );
  for (const change of changes) {
    const month = monthRange(zone, monthOf(zone, change.at));
    if (month.start === change.at) continue;
    throw new AppError(
      "conflict",
      `a change of currency (${change.from} → ${change.to}) at ${new Date(change.at).toISOString()} would mix currencies in one invoice: it must start at a month's first instant in the tenant's zone ${zone} (the next is ${new Date(month.end).toISOString()})`,
    );
  }
}

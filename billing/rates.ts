// Rate cards in the database: the default card (seeded at first use) and per-tenant overrides.
import { eq, isNull, or } from "drizzle-orm";
import { AppError } from "../lib/errors.ts";
import { newId } from "../lib/ids.ts";
import type { Db } from "../schema/db.ts";
import { rateCards } from "../schema/billing.ts";
import { defaultRates, type Rates } from "./money.ts";

export const defaultRateCardId = "rc_default";

export interface RateCard extends Rates {
  id: string;
  /** null for the default card. */
  tenantId: string | null;
}

/** Inserts the default card unless one exists (concurrent callers are fine). */
export async function ensureDefaultRateCard(db: Db): Promise<void> {
  await db
    .insert(rateCards)
    .values({ id: defaultRateCardId, tenantId: null, ...defaultRates })
    .onConflictDoNothing();
}

/** The tenant's own card, else the default one. */
export async function rateCardFor(db: Db, tenantId: string): Promise<RateCard> {
  let rows = await db.select().from(rateCards).where(or(eq(rateCards.tenantId, tenantId), eq(rateCards.id, defaultRateCardId)));
  if (!rows.some((r) => r.id === defaultRateCardId)) {
    await ensureDefaultRateCard(db);
    rows = await db.select().from(rateCards).where(or(eq(rateCards.tenantId, tenantId), isNull(rateCards.tenantId)));
  }
  const row = rows.find((r) => r.tenantId === tenantId) ?? rows.find((r) => r.id === defaultRateCardId);
  if (!row) throw new AppError("internal", "no default rate card");
  return {
    id: row.id,
    tenantId: row.tenantId,
    currency: row.currency,
    vcpuSecondNanocents: row.vcpuSecondNanocents,
    gibSecondNanocents: row.gibSecondNanocents,
    snapshotGibMonthNanocents: row.snapshotGibMonthNanocents,
  };
}

/** Sets a tenant's prices (draft invoices pick them up at once; final invoices keep the prices they were issued with). */
export async function setTenantRates(db: Db, tenantId: string, rates: Rates): Promise<RateCard> {
  for (const [k, v] of Object.entries(rates)) if (k !== "currency" && (!Number.isSafeInteger(v) || (v as number) < 0)) throw new AppError("bad_request", `${k} must be a non-negative integer (nano-cents)`);
  const id = newId("rateCard");
  await db
    .insert(rateCards)
    .values({ id, tenantId, ...rates })
    .onConflictDoUpdate({ target: rateCards.tenantId, set: { ...rates, updatedAt: new Date() } });
  return rateCardFor(db, tenantId);
}

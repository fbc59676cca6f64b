// Usage, runs and invoices as the API answers them: JSON in the schemas of billing/api-schemas.ts, or CSV.
import { wakeTimingKeys } from "../contracts/agent.ts";
import type { z } from "../lib/api.ts";
import type { Invoice as InvoiceSchema, RateCardVersion as RateCardVersionSchema, Run as RunSchema, Usage as UsageSchema } from "./api-schemas.ts";
import { toCsv } from "./csv.ts";
import type { Invoice } from "./invoices.ts";
import { formatCents } from "./money.ts";
import { ratesOf, type RateCard } from "./rates.ts";
import type { RunReport } from "./runs.ts";
import type { UsageReport } from "./usage.ts";
import { formatInZone } from "./zones.ts";

/** Formats instants in a zone, once per distinct instant (rows share their window boundaries; Intl is slow). */
function zoneFormatter(zone: string): (t: number) => string {
  const memo = new Map<number, string>();
  return (t) => {
    let s = memo.get(t);
    if (s === undefined) memo.set(t, (s = formatInZone(zone, t)));
    return s;
  };
}

export function usageJson(r: UsageReport, names: string[]): z.infer<typeof UsageSchema> {
  const zone = r.query.zone;
  const fmt = zoneFormatter(zone);
  return {
    tenantId: r.query.tenantId,
    from: formatInZone(zone, r.query.from),
    to: formatInZone(zone, r.query.to),
    timeZone: zone,
    groupBy: names,
    ...(r.query.agentId !== undefined ? { agentId: r.query.agentId } : {}),
    source: r.source,
    rows: r.rows.map((row) =>
      row.agentId === undefined
        ? { start: fmt(row.start), end: fmt(row.end), activeMs: row.activeMs, vcpuMs: row.vcpuMs, mibMs: row.mibMs }
        : { start: fmt(row.start), end: fmt(row.end), agentId: row.agentId, activeMs: row.activeMs, vcpuMs: row.vcpuMs, mibMs: row.mibMs },
    ),
    totals: r.totals,
  };
}

export function usageCsv(r: UsageReport): string {
  const fmt = zoneFormatter(r.query.zone);
  const byAgent = r.query.byAgent;
  const header = ["window_start", "window_end", ...(byAgent ? ["agent_id"] : []), "active_ms", "vcpu_ms", "mib_ms"];
  return toCsv(
    header,
    r.rows.map((row) => [fmt(row.start), fmt(row.end), ...(byAgent ? [row.agentId] : []), row.activeMs, row.vcpuMs, row.mibMs]),
  );
}

export function invoiceJson(inv: Invoice): z.infer<typeof InvoiceSchema> {
  const zone = inv.timeZone;
  return {
    id: inv.id,
    tenantId: inv.tenantId,
    month: inv.month,
    timeZone: zone,
    periodStart: formatInZone(zone, inv.periodStart),
    periodEnd: formatInZone(zone, inv.periodEnd),
    status: inv.status,
    cutoffAt: new Date(inv.cutoffAt).toISOString(),
    finalizableAt: new Date(inv.finalizableAt).toISOString(),
    currency: inv.currency,
    rates: inv.rates,
    rateCards: inv.rateCards.map((c) => ({ id: c.id, tenantId: c.tenantId, effectiveFrom: new Date(c.effectiveFrom).toISOString(), from: formatInZone(zone, c.from), to: formatInZone(zone, c.to), ...ratesOf(c) })),
    lines: inv.lines,
    totalCents: inv.totalCents,
    total: formatCents(inv.totalCents),
  };
}

export function invoiceCsv(inv: Invoice): string {
  return toCsv(
    ["invoice_id", "month", "status", "agent_id", "resource", "quantity", "unit", "unit_price_nanocents", "price_unit", "amount_cents", "rate_card_id"],
    [
      ...inv.lines.map((l) => [inv.id, inv.month, inv.status, l.agentId, l.resource, l.quantity, l.unit, l.unitPriceNanocents, l.priceUnit, l.amountCents, l.rateCardId ?? ""]),
      [inv.id, inv.month, inv.status, "", "total", "", "", "", "", inv.totalCents, ""],
    ],
  );
}

export function runJson(r: RunReport): z.infer<typeof RunSchema> {
  return {
    runId: r.runId,
    hostId: r.hostId,
    vmId: r.vmId,
    wokeAt: new Date(r.wokeAt).toISOString(),
    wakeReason: r.wakeReason,
    wakeMode: r.wakeMode,
    timings: r.timings,
    sleptAt: r.sleptAt === undefined ? null : new Date(r.sleptAt).toISOString(),
    sleepReason: r.sleepReason ?? null,
    awakeMs: r.sleptAt === undefined ? null : r.sleptAt - r.wokeAt,
    activeMs: r.activeMs,
    vcpuMs: r.vcpuMs,
    mibMs: r.mibMs,
    segments: r.segments,
  };
}

/** CSV columns of a run's wake timings: every key of the contract, in its order, in snake case. */
const timingColumns = wakeTimingKeys.map((t) => t.replace(/[A-Z]/g, (m) => `_${m.toLowerCase()}`));

export function runsCsv(runs: RunReport[]): string {
  return toCsv(
    ["run_id", "woke_at", "wake_reason", "wake_mode", ...timingColumns, "slept_at", "sleep_reason", "active_ms", "vcpu_ms", "mib_ms", "segments"],
    runs.map((r) => [
      r.runId,
      new Date(r.wokeAt).toISOString(),
      r.wakeReason,
      r.wakeMode,
      ...wakeTimingKeys.map((t) => r.timings[t]),
      r.sleptAt === undefined ? "" : new Date(r.sleptAt).toISOString(),
      r.sleepReason ?? "",
      r.activeMs,
      r.vcpuMs,
      r.mibMs,
      r.segments,
    ]),
  );
}

export function invoiceListCsv(list: { id: string; month: string; status: string; totalCents: number | null; currency: string }[]): string {
  return toCsv(["invoice_id", "month", "status", "total_cents", "currency"], list.map((i) => [i.id, i.month, i.status, i.totalCents, i.currency]));
}

export function rateCardVersionJson(c: RateCard): z.infer<typeof RateCardVersionSchema> {
  return {
    id: c.id,
    tenantId: c.tenantId,
    ...ratesOf(c),
    effectiveFrom: new Date(c.effectiveFrom).toISOString(),
    createdAt: new Date(c.createdAt).toISOString(),
    createdBy: c.createdBy,
  };
}

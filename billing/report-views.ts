// Usage, runs and invoices as the API answers them: JSON in the schemas of billing/api-schemas.ts, or CSV.
import { wakeTimingKeys } from "../contracts/agent.ts";
import type { z } from "../lib/api.ts";
import type { Invoice as InvoiceSchema, RateCardVersion as RateCardVersionSchema, Run as RunSchema, Usage as UsageSchema } from "./api-schemas.ts";
import { toCsv, type Cell } from "./csv.ts";
import type { Invoice } from "./invoices.ts";
import { formatCents } from "./money.ts";
import { ratesOf, type RateCard } from "./rates.ts";
import type { RunReport } from "./runs.ts";
import { sumsAt, type UsageTable } from "./usage.ts";
import { formatInZone } from "./zones.ts";

/**
 * Instants formatted in a zone, kept across requests (bounded): reports share their window boundaries, the zone
 * database does not change while the process runs, and Intl is slow (a month's days cost about a millisecond).
 */
const formatted = new Map<string, string>();
const formattedSize = 8192;

function zoneFormatter(zone: string): (t: number) => string {
  const memo = new Map<number, string>(); // this answer's instants: rows share them
  return (t) => {
    let s = memo.get(t);
    if (s !== undefined) return s;
    const key = `${zone} ${t}`;
    s = formatted.get(key);
    if (s === undefined) {
      if (formatted.size >= formattedSize) formatted.clear();
      formatted.set(key, (s = formatInZone(zone, t)));
    }
    memo.set(t, s);
    return s;
  };
}

/** The answer's fields before its rows, in the schema's order. */
function usageHead(t: UsageTable, names: string[]) {
  const zone = t.query.zone;
  return {
    tenantId: t.query.tenantId,
    from: formatInZone(zone, t.query.from),
    to: formatInZone(zone, t.query.to),
    timeZone: zone,
    groupBy: names,
    ...(t.query.agentId !== undefined ? { agentId: t.query.agentId } : {}),
    source: t.source,
  };
}

/** The usage answer as an object of the schema (`usageJsonBytes` writes the same JSON without one per row). */
export function usageJson(t: UsageTable, names: string[]): z.infer<typeof UsageSchema> {
  const fmt = zoneFormatter(t.query.zone);
  const c = t.columns;
  const rows: z.infer<typeof UsageSchema>["rows"] = [];
  for (let i = 0; i < c.length; i++) {
    const w = c.window[i] as number;
    const start = fmt(t.boundaries[w] as number);
    const end = fmt(t.boundaries[w + 1] as number);
    const sums = sumsAt(c, i);
    if (c.agents && c.agent) {
      const agentId = c.agents[c.agent[i] as number] as string;
      const poolId = t.agentPools?.get(agentId);
      rows.push(poolId !== undefined ? { start, end, agentId, poolId, ...sums } : { start, end, agentId, ...sums });
    } else rows.push({ start, end, ...sums });
  }
  return { ...usageHead(t, names), rows, totals: t.totals };
}

const utf8 = new TextEncoder();

/** `s` as UTF-8: by hand when it is ASCII (short pieces, where TextEncoder's call costs more than the copy). */
function encode(s: string): Uint8Array {
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) {
    const ch = s.charCodeAt(i);
    if (ch > 0x7f) return utf8.encode(s);
    out[i] = ch;
  }
  return out;
}

/** Copies `b` into `buf` at `at`; answers the position after it. */
function put(buf: Uint8Array, at: number, b: Uint8Array): number {
  if (b.length > 16) buf.set(b, at);
  else for (let i = 0; i < b.length; i++) buf[at + i] = b[i] as number; // TypedArray.set costs more for short pieces
  return at + b.length;
}

/** `v` (0 ≤ v < 10^8) in at least `width` digits at `at`; answers the position after it. */
function putDigits(buf: Uint8Array, at: number, v: number, width: number): number {
  // an int32 first: the sums come from a Float64Array, and % on a double is a call to fmod
  let x = v | 0;
  let n = 1;
  for (let y = x; y >= 10; y = (y / 10) | 0) n++;
  if (n < width) n = width;
  const end = at + n;
  for (let i = end - 1; i >= at; i--) {
    const q = (x / 10) | 0;
    buf[i] = 48 + x - q * 10;
    x = q;
  }
  return end;
}

/** An integer below 2^53 (the sums) at `at`, as JSON and String() write it (at most 17 bytes); answers the position after it. */
function putInt(buf: Uint8Array, at: number, v: number): number {
  if (v < 0) {
    buf[at++] = 45;
    v = -v;
  }
  if (v < 1e8) return putDigits(buf, at, v, 1);
  let hi = Math.floor(v / 1e8);
  let lo = v - hi * 1e8;
  if (lo < 0) {
    // v / 1e8 was rounded up to the next integer
    hi -= 1;
    lo += 1e8;
  }
  return putDigits(buf, putDigits(buf, at, hi, 1), lo, 8);
}

/** The keys of a row's sums after the first (`activeMs`, written with the agent), in the order `sumsAt` gives them. */
const laterKeys = ["vcpuMs", "mibMs", "dozedMs", "dozedVcpuMs", "dozedMibMs", "hibernatedMs"].map((k) => encode(`,"${k}":`));
const laterKeysLength = laterKeys.reduce((n, k) => n + k.length, 0);

/**
 * The usage answer as UTF-8 JSON, byte for byte what `JSON.stringify(usageJson(t, names))` gives, written straight
 * from the columns: a month by agent and day is ~7,000 rows per tenant, and an object per row serialized by
 * `c.json` was most of the report's time in the billing process. Each window's start and end, and each agent, are
 * encoded once and copied into their rows.
 */
export function usageJsonBytes(t: UsageTable, names: string[]): Uint8Array<ArrayBuffer> {
  const fmt = zoneFormatter(t.query.zone);
  const c = t.columns;
  const head = encode(`${JSON.stringify(usageHead(t, names)).slice(0, -1)},"rows":[`);
  const tail = encode(`],"totals":${JSON.stringify(t.totals)}}`);
  // each agent's key and value with the key after it, so that a row is two copies, then the numbers and their keys
  const agentKeys = c.agents?.map((id) => {
    const poolId = t.agentPools?.get(id);
    return encode(`"agentId":${JSON.stringify(id)},${poolId !== undefined ? `"poolId":${JSON.stringify(poolId)},` : ""}"activeMs":`);
  });
  const noAgent = encode('"activeMs":');
  const prefix: Uint8Array[] = [];
  let buf = new Uint8Array(head.length + tail.length + c.length * 220);
  const later = [c.vcpuMs, c.mibMs, c.dozedMs, c.dozedVcpuMs, c.dozedMibMs, c.hibernatedMs];
  let at = put(buf, 0, head);
  for (let i = 0; i < c.length; i++) {
    const w = c.window[i] as number;
    let p = prefix[w];
    if (p === undefined)
      p = prefix[w] = encode(`{"start":${JSON.stringify(fmt(t.boundaries[w] as number))},"end":${JSON.stringify(fmt(t.boundaries[w + 1] as number))},`);
    const a = agentKeys && c.agent ? (agentKeys[c.agent[i] as number] as Uint8Array) : noAgent;
    const most = 1 + p.length + a.length + laterKeysLength + (1 + later.length) * 17 + 1;
    if (at + most > buf.length) {
      const bigger = new Uint8Array(Math.max(buf.length * 2, at + most + tail.length));
      bigger.set(buf.subarray(0, at));
      buf = bigger;
    }
    if (i > 0) buf[at++] = 44;
    at = put(buf, at, p);
    at = put(buf, at, a);
    at = putInt(buf, at, c.activeMs[i] as number);
    for (let k = 0; k < later.length; k++) {
      at = put(buf, at, laterKeys[k] as Uint8Array);
      at = putInt(buf, at, (later[k] as Float64Array)[i] as number);
    }
    buf[at++] = 125;
  }
  if (at + tail.length > buf.length) {
    const bigger = new Uint8Array(at + tail.length);
    bigger.set(buf.subarray(0, at));
    buf = bigger;
  }
  at = put(buf, at, tail);
  return buf.subarray(0, at);
}

export function usageCsv(t: UsageTable): string {
  const fmt = zoneFormatter(t.query.zone);
  const c = t.columns;
  const header = [
    "window_start",
    "window_end",
    ...(c.agents ? ["agent_id"] : []),
    "active_ms",
    "vcpu_ms",
    "mib_ms",
    "dozed_ms",
    "dozed_vcpu_ms",
    "dozed_mib_ms",
    "hibernated_ms",
    // by agent: the warm pool the agent belongs to (empty for none), last so the columns before it keep their places
    ...(c.agents ? ["pool_id"] : []),
  ];
  const rows: Cell[][] = [];
  for (let i = 0; i < c.length; i++) {
    const w = c.window[i] as number;
    const start = fmt(t.boundaries[w] as number);
    const end = fmt(t.boundaries[w + 1] as number);
    const sums = [c.activeMs[i], c.vcpuMs[i], c.mibMs[i], c.dozedMs[i], c.dozedVcpuMs[i], c.dozedMibMs[i], c.hibernatedMs[i]];
    if (c.agents && c.agent) {
      const agentId = c.agents[c.agent[i] as number] as string;
      rows.push([start, end, agentId, ...sums, t.agentPools?.get(agentId) ?? ""]);
    } else rows.push([start, end, ...sums]);
  }
  return toCsv(header, rows);
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
    rateCards: inv.rateCards.map((c) => ({
      id: c.id,
      tenantId: c.tenantId,
      effectiveFrom: new Date(c.effectiveFrom).toISOString(),
      from: formatInZone(zone, c.from),
      to: formatInZone(zone, c.to),
      ...ratesOf(c),
    })),
    lines: inv.lines,
    time: inv.time,
    totalCents: inv.totalCents,
    total: formatCents(inv.totalCents),
    metering: inv.metering,
  };
}

export function invoiceCsv(inv: Invoice): string {
  return toCsv(
    ["invoice_id", "month", "status", "agent_id", "resource", "quantity", "unit", "unit_price_nanocents", "price_unit", "amount_cents", "rate_card_id"],
    [
      ...inv.lines.map((l) => [
        inv.id,
        inv.month,
        inv.status,
        l.agentId,
        l.resource,
        l.quantity,
        l.unit,
        l.unitPriceNanocents,
        l.priceUnit,
        l.amountCents,
        l.rateCardId ?? "",
      ]),
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
    dozedMs: r.dozedMs,
    dozedVcpuMs: r.dozedVcpuMs,
    dozedMibMs: r.dozedMibMs,
    segments: r.segments,
    overlapMs: r.overlapMs,
    operations: r.operations,
    upstreamWaitMs: r.upstreamWaitMs,
    inputTokens: r.inputTokens,
    outputTokens: r.outputTokens,
    viewerMs: r.viewerMs,
    controlMs: r.controlMs,
  };
}

/** CSV columns of a run's wake timings: every key of the contract, in its order, in snake case. */
const timingColumns = wakeTimingKeys.map((t) => t.replace(/[A-Z]/g, (m) => `_${m.toLowerCase()}`));

export function runsCsv(runs: RunReport[]): string {
  return toCsv(
    [
      "run_id",
      "woke_at",
      "wake_reason",
      "wake_mode",
      ...timingColumns,
      "slept_at",
      "sleep_reason",
      "active_ms",
      "vcpu_ms",
      "mib_ms",
      "dozed_ms",
      "dozed_vcpu_ms",
      "dozed_mib_ms",
      "segments",
      "operations",
      "upstream_wait_ms",
      "input_tokens",
      "output_tokens",
      "viewer_ms",
      "control_ms",
      // last: a column added after the others keeps every earlier one where a reader expects it
      "overlap_ms",
    ],
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
      r.dozedMs,
      r.dozedVcpuMs,
      r.dozedMibMs,
      r.segments,
      r.operations,
      r.upstreamWaitMs,
      r.inputTokens,
      r.outputTokens,
      r.viewerMs,
      r.controlMs,
      r.overlapMs,
    ]),
  );
}

export function invoiceListCsv(list: { id: string; month: string; status: string; totalCents: number | null; currency: string }[]): string {
  return toCsv(
    ["invoice_id", "month", "status", "total_cents", "currency"],
    list.map((i) => [i.id, i.month, i.status, i.totalCents, i.currency]),
  );
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

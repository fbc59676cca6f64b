// Money on the page in integers only: cents as the API gives them, and the estimated cost of usage at a rate card in
// micro-units of the currency (10⁻⁶ of a dollar), computed with BigInt from the card's integer nano-cent prices.

/** One micro-unit (10⁻⁶ of the currency) is 10⁵ nano-cents. */
const nanocentsPerMicro = 100_000n;
/** Memory is priced per GiB-second and metered in MiB-ms: 1024 × 1000 of them make one. */
const mibMsPerGibSecond = 1_024_000n;

/** ⌊num / den + ½⌋ for num ≥ 0. */
function roundHalfUp(num: bigint, den: bigint): bigint {
  return (2n * num + den) / (2n * den);
}

/** A metered quantity (whole ms) as BigInt; a fraction, which the API never sends, is cut. */
function whole(n: number): bigint {
  return BigInt(Math.max(0, Math.trunc(n)));
}

/** Seconds in the month snapshot storage is priced per (730 h): dozing memory without a price of its own costs the snapshot rate. */
const storageMonthSeconds = 2_628_000n;

/**
 * What `usage` costs at `rates`, in micro-units of the currency, rounded once, half up: active vCPUs and memory, dozing
 * vCPUs (at the card's doze vCPU-second price, 0 by default) and dozing memory (at the card's doze GiB-second price, or
 * null: its snapshot GiB-month rate), as the invoice's lines price them.
 */
export function costMicros(
  usage: { vcpuMs: number; mibMs: number; dozedVcpuMs?: number; dozedMibMs?: number },
  rates: {
    vcpuSecondNanocents: number;
    gibSecondNanocents: number;
    snapshotGibMonthNanocents?: number;
    dozeVcpuSecondNanocents?: number;
    dozeGibSecondNanocents?: number | null;
  },
): bigint {
  // in nano-cents × 1,024,000 × 2,628,000: vCPU-ms × (price per vCPU-second ÷ 1000) + MiB-ms × (price per GiB-second ÷
  // 1,024,000) + dozing MiB-ms × (price per GiB-second ÷ 1,024,000, or per GiB-month ÷ 1,024,000 × 2,628,000)
  const active =
    whole(usage.vcpuMs) * BigInt(rates.vcpuSecondNanocents) * 1024n +
    whole(usage.dozedVcpuMs ?? 0) * BigInt(rates.dozeVcpuSecondNanocents ?? 0) * 1024n +
    whole(usage.mibMs) * BigInt(rates.gibSecondNanocents);
  const dozedMibMs = whole(usage.dozedMibMs ?? 0);
  const dozing =
    rates.dozeGibSecondNanocents === null || rates.dozeGibSecondNanocents === undefined
      ? dozedMibMs * BigInt(rates.snapshotGibMonthNanocents ?? 0)
      : dozedMibMs * BigInt(rates.dozeGibSecondNanocents) * storageMonthSeconds;
  return roundHalfUp(active * storageMonthSeconds + dozing, mibMsPerGibSecond * storageMonthSeconds * nanocentsPerMicro);
}

/** Micro-units as a decimal: `1234567n` → `"1.234567"`, trailing zeros cut down to two decimals (`"0.50"`). */
export function formatMicros(micros: bigint): string {
  const sign = micros < 0n ? "-" : "";
  const abs = micros < 0n ? -micros : micros;
  const frac = String(abs % 1_000_000n)
    .padStart(6, "0")
    .replace(/0{1,4}$/, "");
  return `${sign}${abs / 1_000_000n}.${frac.padEnd(2, "0")}`;
}

/** Cents as a decimal: `12345` → `"123.45"`. */
export function formatCents(cents: number | bigint): string {
  const c = typeof cents === "bigint" ? cents : BigInt(Math.trunc(cents));
  const sign = c < 0n ? "-" : "";
  const abs = c < 0n ? -c : c;
  return `${sign}${abs / 100n}.${String(abs % 100n).padStart(2, "0")}`;
}

/** A decimal string of an integer with thousands separators: `"1234567"` → `"1,234,567"`. */
export function groupDigits(decimal: string): string {
  return /^\d+$/.test(decimal) ? decimal.replace(/\B(?=(\d{3})+(?!\d))/g, ",") : decimal;
}

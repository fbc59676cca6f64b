// Integer money: prices in nano-cents per unit, quantities in base units, one half-up rounding to the cent per invoice line.

export type Resource = "vcpu" | "memory" | "doze_vcpu" | "doze_memory" | "snapshot_storage";
/** In the order an agent's lines are listed. */
export const resources: readonly Resource[] = ["vcpu", "memory", "doze_vcpu", "doze_memory", "snapshot_storage"];

/** Prices in nano-cents (10⁻⁹ cent) per priced unit; the invoice's currency minor unit is the cent. */
export interface Rates {
  currency: string;
  /** Per vCPU-second while active. */
  vcpuSecondNanocents: number;
  /** Per GiB-second of configured memory while active. */
  gibSecondNanocents: number;
  /** Per GiB-month of snapshot held while hibernated (a month is 730 hours). */
  snapshotGibMonthNanocents: number;
  /** Per vCPU-second while dozing (vCPUs stopped while every open call waits on an outbound call); 0 by default. */
  dozeVcpuSecondNanocents: number;
  /** Per GiB-second of configured memory while dozing; null: the snapshot's rate (`snapshotGibMonthNanocents` per 730 h). */
  dozeGibSecondNanocents: number | null;
}

/** Prices as a caller may give them: without the doze prices, which then take their defaults (see `ratesOf`). */
export type RatesInput = Omit<Rates, "dozeVcpuSecondNanocents" | "dozeGibSecondNanocents"> &
  Partial<Pick<Rates, "dozeVcpuSecondNanocents" | "dozeGibSecondNanocents">>;

/** The default card: $0.036 per vCPU-hour, $0.0036 per GiB-hour, $0.10 per GiB-month of snapshot. */
export const defaultRates: Rates = {
  currency: "USD",
  vcpuSecondNanocents: 1_000_000,
  gibSecondNanocents: 100_000,
  snapshotGibMonthNanocents: 10_000_000_000,
  dozeVcpuSecondNanocents: 0,
  dozeGibSecondNanocents: null,
};

export const nanocentsPerCent = 1_000_000_000n;
/** A storage month: 730 hours (365 × 24 / 12), the same for every calendar month. */
export const storageMonthMs = 730n * 3_600_000n;
/** Seconds in a storage month: a price per GiB-second times this is the same price per GiB-month, exactly. */
export const storageMonthSeconds = Number(storageMonthMs / 1000n);
/** The largest doze memory price per GiB-second whose GiB-month price (what its invoice line shows) is a safe integer. */
export const maxDozeGibSecondNanocents = Math.floor(Number.MAX_SAFE_INTEGER / storageMonthSeconds);

/** Base unit a quantity is measured in, the unit a price is quoted per, and how many base units make one priced unit. */
export const resourceUnits: Record<Resource, { unit: string; priceUnit: string; perPriceUnit: bigint }> = {
  vcpu: { unit: "vCPU-ms", priceUnit: "vCPU-second", perPriceUnit: 1000n },
  memory: { unit: "MiB-ms", priceUnit: "GiB-second", perPriceUnit: 1024n * 1000n },
  doze_vcpu: { unit: "vCPU-ms", priceUnit: "vCPU-second", perPriceUnit: 1000n },
  // quoted per GiB-month, like the snapshot whose rate it takes by default (a GiB-second price converts exactly)
  doze_memory: { unit: "MiB-ms", priceUnit: "GiB-month", perPriceUnit: 1024n * storageMonthMs },
  snapshot_storage: { unit: "byte-ms", priceUnit: "GiB-month", perPriceUnit: 1024n ** 3n * storageMonthMs },
};

/** The price of one `resourceUnits[resource].priceUnit` of `resource` on card `rates`, in nano-cents. */
export function priceOf(rates: Rates, resource: Resource): number {
  switch (resource) {
    case "vcpu":
      return rates.vcpuSecondNanocents;
    case "memory":
      return rates.gibSecondNanocents;
    case "doze_vcpu":
      return rates.dozeVcpuSecondNanocents;
    case "doze_memory":
      return dozeGibMonthNanocents(rates);
    case "snapshot_storage":
      return rates.snapshotGibMonthNanocents;
  }
}

/** Dozing memory per GiB-month: the card's per-GiB-second price × the seconds of a storage month, or the snapshot's rate. */
export function dozeGibMonthNanocents(rates: Pick<Rates, "dozeGibSecondNanocents" | "snapshotGibMonthNanocents">): number {
  return rates.dozeGibSecondNanocents === null ? rates.snapshotGibMonthNanocents : rates.dozeGibSecondNanocents * storageMonthSeconds;
}

/** ⌊num / den + ½⌋ for num ≥ 0: halves round up. */
export function roundHalfUp(num: bigint, den: bigint): bigint {
  if (num < 0n || den <= 0n) throw new RangeError("roundHalfUp takes a non-negative numerator and a positive denominator");
  return (2n * num + den) / (2n * den);
}

/** quantity (base units) × price (nano-cents per priced unit), in cents, rounded once, half up. */
export function lineAmountCents(resource: Resource, quantity: bigint, priceNanocents: number): bigint {
  const { perPriceUnit } = resourceUnits[resource];
  return roundHalfUp(quantity * BigInt(priceNanocents), perPriceUnit * nanocentsPerCent);
}

/** `12345` cents → `"123.45"`. */
export function formatCents(cents: bigint | number): string {
  const c = BigInt(cents);
  const sign = c < 0n ? "-" : "";
  const abs = c < 0n ? -c : c;
  return `${sign}${abs / 100n}.${String(abs % 100n).padStart(2, "0")}`;
}

// Parsers of option values shared by the command groups: a bad value is commander's usage error (exit 2).
import { InvalidArgumentError } from "commander";
import { CliError } from "./exit.ts";
import { parseDuration } from "./duration.ts";

/** An integer option from `min` to `max`. */
export function integer(min: number, max: number): (raw: string) => number {
  return (raw) => {
    const n = /^-?\d+$/.test(raw.trim()) ? Number(raw) : NaN;
    if (!(n >= min && n <= max)) throw new InvalidArgumentError(`must be an integer from ${min} to ${max}`);
    return n;
  };
}

/** A duration option (`30s`, `5m`, `1h`; bare numbers are seconds), in ms. */
export function duration(raw: string): number {
  try {
    return parseDuration(raw, "duration");
  } catch (err) {
    if (err instanceof CliError) throw new InvalidArgumentError("must be a duration like 30s, 5m, 1h30m or 250ms");
    throw err;
  }
}

/** A comma list option: `agent,day` → ["agent", "day"]. */
export function list(raw: string): string[] {
  return raw
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
}

// Parameter values meant to hurt: malformed numbers, instants, months, cursors, zones, encodings and very long text.
import type { Param } from "./document.ts";

export const hugeText = (n: number) => "a".repeat(n);

export const nastyCommon = [
  "",
  "%00",
  "..",
  ".",
  "%2e%2e",
  "%2F",
  "%zz",
  "%E0%A4%A",
  "%C0%AE",
  "%F0%9F%98%80",
  encodeURIComponent("ü😀\u202e"),
  encodeURIComponent("'; select pg_sleep(1); --"),
  encodeURIComponent("../../etc/passwd"),
  encodeURIComponent('{"a":1}'),
  "null",
  "true",
];
const nastyNumbers = [
  "-1",
  "0",
  "1.5",
  "1e3",
  "1e309",
  "99999999999999999999999",
  "-99999999999999999999",
  "NaN",
  "Infinity",
  "0x10",
  "%201",
  "abc",
  "1001",
  "2147483648",
];
const nastyInstants = [
  "0000-01-01",
  "0000-01-01T00:00:00Z",
  "99999-01-01",
  "+099999-01-01T00:00:00Z",
  "-000001-01-01T00:00:00Z",
  "1969-12-31T23:59:59Z",
  "1900-01-01",
  "2026-02-30",
  "2026-13-01",
  "2026-03-01T25:00:00Z",
  "2026-03-01T00:00:00%2B25:00",
  "9999-12-31T23:59:59.999Z",
  "10000-01-01",
  "294277-01-01T00:00:00Z",
  "1970-01-01",
  "2026-03-01T00:00:00",
  "2026-03-01T00:00:00.1234567890Z",
  "2026-W10",
  "now",
];
export const nastyMonths = ["0000-01", "99999-12", "2026-00", "2026-13", "2026-3", "1969-12", "9999-12", "2026-03-01"];
const b64url = (s: string) => Buffer.from(s).toString("base64url");
const nastyCursors = [
  "x",
  "!!!!",
  b64url("[]"),
  b64url('["a"]'),
  b64url("[1e999]"),
  b64url('["a",1]'),
  b64url('[1,"a"]'),
  b64url('{"a":1}'),
  b64url("null"),
  b64url('["2026-01-01T00:00:00Z","x"]'),
  hugeText(1024),
  hugeText(1025),
];
const nastyZones = ["Mars/Olympus", "UTC", "Europe/Berlin", "%2B25:00", "Etc/GMT%2B14", encodeURIComponent("../../../etc/localtime"), hugeText(300)];

/** Long values: a query string past the head limit is a 431 from the parser, one below it reaches the route. */
export const longValues = [hugeText(5000), hugeText(20_000)];

export function nastyFor(param: Param): string[] {
  const s = param.schema;
  const name = param.name.toLowerCase();
  const out = [...nastyCommon];
  if (s.type === "integer" || s.type === "number" || /limit|tail/.test(name)) out.push(...nastyNumbers);
  if (s.format === "date-time" || /from|to|until|since|at$|before|after/.test(name)) out.push(...nastyInstants);
  if (/month/.test(name)) out.push(...nastyMonths);
  if (/cursor/.test(name)) out.push(...nastyCursors);
  if (/tz|zone/.test(name)) out.push(...nastyZones);
  return out;
}

// Prefixed, URL-safe ids (`agt_…`, `vm_…`, `req_…`) so an id says what it names wherever it shows up.
import { customAlphabet } from "nanoid";

const alphabet = "0123456789abcdefghijklmnopqrstuvwxyz";
const random = customAlphabet(alphabet, 16);

export const idPrefixes = {
  tenant: "ten",
  agent: "agt",
  vm: "vm",
  run: "run",
  request: "req",
  host: "host",
  webhook: "whe",
  delivery: "dlv",
  attempt: "att",
  invoice: "inv",
  rateCard: "rc",
  event: "evt",
  lease: "lse",
  image: "img",
  build: "bld",
  checkpoint: "ckp",
  upstream: "ups",
  operation: "op",
  pool: "pol",
  desktopSession: "dsk",
} as const;

export type IdKind = keyof typeof idPrefixes;

export function newId(kind: IdKind): string {
  return `${idPrefixes[kind]}_${random()}`;
}

const idPattern = /^[a-z]{2,5}_[0-9a-z]{4,40}$/;

/** True when `value` looks like an id of `kind` (prefix and alphabet), without asking any store. */
export function isId(kind: IdKind, value: string): boolean {
  return value.startsWith(`${idPrefixes[kind]}_`) && idPattern.test(value);
}

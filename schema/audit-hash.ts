// An audit row's hash computed in TypeScript, the same definition as the insert trigger's SQL (migration 0004) but independent of it.
//
// hash = hex(sha256(prev_hash || "agentvm-audit-v1" || field…)), each field `<UTF-8 byte length>:<text>` or `~` for
// null, in order: id, seq, chain ('' = no tenant), at as epoch microseconds, actor, action, target, request id, detail as
// its jsonb text (the database's canonical rendering, read back as text). Uses WebCrypto: runs on Node and in a Worker.

/** The fields of a row the hash covers, as text where Postgres renders them (`at` as epoch µs, detail as jsonb text). */
export interface AuditHashFields {
  id: string;
  seq: string;
  chain: string;
  atMicros: string;
  actor: string;
  action: string;
  target: string;
  requestId: string | null;
  /** `detail::text`: jsonb's own rendering (sorted keys, fixed spacing), not a re-serialized object. */
  detailText: string | null;
}

export const auditHashVersion = "agentvm-audit-v1";

const encoder = new TextEncoder();

function field(v: string | null): string {
  return v === null ? "~" : `${encoder.encode(v).length}:${v}`;
}

/** The exact text hashed after the previous hash. */
export function canonicalAuditRow(f: AuditHashFields): string {
  return auditHashVersion + [f.id, f.seq, f.chain, f.atMicros, f.actor, f.action, f.target, f.requestId, f.detailText].map(field).join("");
}

export async function auditRowHash(prevHash: string, f: AuditHashFields): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", encoder.encode(prevHash + canonicalAuditRow(f)));
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

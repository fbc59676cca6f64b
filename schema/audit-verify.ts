// Verifies audit hash chains: walks a chain in seq order, recomputes every hash in TypeScript and names the first broken row.
import { sql } from "drizzle-orm";
import { auditRowHash } from "./audit-hash.ts";
import { queryRows, type Db } from "./postgres.ts";

/** What is wrong with the first broken row of a chain. */
export type AuditChainProblem =
  /** A row without a seq or hash: inserted while the chain trigger was disabled. */
  | "unchained_row"
  /** Its seq is not the previous one + 1: rows were deleted (or seq changed). */
  | "seq_gap"
  /** Its prev_hash is not the previous row's hash: a row before it was removed or rewritten. */
  | "prev_hash_mismatch"
  /** Its hash is not the hash of its fields and prev_hash: the row was altered. */
  | "hash_mismatch"
  /** audit_chain_heads does not name the last row: rows at the end were removed, or the head was changed. */
  | "head_mismatch";

export interface AuditBrokenRow {
  problem: AuditChainProblem;
  /** The row's seq and id (null for a head that names no row); what it should have been, said in `message`. */
  seq: number | null;
  id: number | null;
  message: string;
}

export type AuditChainVerdict =
  | { chain: string; ok: true; rows: number; headSeq: number; headHash: string }
  | { chain: string; ok: false; rows: number; broken: AuditBrokenRow };

interface ChainRow {
  id: string;
  seq: string | null;
  at_us: string;
  actor: string;
  action: string;
  target: string;
  request_id: string | null;
  detail_text: string | null;
  prev_hash: string | null;
  hash: string | null;
}

export interface VerifyOptions {
  /** Rows read per query (default 1000). */
  batchRows?: number;
}

/** Verifies one chain: a tenant's id, or '' for the rows without a tenant. `rows` counts the rows checked. */
export async function verifyAuditChain(db: Db, chain: string, opts: VerifyOptions = {}): Promise<AuditChainVerdict> {
  const batchRows = opts.batchRows ?? 1000;
  const tenant = sql`coalesce(tenant_id, '') = ${chain}`;
  const [unchained] = await queryRows<{ id: string }>(
    db,
    sql`select id::text as id from audit_log where ${tenant} and (seq is null or hash is null or prev_hash is null) order by audit_log.id limit 1`,
  );
  if (unchained) {
    const broken: AuditBrokenRow = {
      problem: "unchained_row",
      seq: null,
      id: Number(unchained.id),
      message: `row id ${unchained.id} has no seq/hash: inserted with the chain trigger disabled`,
    };
    return { chain, ok: false, rows: 0, broken };
  }
  let prevSeq = 0;
  let prevHash = "";
  let rows = 0;
  for (;;) {
    const batch = await queryRows<ChainRow>(
      db,
      sql`select id::text as id, seq::text as seq, trunc(extract(epoch from at) * 1000000)::bigint::text as at_us, actor, action, target,
            request_id, detail::text as detail_text, prev_hash, hash
          from audit_log where ${tenant} and audit_log.seq > ${prevSeq} order by audit_log.seq limit ${batchRows}`,
    );
    for (const r of batch) {
      const seq = Number(r.seq);
      const at = { seq, id: Number(r.id) };
      if (seq !== prevSeq + 1)
        return broke(chain, rows, {
          ...at,
          problem: "seq_gap",
          message: `row id ${r.id} has seq ${seq}, expected ${prevSeq + 1}: ${seq - prevSeq - 1} row(s) missing before it`,
        });
      if (r.prev_hash !== prevHash)
        return broke(chain, rows, {
          ...at,
          problem: "prev_hash_mismatch",
          message: `row seq ${seq} (id ${r.id}) has prev_hash ${r.prev_hash}, the previous row's hash is ${prevHash || "'' (first row)"}`,
        });
      const expected = await auditRowHash(prevHash, {
        id: r.id,
        seq: r.seq!,
        chain,
        atMicros: r.at_us,
        actor: r.actor,
        action: r.action,
        target: r.target,
        requestId: r.request_id,
        detailText: r.detail_text,
      });
      if (r.hash !== expected)
        return broke(chain, rows, {
          ...at,
          problem: "hash_mismatch",
          message: `row seq ${seq} (id ${r.id}) has hash ${r.hash}, its fields hash to ${expected}: the row was altered`,
        });
      prevSeq = seq;
      prevHash = r.hash;
      rows++;
    }
    if (batch.length < batchRows) break;
  }
  const [head] = await queryRows<{ seq: string; hash: string }>(db, sql`select seq::text as seq, hash from audit_chain_heads where chain = ${chain}`);
  const headSeq = head ? Number(head.seq) : 0;
  const headHash = head?.hash ?? "";
  if (headSeq !== prevSeq || headHash !== prevHash) {
    const message = `the chain head says seq ${headSeq} (hash ${headHash || "''"}), the last row is seq ${prevSeq} (hash ${prevHash || "''"}): rows at the end are missing, or the head was changed`;
    return broke(chain, rows, { problem: "head_mismatch", seq: headSeq, id: null, message });
  }
  return { chain, ok: true, rows, headSeq, headHash };
}

function broke(chain: string, rows: number, broken: AuditBrokenRow): AuditChainVerdict {
  return { chain, ok: false, rows, broken };
}

/** Every chain the database has (rows or heads), '' (rows without a tenant) included when present. */
export async function auditChains(db: Db): Promise<string[]> {
  const rows = await queryRows<{ chain: string }>(
    db,
    sql`select distinct coalesce(tenant_id, '') as chain from audit_log union select chain from audit_chain_heads order by chain`,
  );
  return rows.map((r) => r.chain);
}

/** Verifies every chain, in chain order. */
export async function verifyAllAuditChains(db: Db, opts: VerifyOptions = {}): Promise<AuditChainVerdict[]> {
  const out: AuditChainVerdict[] = [];
  for (const chain of await auditChains(db)) out.push(await verifyAuditChain(db, chain, opts));
  return out;
}

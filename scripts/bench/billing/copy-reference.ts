// bench:billing's reference: the same segments written with one plain `COPY … FROM STDIN`, timed.
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import postgres from "postgres";
import type { MeterSegment } from "../../../contracts/meter.ts";

const copyColumns = "id, tenant_id, agent_id, run_id, started_at, ended_at, vcpus, mem_mib, start_reason, end_reason, received_at";

/** The segments as COPY text rows (tab-separated; nothing here needs escaping), in chunks of `rows` rows. */
function copyChunks(byHost: MeterSegment[][], receivedAt: string, rows = 10_000): string[] {
  const chunks: string[] = [];
  let chunk = "";
  let n = 0;
  for (const segs of byHost) {
    for (const s of segs) {
      chunk += `${s.id}\t${s.tenantId}\t${s.agentId}\t${s.runId}\t${s.startedAt}\t${s.endedAt}\t${s.vcpus}\t${s.memMiB}\t${s.startReason}\t${s.endReason}\t${receivedAt}\n`;
      if (++n % rows === 0) {
        chunks.push(chunk);
        chunk = "";
      }
    }
  }
  if (chunk) chunks.push(chunk);
  return chunks;
}

/**
 * The reference: the same rows in one `COPY meter_segments … FROM STDIN` (one statement, one commit), timed from the
 * first byte to the commit, into the emptied table; then it is emptied again for our ingest. Both start after a CHECKPOINT.
 */
export async function copyReference(url: string, byHost: MeterSegment[][], receivedAt: string): Promise<{ rows: number; ms: number }> {
  // the server's own superuser (the app's pool runs as a role that may not TRUNCATE)
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  try {
    const chunks = copyChunks(byHost, receivedAt);
    const rows = byHost.reduce((t, segs) => t + segs.length, 0);
    await sql`TRUNCATE meter_segments`;
    await sql`CHECKPOINT`;
    const t = performance.now();
    const writable = await sql.unsafe(`COPY meter_segments (${copyColumns}) FROM STDIN`).writable();
    await pipeline(Readable.from(chunks), writable);
    const ms = performance.now() - t;
    const [stored] = await sql<{ n: number }[]>`select count(*)::int as n from meter_segments`;
    if (stored?.n !== rows) throw new Error(`COPY stored ${stored?.n} of ${rows} rows`);
    await sql`TRUNCATE meter_segments`;
    await sql`CHECKPOINT`;
    return { rows, ms };
  } finally {
    await sql.end();
  }
}

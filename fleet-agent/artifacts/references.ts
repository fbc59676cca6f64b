// What in the database references blobs of the shared artifact store: the garbage collector's (gc.ts) list of what stays.
import { sql } from "drizzle-orm";
import { queryRows, type Db } from "../../schema/postgres.ts";

/**
 * Every digest a row references now: the files of each live agent's last commit (a deleted agent's go), every image
 * row's root filesystem and every live agent's (its image row may be gone, its agents still boot from it), and the kept
 * bodies of upstream calls.
 */
export async function referencedDigests(db: Db): Promise<Set<string>> {
  const rows = await queryRows<{ digest: string }>(
    db,
    sql`select f.value->>'digest' as digest
          from agent_commits c join agents a on a.id = c.agent_id, jsonb_each(c.files) f
          where a.deleted_at is null
        union select digest from images
        union select image_digest from agents where deleted_at is null and image_digest is not null
        union select request_body from operations where request_body is not null
        union select response_body from operations where response_body is not null`,
  );
  return new Set(rows.map((r) => r.digest).filter((d): d is string => typeof d === "string"));
}

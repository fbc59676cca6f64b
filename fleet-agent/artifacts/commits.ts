// Which snapshot of an agent is the committed one (agent_commits): its files' digests in the artifact store, fenced by generation.
import { eq, sql } from "drizzle-orm";
import type { Db } from "../../schema/db.ts";
import { agentCommits } from "../../schema/core.ts";

/** One agent's committed snapshot: by file name (checkpoint layout), the blob digest and size of each. */
export type CommitRow = typeof agentCommits.$inferSelect;

export interface CommitStore {
  /**
   * Makes `row` the agent's commit unless the one there is newer: it replaces a row only of a lower or equal
   * generation AND an older snapshot. A host that lost the agent (an older generation) never overwrites the new
   * owner's commit, however late its own snapshot; nor does a slow commit overwrite a later one of the same owner.
   * Answers whether the row is now the agent's commit. The same snapshot committed again (equal `snapshotAt`) loses.
   */
  upsert(row: CommitRow): Promise<boolean>;
  get(agentId: string): Promise<CommitRow | undefined>;
}

export function createDbCommitStore(db: Db): CommitStore {
  return {
    async upsert(row) {
      // The fence is in the statement's own `where`: the check and the write are one atomic step in Postgres.
      const won = await db
        .insert(agentCommits)
        .values(row)
        .onConflictDoUpdate({
          target: agentCommits.agentId,
          set: {
            hostId: sql`excluded.host_id`,
            generation: sql`excluded.generation`,
            files: sql`excluded.files`,
            bytes: sql`excluded.bytes`,
            snapshotAt: sql`excluded.snapshot_at`,
            committedAt: sql`excluded.committed_at`,
          },
          setWhere: sql`${agentCommits.generation} <= excluded.generation and ${agentCommits.snapshotAt} < excluded.snapshot_at`,
        })
        .returning({ agentId: agentCommits.agentId });
      return won.length > 0;
    },
    async get(agentId) {
      const rows = await db.select().from(agentCommits).where(eq(agentCommits.agentId, agentId)).limit(1);
      return rows[0];
    },
  };
}

// Viewers' sessions on desktop agents in the database (drizzle; Postgres or PGlite): shared by every gateway, one control holder an agent by a unique index.
import { and, asc, eq, gt, isNull, lte, sql } from "drizzle-orm";
import type { Db } from "../../schema/postgres.ts";
import { desktopSessions } from "../../schema/core.ts";
import { isUniqueViolation } from "../../schema/db-errors.ts";
import type { DesktopSession, DesktopSessions } from "./sessions.ts";

type Row = typeof desktopSessions.$inferSelect;

const session = (r: Row): DesktopSession => ({
  id: r.id,
  tenantId: r.tenantId,
  agentId: r.agentId,
  mode: r.mode,
  actor: r.actor,
  requestId: r.requestId,
  startedAt: r.startedAt,
  expiresAt: r.expiresAt,
});

export function createDesktopSessionStore(db: Db): DesktopSessions {
  const live = (agentId: string, now: Date) =>
    db
      .select()
      .from(desktopSessions)
      .where(and(eq(desktopSessions.agentId, agentId), isNull(desktopSessions.endedAt), gt(desktopSessions.expiresAt, now)))
      .orderBy(asc(desktopSessions.startedAt), asc(desktopSessions.id));

  return {
    async open(s) {
      // A session its gateway stopped renewing ended when it expired (the unique index then lets a new holder in).
      const expired = and(eq(desktopSessions.agentId, s.agentId), isNull(desktopSessions.endedAt), lte(desktopSessions.expiresAt, s.startedAt));
      await db
        .update(desktopSessions)
        .set({ endedAt: sql`${desktopSessions.expiresAt}` })
        .where(expired);
      try {
        await db.insert(desktopSessions).values({ ...s });
        return { session: s };
      } catch (err) {
        if (!isUniqueViolation(err)) throw err;
        const holder = (await live(s.agentId, s.startedAt)).find((x) => x.mode === "control");
        // The holder's row ended between the insert and this read: say who held it all the same (a retry gets in).
        return { heldBy: holder ? session(holder) : { ...s, actor: "another viewer" } };
      }
    },
    async renew(id, expiresAt) {
      await db
        .update(desktopSessions)
        .set({ expiresAt })
        .where(and(eq(desktopSessions.id, id), isNull(desktopSessions.endedAt)));
    },
    async close(id, endedAt) {
      await db
        .update(desktopSessions)
        .set({ endedAt })
        .where(and(eq(desktopSessions.id, id), isNull(desktopSessions.endedAt)));
    },
    async live(agentId, now) {
      return (await live(agentId, now)).map(session);
    },
  };
}

// Viewers' sessions on desktop agents (who watches, who holds control, since when): the interface the viewer's route and the actions API use, and an in-memory one for a gateway without a database.
//
// Runtime-free. The database's (session-store.ts) is what every program passes: shared by all gateways, so one human
// holds a desktop whichever gateway relays them, and the others' actions API refuses meanwhile.
import type { DesktopSessionMode } from "../../schema/core.ts";

export interface DesktopSession {
  id: string;
  tenantId: string;
  agentId: string;
  mode: DesktopSessionMode;
  /** The caller's subject (the audit log's actor). */
  actor: string;
  requestId: string;
  startedAt: Date;
  /** Live until then unless renewed. */
  expiresAt: Date;
}

export type OpenedSession = { session: DesktopSession } | { heldBy: DesktopSession };

export interface DesktopSessions {
  /**
   * Opens a session; a `control` one only when no live control session holds the agent (else `heldBy` names it).
   * Sessions of the agent past their `expiresAt` (their gateway stopped renewing them) are ended first.
   */
  open(session: DesktopSession): Promise<OpenedSession>;
  /** Moves a live session's expiry on (its socket is still open). */
  renew(id: string, expiresAt: Date): Promise<void>;
  /** Ends a session at `endedAt`. */
  close(id: string, endedAt: Date): Promise<void>;
  /** The agent's live sessions at `now`, oldest first. */
  live(agentId: string, now: Date): Promise<DesktopSession[]>;
}

/** How long a session lives without a renewal, and how often its gateway renews it, ms. */
export const sessionTtlMs = 30_000;
export const sessionRenewMs = 10_000;

/** Sessions in this process only (a gateway assembled without a database: unit tests of other parts). */
export function memoryDesktopSessions(): DesktopSessions {
  const sessions = new Map<string, DesktopSession>();
  const live = (agentId: string, now: Date) =>
    [...sessions.values()].filter((s) => s.agentId === agentId && s.expiresAt > now).sort((a, b) => a.startedAt.getTime() - b.startedAt.getTime());
  return {
    async open(session) {
      for (const s of sessions.values()) if (s.expiresAt <= session.startedAt) sessions.delete(s.id);
      const holder = session.mode === "control" ? live(session.agentId, session.startedAt).find((s) => s.mode === "control") : undefined;
      if (holder) return { heldBy: holder };
      sessions.set(session.id, { ...session });
      return { session };
    },
    async renew(id, expiresAt) {
      const s = sessions.get(id);
      if (s) s.expiresAt = expiresAt;
    },
    async close(id) {
      sessions.delete(id);
    },
    async live(agentId, now) {
      return live(agentId, now);
    },
  };
}

/** The live session holding control of the agent's desktop, if any. */
export async function controlHolder(sessions: DesktopSessions, agentId: string, now: Date): Promise<DesktopSession | undefined> {
  return (await sessions.live(agentId, now)).find((s) => s.mode === "control");
}

// Billed time of agents over a window, from the meter segments billing received: active and dozing ms, each clipped to the window.
import { and, gt, inArray, lt } from "drizzle-orm";
import { meterSegments } from "../../../schema/billing.ts";
import type { Db } from "../../../schema/db.ts";

export interface Billed {
  /** Active (billed vCPU) ms inside the window, summed over the agents. */
  activeMs: number;
  /** Dozing ms inside the window, summed over the agents. */
  dozingMs: number;
  /** Segments that overlap the window. */
  segments: number;
}

/** Per state, how much of `[fromMs, toMs]` (wall-clock ms) the agents' segments cover: a segment counts for its overlap only. */
export async function billedOver(db: Db, agentIds: string[], fromMs: number, toMs: number): Promise<Billed> {
  const rows = await db
    .select({ startedAt: meterSegments.startedAt, endedAt: meterSegments.endedAt, state: meterSegments.state })
    .from(meterSegments)
    .where(and(inArray(meterSegments.agentId, agentIds), lt(meterSegments.startedAt, new Date(toMs)), gt(meterSegments.endedAt, new Date(fromMs))));
  const billed: Billed = { activeMs: 0, dozingMs: 0, segments: rows.length };
  for (const r of rows) {
    const ms = Math.max(0, Math.min(r.endedAt.getTime(), toMs) - Math.max(r.startedAt.getTime(), fromMs));
    if (r.state === "dozing") billed.dozingMs += ms;
    else billed.activeMs += ms;
  }
  return billed;
}

/** Latest end of the agents' segments (wall ms), 0 when none: billing has received everything up to it. */
export async function meteredUntil(db: Db, agentIds: string[]): Promise<number> {
  const rows = await db
    .select({ endedAt: meterSegments.endedAt, agentId: meterSegments.agentId })
    .from(meterSegments)
    .where(inArray(meterSegments.agentId, agentIds));
  const last = new Map<string, number>();
  for (const r of rows) last.set(r.agentId, Math.max(last.get(r.agentId) ?? 0, r.endedAt.getTime()));
  return agentIds.every((id) => last.has(id)) ? Math.min(...agentIds.map((id) => last.get(id)!)) : 0;
}

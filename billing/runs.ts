// Awake runs of an agent (from the host-written `runs` table) with what woke them, what put them to sleep, timings and metered time.
import { wakeTimingKeys, type WakeTimings } from "../contracts/agent.ts";
import { AppError } from "../lib/errors.ts";
import type { Db } from "../schema/db.ts";
import { sqlRunner, toNumber } from "./sql-runner.ts";

export interface RunReport {
  runId: string;
  hostId: string;
  vmId: string;
  wokeAt: number;
  wakeReason: string;
  /** restore | boot */
  wakeMode: string;
  /** Wake timing breakdown in ms as the host recorded it: queuedMs, restoreMs, clockFixMs, firstByteMs, … */
  timings: WakeTimings;
  sleptAt: number | undefined;
  sleepReason: string | undefined;
  /** Metered time of the run (segments received so far). */
  activeMs: number;
  vcpuMs: number;
  mibMs: number;
  segments: number;
}

/** Throws not_found unless `agentId` is an agent of `tenantId` (another tenant's agent does not exist for the caller). */
export async function assertAgentOfTenant(db: Db, tenantId: string, agentId: string): Promise<void> {
  const rows = await sqlRunner(db).query(`SELECT 1 FROM agents WHERE id = $1 AND tenant_id = $2`, [agentId, tenantId]);
  if (rows.length === 0) throw new AppError("not_found", "agent not found");
}

export async function agentRuns(db: Db, tenantId: string, agentId: string, opts: { from?: number; to?: number; before?: number; limit?: number } = {}): Promise<RunReport[]> {
  await assertAgentOfTenant(db, tenantId, agentId);
  const params: unknown[] = [agentId, tenantId];
  const where: string[] = [];
  const add = (cond: string, value: unknown) => {
    params.push(value);
    where.push(cond.replace("?", `$${params.length}::text::timestamptz`));
  };
  if (opts.from !== undefined) add("r.woke_at >= ?", new Date(opts.from).toISOString());
  if (opts.to !== undefined) add("r.woke_at < ?", new Date(opts.to).toISOString());
  if (opts.before !== undefined) add("r.woke_at < ?", new Date(opts.before).toISOString());
  params.push(Math.min(Math.max(opts.limit ?? 100, 1), 1000));
  const rows = await sqlRunner(db).query<Record<string, unknown>>(
    `SELECT r.id, r.host_id, r.vm_id, (extract(epoch FROM r.woke_at) * 1000)::int8 AS woke_ms, r.wake_reason, r.wake_mode, r.timings,
       (extract(epoch FROM r.slept_at) * 1000)::int8 AS slept_ms, r.sleep_reason,
       u.active_ms, u.vcpu_ms, u.mib_ms, u.segments
     FROM runs r LEFT JOIN run_usage u ON u.run_id = r.id
     WHERE r.agent_id = $1 AND r.tenant_id = $2${where.map((w) => ` AND ${w}`).join("")}
     ORDER BY r.woke_at DESC, r.id DESC
     LIMIT $${params.length}`,
    params,
  );
  return rows.map((r) => ({
    runId: String(r.id),
    hostId: String(r.host_id),
    vmId: String(r.vm_id),
    wokeAt: toNumber(r.woke_ms),
    wakeReason: String(r.wake_reason),
    wakeMode: String(r.wake_mode),
    timings: parseTimings(r.timings),
    sleptAt: r.slept_ms === null || r.slept_ms === undefined ? undefined : toNumber(r.slept_ms),
    sleepReason: r.sleep_reason === null || r.sleep_reason === undefined ? undefined : String(r.sleep_reason),
    activeMs: toNumber(r.active_ms),
    vcpuMs: toNumber(r.vcpu_ms),
    mibMs: toNumber(r.mib_ms),
    segments: toNumber(r.segments),
  }));
}

/** The run's timings as stored (jsonb), keeping the contract's keys with numeric values. */
function parseTimings(v: unknown): WakeTimings {
  const obj = (typeof v === "string" ? JSON.parse(v) : v) as Record<string, unknown> | null;
  const out: WakeTimings = {};
  if (obj && typeof obj === "object") for (const k of wakeTimingKeys) if (typeof obj[k] === "number") out[k] = obj[k];
  return out;
}

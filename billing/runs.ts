// Awake runs of an agent (from the host-written `runs` table) with what woke them, what put them to sleep, timings, metered (active and dozed) time and the upstream calls they made.
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
  /** Metered time of the run (segments received so far): running, and dozing (vCPUs stopped while it waited on an outbound call). */
  activeMs: number;
  vcpuMs: number;
  mibMs: number;
  dozedMs: number;
  dozedVcpuMs: number;
  dozedMibMs: number;
  segments: number;
  /** Ms of the run's segments not billed: time of the agent another segment (another host's, or a re-report) had already billed. */
  overlapMs: number;
  /** Calls through upstreams made during the run (operation records), what they waited for (their first bytes), and their tokens. */
  operations: number;
  /** Sum over the run's operations of first byte − sent (those that got no answer add nothing): the wait a doze can sleep through. */
  upstreamWaitMs: number;
  inputTokens: number;
  outputTokens: number;
  /** Of the run's time, how long a desktop viewer was connected (any mode), and how long a human held control (docs/desktop.md): a viewer holds the agent awake. */
  viewerMs: number;
  controlMs: number;
}

/** Throws not_found unless `agentId` is an agent of `tenantId` (another tenant's agent does not exist for the caller). */
export async function assertAgentOfTenant(db: Db, tenantId: string, agentId: string): Promise<void> {
  const rows = await sqlRunner(db).query(`SELECT 1 FROM agents WHERE id = $1 AND tenant_id = $2`, [agentId, tenantId]);
  if (rows.length === 0) throw new AppError("not_found", "agent not found");
}

/** Where a page of runs continues: after this run in the newest-first order. */
export interface RunPosition {
  /** `woke_at` to the microsecond, as `runKey` gave it (a millisecond would merge runs that woke in the same one). */
  wokeAt: string;
  runId: string;
}

export interface RunQuery {
  /** Runs that woke at or after this instant (ms). */
  from?: number;
  /** Runs that woke before this instant (ms). */
  until?: number;
  after?: RunPosition;
  /** Rows to return (a page asks for one more than it shows). */
  limit?: number;
}

/** Runs fetched at most by one query. */
const maxRunRows = 1001;

/**
 * The agent's runs, newest first, in one query: the agent row (another tenant's agent does not exist: `not_found`)
 * joined to the page of its runs (keyset on `(woke_at, id)`, which the `(agent_id, woke_at)` index serves); then
 * their operations, grouped by run in one query for the page (`runOperations`).
 */
export async function agentRuns(db: Db, tenantId: string, agentId: string, opts: RunQuery = {}): Promise<(RunReport & { position: RunPosition })[]> {
  const params: unknown[] = [agentId, tenantId];
  const where: string[] = [];
  const param = (value: unknown) => {
    params.push(value);
    return `$${params.length}`;
  };
  if (opts.from !== undefined) where.push(`r.woke_at >= ${param(new Date(opts.from).toISOString())}::text::timestamptz`);
  if (opts.until !== undefined) where.push(`r.woke_at < ${param(new Date(opts.until).toISOString())}::text::timestamptz`);
  if (opts.after) where.push(`(r.woke_at, r.id) < (${param(opts.after.wokeAt)}::text::timestamptz, ${param(opts.after.runId)}::text)`);
  const limit = param(Math.min(Math.max(opts.limit ?? 100, 1), maxRunRows));
  const rows = await sqlRunner(db).query<Record<string, unknown>>(
    `SELECT p.* FROM agents a LEFT JOIN LATERAL (
       SELECT r.id, r.host_id, r.vm_id, (extract(epoch FROM r.woke_at) * 1000)::int8 AS woke_ms,
         to_char(r.woke_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS woke_key, r.wake_reason, r.wake_mode, r.timings,
         (extract(epoch FROM r.slept_at) * 1000)::int8 AS slept_ms, r.sleep_reason,
         u.active_ms, u.vcpu_ms, u.mib_ms, u.dozed_ms, u.dozed_vcpu_ms, u.dozed_mib_ms, u.segments, u.overlap_ms
       FROM runs r LEFT JOIN run_usage u ON u.run_id = r.id
       WHERE r.agent_id = a.id AND r.tenant_id = a.tenant_id${where.map((w) => ` AND ${w}`).join("")}
       ORDER BY r.woke_at DESC, r.id DESC
       LIMIT ${limit}
     ) p ON true
     WHERE a.id = $1 AND a.tenant_id = $2`,
    params,
  );
  if (rows.length === 0) throw new AppError("not_found", "agent not found");
  const listed = rows.filter((r) => r.id !== null && r.id !== undefined);
  const ops = await runOperations(
    db,
    tenantId,
    agentId,
    listed.map((r) => String(r.id)),
  );
  const viewers = await runViewers(
    db,
    tenantId,
    agentId,
    listed.map((r) => ({
      id: String(r.id),
      from: toNumber(r.woke_ms),
      until: r.slept_ms === null || r.slept_ms === undefined ? undefined : toNumber(r.slept_ms),
    })),
  );
  return listed.map((r) => {
    const o = ops.get(String(r.id));
    return {
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
      dozedMs: toNumber(r.dozed_ms),
      dozedVcpuMs: toNumber(r.dozed_vcpu_ms),
      dozedMibMs: toNumber(r.dozed_mib_ms),
      segments: toNumber(r.segments),
      overlapMs: toNumber(r.overlap_ms),
      operations: o?.operations ?? 0,
      upstreamWaitMs: o?.upstreamWaitMs ?? 0,
      inputTokens: o?.inputTokens ?? 0,
      outputTokens: o?.outputTokens ?? 0,
      viewerMs: viewers.get(String(r.id))?.viewerMs ?? 0,
      controlMs: viewers.get(String(r.id))?.controlMs ?? 0,
      position: { wokeAt: String(r.woke_key), runId: String(r.id) },
    };
  });
}

type RunOperations = Pick<RunReport, "operations" | "upstreamWaitMs" | "inputTokens" | "outputTokens">;

/**
 * The operations of runs `runIds` of one agent, summed per run, in one grouped query. It reads the agent's operations
 * (`operations_agent_idx`) and keeps a run's by `= ANY` of the ids, planned with them each time (not prepared): a
 * constant array is checked with a hash, 40–70 ms for 200k operations and 100 or 1,000 runs, where the generic plan's
 * parameter is checked element by element (0.5 s and 5 s), and a join to the ids or the page is a nested loop whenever
 * the statistics say the agent has few operations (1–2 s). An index by run would read only the page's operations.
 */
async function runOperations(db: Db, tenantId: string, agentId: string, runIds: readonly string[]): Promise<Map<string, RunOperations>> {
  const out = new Map<string, RunOperations>();
  if (runIds.length === 0) return out;
  const rows = await sqlRunner(db).query<Record<string, unknown>>(
    `SELECT run_id, count(*) AS operations, round(sum(extract(epoch FROM first_byte_at - sent_at) * 1000))::int8 AS wait_ms,
       sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens
     FROM operations
     WHERE agent_id = $1 AND tenant_id = $2 AND run_id = ANY($3::text[])
     GROUP BY run_id`,
    [agentId, tenantId, [...runIds]],
    { prepare: false },
  );
  for (const r of rows)
    out.set(String(r.run_id), {
      operations: toNumber(r.operations),
      upstreamWaitMs: toNumber(r.wait_ms),
      inputTokens: toNumber(r.input_tokens),
      outputTokens: toNumber(r.output_tokens),
    });
  return out;
}

/**
 * How long desktop viewers were connected during each run, and held control (the union of their sessions' spans within
 * the run: two viewers at once count once). One query for the page: the agent's sessions that overlap the page's
 * span; a session still open counts to now, or to its expiry if its gateway stopped renewing it.
 */
async function runViewers(
  db: Db,
  tenantId: string,
  agentId: string,
  runs: readonly { id: string; from: number; until: number | undefined }[],
): Promise<Map<string, Pick<RunReport, "viewerMs" | "controlMs">>> {
  const out = new Map<string, Pick<RunReport, "viewerMs" | "controlMs">>();
  if (runs.length === 0) return out;
  const now = Date.now();
  const from = Math.min(...runs.map((r) => r.from));
  const until = Math.max(...runs.map((r) => r.until ?? now));
  const rows = await sqlRunner(db).query<Record<string, unknown>>(
    `SELECT mode, (extract(epoch FROM started_at) * 1000)::int8 AS from_ms,
       (extract(epoch FROM coalesce(ended_at, least(expires_at, now()))) * 1000)::int8 AS until_ms
     FROM desktop_sessions
     WHERE agent_id = $1 AND tenant_id = $2 AND started_at < $4::text::timestamptz AND coalesce(ended_at, expires_at) > $3::text::timestamptz`,
    [agentId, tenantId, new Date(from).toISOString(), new Date(until).toISOString()],
  );
  const spans = rows.map((r) => ({ control: r.mode === "control", from: toNumber(r.from_ms), until: toNumber(r.until_ms) }));
  if (spans.length === 0) return out;
  for (const run of runs) {
    const end = run.until ?? now;
    out.set(run.id, {
      viewerMs: coveredMs(spans, run.from, end),
      controlMs: coveredMs(
        spans.filter((s) => s.control),
        run.from,
        end,
      ),
    });
  }
  return out;
}

/** Milliseconds of [from, until) covered by at least one of `spans` (each [from, until)). */
export function coveredMs(spans: readonly { from: number; until: number }[], from: number, until: number): number {
  const clipped = spans
    .map((s) => ({ from: Math.max(s.from, from), until: Math.min(s.until, until) }))
    .filter((s) => s.until > s.from)
    .sort((a, b) => a.from - b.from);
  let total = 0;
  let reach = from;
  for (const s of clipped) {
    if (s.until <= reach) continue;
    total += s.until - Math.max(s.from, reach);
    reach = s.until;
  }
  return Math.round(total);
}

/** The run's timings as stored (jsonb), keeping the contract's keys with numeric values. */
function parseTimings(v: unknown): WakeTimings {
  const obj = (typeof v === "string" ? JSON.parse(v) : v) as Record<string, unknown> | null;
  const out: WakeTimings = {};
  if (obj && typeof obj === "object") for (const k of wakeTimingKeys) if (typeof obj[k] === "number") out[k] = obj[k];
  if (obj && (obj.tier === "kept" || obj.tier === "prestarted" || obj.tier === "files")) out.tier = obj.tier;
  return out;
}

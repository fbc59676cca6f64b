// The agent as the admin API shows it: its row, its live state, the non-waking rules and the limits in force.
import type { VmState, VmStatus } from "../../contracts/agent.ts";
import type { EffectiveLimits } from "../proxy/core.ts";
import { effectiveNonWaking } from "../proxy/policy.ts";
import type { AgentRow } from "./repo.ts";
export function agentJson(row: AgentRow, status: VmStatus | undefined, limits: EffectiveLimits) {
  return {
    id: row.id,
    tenantId: row.tenantId,
    name: row.name,
    image: row.image,
    imageDigest: row.imageDigest,
    vcpus: row.vcpus,
    memMiB: row.memMiB,
    diskMiB: row.diskMiB,
    /** A desktop agent's display size; null without a desktop. */
    desktop: row.desktop ?? null,
    idleTimeoutMs: row.idleTimeoutMs,
    streamIdleMs: row.streamIdleMs,
    public: row.public,
    allowEgress: row.allowEgress,
    /** What the gateway answers itself without waking the agent; `nonWakingDefault` says whether these are the defaults. */
    nonWaking: effectiveNonWaking(row.nonWaking),
    nonWakingDefault: row.nonWaking === null,
    limits,
    path: `/a/${row.id}/`,
    state: status?.state ?? (row.state as VmState),
    lastWakeAt: status?.lastWakeAt !== undefined ? new Date(status.lastWakeAt).toISOString() : (row.lastWakeAt?.toISOString() ?? null),
    inFlight: status?.inFlight ?? 0,
    leases: status?.leases ?? 0,
    /** The last failed hibernate (full disk, say) until one succeeds: the agent stays awake meanwhile. */
    lastHibernateError: status?.lastHibernateError ?? null,
    /** The checkpoint it was forked from; null for an agent created fresh. */
    forkedFrom: row.forkedFrom,
    /** The warm pool it belongs to and where it is in it; null outside any pool. */
    pool: row.poolId !== null ? { id: row.poolId, state: row.poolState ?? "resetting" } : null,
    createdAt: row.createdAt.toISOString(),
  };
}

// The hosts API's schemas: what the operator's routes validate and answer, as the OpenAPI document names them.
import { NextCursor, PageQuery, z } from "../../lib/api.ts";

/** What a host id (HOST_ID) may be: 1–128 letters, digits, `_`, `-`, `.` or `:`, starting with a letter or digit. */
export const hostIdPattern = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/;

const idHint = "must be 1–128 letters, digits, '_', '-', '.' or ':', starting with a letter or digit";
const HostId = z.string({ error: idHint }).regex(hostIdPattern, { error: idHint });

export const HostSchema = z
  .object({
    id: z.string(),
    url: z.string().nullable().openapi({ description: "Base URL of the host's ingress; null when it serves only the gateway in its own process" }),
    driver: z.string().openapi({ example: "qemu" }),
    healthy: z.boolean().openapi({ description: "Live, its clock within the allowed skew, and not draining: it takes new agents" }),
    why: z.string().nullable().openapi({
      description: "Why it is not healthy, e.g. `no heartbeat for 42 s`, `clock 612 s ahead`, `draining`; null when healthy",
      example: "no heartbeat for 42 s",
    }),
    live: z.boolean().openapi({ description: "Its last heartbeat is within the live window (HOST_LIVE_WINDOW_MS)" }),
    lastHeartbeatAt: z.string(),
    heartbeatAgeMs: z.number().int().openapi({ description: "How long ago its last heartbeat was, by the database's clock, ms" }),
    startedAt: z.string(),
    clockSkewMs: z.number().int().openapi({ description: "Its clock minus the database's at its last heartbeat, ms (positive: ahead)" }),
    capacityMiB: z.number().int().openapi({ description: "Memory it offers awake agents, MiB" }),
    usedMiB: z.number().int().openapi({ description: "Memory of its awake agents at its last heartbeat, MiB" }),
    awakeAgents: z.number().int().openapi({ description: "Its awake agents at its last heartbeat" }),
    agents: z.number().int().openapi({ description: "Agents placed on it that are not deleted, awake or not" }),
    draining: z.boolean().openapi({ description: "An operator drained it: it takes no new agents and its agents move to other hosts" }),
    drainingAt: z.string().nullable(),
  })
  .openapi("Host");

export const HostParams = z.object({ id: HostId.openapi({ param: { name: "id", in: "path" }, example: "host_a1" }) });

export const HostListQuery = PageQuery;

export const HostListSchema = z.object({ hosts: z.array(HostSchema), nextCursor: NextCursor }).openapi("HostList");

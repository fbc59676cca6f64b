// The agents API's schemas: the bodies and queries the routes validate and the answers they give, as the OpenAPI document names them.
import { instantQuery, NextCursor, PageQuery, z } from "../../lib/api.ts";
import { desktopLimits, type VmState } from "../../contracts/agent.ts";
import { NonWakingRulesInput, NonWakingRulesSchema, objectError } from "../proxy/policy.ts";

/** Every state a VM can be in (contracts/agent.ts), checked complete at compile time. */
const vmStates = [
  "creating",
  "booting",
  "running",
  "dozing",
  "snapshotting",
  "hibernated",
  "restoring",
  "stopped",
  "failed",
  "destroyed",
] as const satisfies readonly VmState[];
const everyState: Exclude<VmState, (typeof vmStates)[number]> extends never ? true : never = true;
void everyState;

export const VmStateSchema = z.enum(vmStates).openapi("VmState");

/** A built-in image (`demo`), `name[:tag]` of a built one (names as in images/routes.ts), or `sha256:<digest>`. */
export const imageRefPattern = /^(?:sha256:[0-9a-f]{64}|[a-z0-9][a-z0-9._/-]{0,127}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?)$/;

/** An integer from `min` to `max`, with one message for every way it can be wrong. */
function intIn(min: number, max: number, description?: string) {
  const message = `must be an integer from ${min} to ${max}`;
  const schema = z.number({ error: message }).int({ error: message }).min(min, { error: message }).max(max, { error: message });
  return description ? schema.openapi({ description }) : schema;
}

function matching(pattern: RegExp, hint: string) {
  const message = `must be ${hint}`;
  return z.string({ error: message }).regex(pattern, { error: message });
}

const bool = () => z.boolean({ error: "must be true or false" });

const week = 7 * 24 * 3600_000;
const idleTimeout = () => intIn(100, week, "ms without a call (or a stream moving bytes) before the agent hibernates");
const streamIdle = () => intIn(100, week, "an open stream keeps the agent awake only while it moved bytes within this window, ms");

/** `limits` in a body: each field an integer in range, or null for the gateway's global value; a field left out is unchanged. */
export const AgentLimitsInput = z
  .strictObject(
    {
      responseTimeoutMs: intIn(100, 3600_000, "the agent must send its response headers within this, ms").nullable().optional(),
      proxyIdleTimeoutMs: intIn(100, week, "a call, stream or WebSocket moving no bytes for this long is ended, ms").nullable().optional(),
      maxBodyBytes: intIn(0, 2 ** 50, "largest request body, bytes (never above the gateway's global limit)")
        .nullable()
        .optional(),
    },
    { error: objectError("an object {responseTimeoutMs, proxyIdleTimeoutMs, maxBodyBytes}") },
  )
  .openapi("AgentLimitsInput", { description: "Per-agent proxy limits; null = the gateway's global value" });

const bodyError = objectError("a JSON object");

const L = desktopLimits;
export const DesktopSizeInput = z
  .strictObject(
    {
      width: intIn(L.minWidth, L.maxWidth, "display width, pixels"),
      height: intIn(L.minHeight, L.maxHeight, "display height, pixels"),
    },
    { error: objectError("an object {width, height}") },
  )
  .openapi("DesktopSizeInput", { description: `A display size, ${L.minWidth}..${L.maxWidth} x ${L.minHeight}..${L.maxHeight} pixels` });

export const DesktopSizeSchema = z.object({ width: z.number().int(), height: z.number().int() }).openapi("DesktopSize");

export const CreateAgentBody = z
  .strictObject(
    {
      name: matching(/^[\w .:-]{1,100}$/, "1–100 letters, digits, spaces or . _ : -")
        .optional()
        .openapi({ description: 'Default "agent"' }),
      image: matching(imageRefPattern, "a built-in image, name[:tag] of a built image, or sha256:<digest>")
        .optional()
        .openapi({ description: "A built-in image (default `demo`), `name[:tag]` of a built image (pinned by digest at creation) or `sha256:<digest>`" }),
      vcpus: intIn(1, 16).optional(),
      memMiB: intIn(64, 65_536).optional().openapi({
        description:
          "Guest memory, MiB (64 at the least). An image's runtime needs what it needs: one that runs out is killed by the guest kernel, and the boot fails saying so (`boot_failed`: the guest ran out of memory, with the process it killed)",
      }),
      diskMiB: intIn(64, 1024 * 1024, "the agent's persistent disk, MiB").optional(),
      desktop: DesktopSizeInput.optional().openapi({
        description:
          "The display size of an agent of a desktop image (one built FROM `agentvm/desktop:bookworm`); default 1024x768 for such an image, refused for another",
      }),
      idleTimeoutMs: idleTimeout().optional(),
      streamIdleMs: streamIdle().optional(),
      public: bool().optional().openapi({ description: "Anyone may call it, without a token (default false)" }),
      allowEgress: bool().optional().openapi({ description: "The agent may open connections out (default false)" }),
      nonWaking: NonWakingRulesInput.nullable().optional().openapi({ description: "null or absent: the defaults" }),
      limits: AgentLimitsInput.optional(),
      fromCheckpoint: z.string({ error: "must be a checkpoint id (ckp_…) or agt_…:name" }).min(1).max(200).optional().openapi({
        description:
          "Fork: a checkpoint of the caller's, by id (`ckp_…`) or as `agt_…:name` (an agent's checkpoint by its name). The new agent is its agent's shape (image, vcpus, memMiB and diskMiB must be left out), on the checkpoint's host, hibernated on the checkpoint; its first call wakes it with a fresh identity",
        example: "ckp_0123456789abcdef",
      }),
    },
    { error: bodyError },
  )
  .openapi("CreateAgent");

export const UpdateAgentBody = z
  .strictObject(
    {
      idleTimeoutMs: idleTimeout().optional(),
      streamIdleMs: streamIdle().optional(),
      nonWaking: NonWakingRulesInput.nullable().optional().openapi({ description: "null resets to the defaults" }),
      limits: AgentLimitsInput.optional(),
      allowEgress: bool()
        .optional()
        .openapi({ description: "The agent may open connections out: changed only while it is not awake (409 otherwise), taken by its next wake or boot" }),
    },
    { error: bodyError },
  )
  .openapi("UpdateAgent");

export const AddLeaseBody = z
  .strictObject({ ttlMs: intIn(1000, 24 * 3600_000, "how long the lease keeps the agent awake, ms") }, { error: bodyError })
  .openapi("AddLease");

export const AgentParams = z.object({ id: z.string().openapi({ param: { name: "id", in: "path" }, example: "agt_0123456789abcdef" }) });
export const LeaseParams = AgentParams.extend({ leaseId: z.string().openapi({ param: { name: "leaseId", in: "path" }, example: "lse_0123456789abcdef" }) });

/** Query parameters are as strict as bodies: one this list does not take is a `400`, not ignored. */
export const AgentListQuery = z.strictObject({
  ...PageQuery.shape,
  state: VmStateSchema.optional().openapi({
    description:
      "Only agents in this state as the database last recorded it (each host writes it on a transition); the `state` an agent shows is its host's live one, which may be newer",
  }),
  namePrefix: z.string().min(1).max(100).optional().openapi({ description: "Only agents whose name starts with this (case-sensitive)" }),
  image: matching(imageRefPattern, "a built-in image, name:tag of a built image, or sha256:<digest>")
    .optional()
    .openapi({ description: "Only agents of this image: its `image` as shown (`demo`, `name:tag`), or its `imageDigest` (`sha256:…`)" }),
});

export const EventListQuery = z.strictObject({
  ...PageQuery.shape,
  since: instantQuery("Only events at or after this instant"),
  until: instantQuery("Only events before this instant"),
});

const isoInstant = () => z.iso.datetime();

export const EffectiveLimitsSchema = z
  .object({ responseTimeoutMs: z.number().int(), proxyIdleTimeoutMs: z.number().int(), maxBodyBytes: z.number().int() })
  .openapi("EffectiveLimits", { description: "The proxy limits in force for the agent (its own, else the gateway's)" });

export const HibernateFailureSchema = z
  .object({
    at: z.number().openapi({ description: "Wall clock of the failure, ms since the epoch" }),
    message: z.string(),
    code: z.string().optional().openapi({ description: "`ENOSPC` when the snapshot did not fit" }),
    neededBytes: z.number().optional(),
    freeBytes: z.number().optional(),
    attempts: z.number().int(),
    retryAt: z.number().openapi({ description: "Wall clock before which the idle reaper does not try again, ms since the epoch" }),
  })
  .openapi("HibernateFailure");

export const AgentSchema = z
  .object({
    id: z.string().openapi({ example: "agt_0123456789abcdef" }),
    tenantId: z.string(),
    name: z.string(),
    image: z.string(),
    imageDigest: z.string().nullable().openapi({ description: "The built image `image` was pinned to at creation; null for a built-in image" }),
    vcpus: z.number().int(),
    memMiB: z.number().int(),
    diskMiB: z.number().int(),
    desktop: DesktopSizeSchema.nullable().openapi({ description: "A desktop agent's display size (docs/desktop.md); null for an agent without a desktop" }),
    idleTimeoutMs: z.number().int(),
    streamIdleMs: z.number().int(),
    public: z.boolean(),
    allowEgress: z.boolean(),
    nonWaking: NonWakingRulesSchema,
    nonWakingDefault: z.boolean().openapi({ description: "Whether `nonWaking` are the defaults" }),
    limits: EffectiveLimitsSchema,
    path: z.string().openapi({ description: "Where the agent is called: `/a/{id}/`" }),
    state: VmStateSchema.openapi({ description: "Its host's live state when the host knows the agent, else the one the database last recorded" }),
    lastWakeAt: isoInstant().nullable(),
    inFlight: z.number().int(),
    leases: z.number().int(),
    lastHibernateError: HibernateFailureSchema.nullable().openapi({
      description: "The last failed hibernate (a full disk, say) until one succeeds: the agent stays awake meanwhile",
    }),
    forkedFrom: z
      .string()
      .nullable()
      .openapi({ description: "The checkpoint it was forked from (`POST /v1/agents {fromCheckpoint}`); null for an agent created fresh" }),
    pool: z
      .object({
        id: z.string().openapi({ example: "pol_0123456789abcdef" }),
        state: z
          .enum(["ready", "in_use", "resetting"])
          .openapi({ description: "ready = waits to be handed out; in_use = handed out; resetting = being forked or reset" }),
      })
      .nullable()
      .openapi({ description: "The warm pool it belongs to (`POST /v1/pools`); null outside any pool" }),
    createdAt: isoInstant(),
  })
  .openapi("Agent");

export const AgentListSchema = z.object({ agents: z.array(AgentSchema), nextCursor: NextCursor }).openapi("AgentList");

export const AgentDeletedSchema = z.object({ id: z.string(), deleted: z.literal(true) }).openapi("AgentDeleted");
export const AgentStateSchema = z.object({ id: z.string(), state: VmStateSchema }).openapi("AgentState");

const timings = () =>
  z
    .record(z.string(), z.union([z.number(), z.string()]))
    .openapi({ description: "Millisecond timings (restoreMs, clockFixMs, bootMs, …), and a restore's sleep `tier` (kept, prestarted, files)" });

export const WakeSchema = z
  .object({
    id: z.string(),
    state: z.literal("running"),
    wake: z.enum(["warm", "restore", "boot"]).openapi({ description: "warm = already running; restore = from its snapshot; boot = cold boot" }),
    runId: z.string(),
    timings: timings(),
  })
  .openapi("Wake");

export const LeaseSchema = z.object({ leaseId: z.string(), agentId: z.string(), expiresAt: isoInstant() }).openapi("Lease");
export const LeaseDroppedSchema = z.object({ leaseId: z.string(), dropped: z.literal(true) }).openapi("LeaseDropped");

export const AgentEventSchema = z
  .object({
    id: z.number().int(),
    at: isoInstant(),
    hostId: z.string(),
    agentId: z.string(),
    vmId: z.string(),
    runId: z.string().nullable(),
    fromState: z.string(),
    toState: z.string(),
    reason: z.string().openapi({ description: "A wake or sleep reason, `cancelled` or `hibernate_failed`" }),
    timings: timings().nullable(),
    detail: z.record(z.string(), z.unknown()).nullable(),
  })
  .openapi("AgentEvent");

export const AgentEventListSchema = z.object({ events: z.array(AgentEventSchema), nextCursor: NextCursor }).openapi("AgentEventList");

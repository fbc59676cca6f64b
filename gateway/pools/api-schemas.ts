// The pools API's schemas: the bodies its routes validate and the answers they give, as the OpenAPI document names them.
import { z } from "../../lib/api.ts";
import { objectError } from "../proxy/policy.ts";
import { AgentSchema, imageRefPattern } from "../agents/api-schemas.ts";
import { maxAcquireWaitMs } from "./keeper.ts";

/** How many ready agents a pool may keep, and how many agents it may hold in all. */
export const maxPoolSize = 100;
export const maxPoolMaxSize = 1000;

function intIn(min: number, max: number, description: string) {
  const message = `must be an integer from ${min} to ${max}`;
  return z.number({ error: message }).int({ error: message }).min(min, { error: message }).max(max, { error: message }).openapi({ description });
}

export const CreatePoolBody = z
  .strictObject(
    {
      name: z
        .string({ error: "must be 1–100 letters, digits, spaces or . _ : -" })
        .regex(/^[\w .:-]{1,100}$/, { error: "must be 1–100 letters, digits, spaces or . _ : -" })
        .optional()
        .openapi({ description: "Unique among the tenant's live pools (default: the pool's id); its agents are named after it" }),
      fromCheckpoint: z.string({ error: "must be a checkpoint id (ckp_…) or agt_…:name" }).min(1).max(200).optional().openapi({
        description: "The checkpoint every agent of the pool is forked from and reset to: its id (`ckp_…`), or `agt_…:name` (an agent's checkpoint by name)",
        example: "ckp_0123456789abcdef",
      }),
      image: z
        .string({ error: "must be a built-in image, name[:tag] of a built image, or sha256:<digest>" })
        .regex(imageRefPattern, { error: "must be a built-in image, name[:tag] of a built image, or sha256:<digest>" })
        .optional()
        .openapi({
          description:
            "Instead of `fromCheckpoint`: an agent is created from the image, woken (it boots), checkpointed and hibernated; the pool forks that checkpoint (the agent is kept: deleting it deletes its checkpoint)",
        }),
      size: intIn(0, maxPoolSize, "How many ready agents (hibernated forks) the pool keeps"),
      maxSize: intIn(1, maxPoolMaxSize, "How many agents it may hold in all, handed out or ready (default: `size`, at least 1)").optional(),
    },
    { error: objectError("a JSON object {name?, fromCheckpoint | image, size, maxSize?}") },
  )
  .openapi("CreatePool");

export const ResizePoolBody = z
  .strictObject(
    {
      size: intIn(0, maxPoolSize, "How many ready agents the pool keeps from now (more: forked at once; fewer: the surplus ready ones deleted)").optional(),
      maxSize: intIn(1, maxPoolMaxSize, "How many agents it may hold in all from now (handed-out ones are never taken back)").optional(),
    },
    { error: objectError("a JSON object {size?, maxSize?}") },
  )
  .openapi("ResizePool");

/** How long an acquire waits by default for an agent being made ready, ms. */
export const defaultAcquireWaitMs = 10_000;

export const AcquireQuery = z.strictObject({
  waitMs: z
    .string({ error: `must be an integer from 0 to ${maxAcquireWaitMs}` })
    .regex(/^\d{1,6}$/, { error: `must be an integer from 0 to ${maxAcquireWaitMs}` })
    .transform(Number)
    .refine((n) => n <= maxAcquireWaitMs, { error: `must be an integer from 0 to ${maxAcquireWaitMs}` })
    .optional()
    .openapi({
      type: "integer",
      description: `When none is ready and the pool is at maxSize with agents being made ready: how long to wait for one, ms (default ${defaultAcquireWaitMs}, at most ${maxAcquireWaitMs}; 0: 409 at once)`,
    }),
});

export const ReleaseBody = z
  .strictObject(
    { agentId: z.string({ error: "must be an agent id (agt_…)" }).min(1).max(200).openapi({ example: "agt_0123456789abcdef" }) },
    { error: objectError("a JSON object {agentId}") },
  )
  .openapi("ReleasePoolAgent");

export const PoolParams = z.object({
  id: z.string().openapi({ param: { name: "id", in: "path" }, example: "pol_0123456789abcdef" }),
});

export const PoolSchema = z
  .object({
    id: z.string().openapi({ example: "pol_0123456789abcdef" }),
    name: z.string(),
    fromCheckpoint: z.string().openapi({ description: "The checkpoint its agents are forked from and reset to" }),
    size: z.number().int().openapi({ description: "How many ready agents it keeps" }),
    maxSize: z.number().int().openapi({ description: "How many agents it may hold in all" }),
    ready: z.number().int().openapi({ description: "Agents waiting to be handed out (hibernated)" }),
    inUse: z.number().int().openapi({ description: "Agents handed out" }),
    resetting: z.number().int().openapi({ description: "Agents being made ready: forked by the top-up, or reset after a release" }),
    state: z.enum(["active", "deleting"]),
    createdAt: z.iso.datetime(),
  })
  .openapi("Pool");

export const PoolListSchema = z.object({ pools: z.array(PoolSchema) }).openapi("PoolList");
export const PoolDeletedSchema = z
  .object({
    id: z.string(),
    deleted: z.literal(true),
    removed: z.number().int().openapi({ description: "Its agents that were not handed out, deleted with it" }),
    leftInUse: z.number().int().openapi({ description: "Its handed-out agents, left to their holders (ordinary agents now: delete them when done)" }),
  })
  .openapi("PoolDeleted");

export const AcquiredSchema = z
  .object({
    agent: AgentSchema,
    pool: z.string().openapi({ example: "pol_0123456789abcdef" }),
    forked: z.boolean().openapi({ description: "true: none was ready, so this one was forked for the call (the pool was below maxSize)" }),
  })
  .openapi("PoolAcquired");

export const ReleasedSchema = z
  .object({ agent: AgentSchema, resetMs: z.number().int().openapi({ description: "How long its reset to the pool's checkpoint took, ms" }) })
  .openapi("PoolReleased");

export const ResetSchema = z
  .object({
    agent: AgentSchema,
    checkpointId: z.string().openapi({ description: "The checkpoint it was rolled back to (`forkedFrom`)" }),
    resetMs: z.number().int().openapi({ description: "How long the roll-back took, ms (its next call wakes it from the checkpoint)" }),
  })
  .openapi("AgentReset");

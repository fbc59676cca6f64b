// The checkpoints API's schemas: the bodies and queries its routes validate and the answers they give, as the OpenAPI document names them.
import { NextCursor, PageQuery, z } from "../../lib/api.ts";
import { objectError } from "../proxy/policy.ts";
import { checkpointNamePattern } from "../../contracts/fleet.ts";

const nameHint = "1–100 letters, digits or . _ : -, starting with a letter or digit, not with ckp_";

export const checkpointName = () =>
  z
    .string({ error: `must be ${nameHint}` })
    .regex(checkpointNamePattern, { error: `must be ${nameHint}` })
    .openapi({ description: "Unique among the agent's live checkpoints", example: "clean" });

/** A checkpoint id (`ckp_…`) in a body; the route answers 404 for one that is not the caller's. */
export const checkpointRef = (description: string) =>
  z.string({ error: "must be a checkpoint id (ckp_…)" }).min(1).max(200).openapi({ description, example: "ckp_0123456789abcdef" });

export const CreateCheckpointBody = z
  .strictObject({ name: checkpointName().optional() }, { error: objectError("a JSON object {name?}") })
  .openapi("CreateCheckpoint");

export const RestoreBody = z
  .strictObject(
    {
      checkpoint: z
        .string({ error: "must be a checkpoint id (ckp_…) or a name of this agent's" })
        .min(1)
        .max(200)
        .openapi({ description: "A checkpoint id (`ckp_…`), or the name of one of this agent's", example: "clean" }),
    },
    { error: objectError("a JSON object {checkpoint}") },
  )
  .openapi("RestoreAgent");

export const CheckpointParams = z.object({
  id: z.string().openapi({ param: { name: "id", in: "path" }, example: "agt_0123456789abcdef" }),
  checkpointId: z.string().openapi({ param: { name: "checkpointId", in: "path" }, example: "ckp_0123456789abcdef" }),
});

export const CheckpointListQuery = z.strictObject({ ...PageQuery.shape });

export const CheckpointSchema = z
  .object({
    id: z.string().openapi({ example: "ckp_0123456789abcdef" }),
    agentId: z.string(),
    name: z.string().nullable(),
    origin: z.enum(["api", "guest"]).openapi({ description: "api = `POST …/checkpoints`; guest = the workload asked from inside its VM" }),
    bytes: z.number().int().openapi({ description: "What its files hold; billed as snapshot storage from its creation to its deletion" }),
    pausedMs: z.number().int().openapi({ description: "How long the agent was paused for it (0: taken from its snapshot while hibernated)" }),
    createdAt: z.iso.datetime(),
  })
  .openapi("Checkpoint");

export const CheckpointListSchema = z.object({ checkpoints: z.array(CheckpointSchema), nextCursor: NextCursor }).openapi("CheckpointList");
export const CheckpointDeletedSchema = z.object({ id: z.string(), deleted: z.literal(true) }).openapi("CheckpointDeleted");

// The operations API's schemas: an agent's calls through its tenant's upstreams as the API shows them (never a header the agent did not get back, never a body).
import { instantQuery, NextCursor, PageQuery, z } from "../../lib/api.ts";

export const OperationParams = z.object({
  id: z.string().openapi({ param: { name: "id", in: "path" }, example: "agt_0123456789abcdef" }),
  opId: z.string().openapi({ param: { name: "opId", in: "path" }, example: "op_0123456789abcdef" }),
});

export const operationStates = ["queued", "in_flight", "succeeded", "failed"] as const;

export const OperationListQuery = z.strictObject({
  ...PageQuery.shape,
  upstream: z.string().max(64).optional().openapi({ description: "Only calls through this upstream" }),
  state: z.enum(operationStates).optional().openapi({ description: "Only operations in this state" }),
  since: instantQuery("Only operations created at or after this instant"),
});

export const OperationSchema = z
  .object({
    id: z.string().openapi({ example: "op_0123456789abcdef" }),
    agentId: z.string(),
    runId: z.string().nullable().openapi({ description: "The agent's run when the call was made" }),
    upstream: z.string(),
    method: z.string(),
    path: z.string().openapi({ description: "The path and query below the upstream's base URL" }),
    requestHash: z.string().openapi({ description: "sha256 (hex) of the method, path, body, content-type and accept" }),
    idempotencyKey: z.string().nullable(),
    mode: z.enum(["sync", "async"]),
    state: z.enum(operationStates),
    status: z.number().int().nullable().openapi({ description: "The upstream's status (null: no answer; `error` says why)" }),
    error: z.object({ code: z.string(), message: z.string() }).nullable(),
    sentAt: z.iso.datetime().nullable(),
    firstByteAt: z.iso.datetime().nullable(),
    endedAt: z.iso.datetime().nullable(),
    durationMs: z.number().int().nullable().openapi({ description: "From sent to the answer's end" }),
    requestBytes: z.number().int(),
    responseBytes: z.number().int(),
    model: z.string().nullable().openapi({ description: "An OpenAI- or Anthropic-style completion's model" }),
    inputTokens: z.number().int().nullable(),
    outputTokens: z.number().int().nullable(),
    requestBodyKept: z.boolean().openapi({ description: "The request body is kept (up to UPSTREAM_KEEP_BODY_BYTES)" }),
    responseBodyKept: z.boolean().openapi({ description: "The response body is kept: a retry with the same Idempotency-Key is answered from it" }),
    createdAt: z.iso.datetime(),
  })
  .openapi("Operation");

export const OperationDetailSchema = OperationSchema.extend({
  responseHeaders: z
    .array(z.tuple([z.string(), z.string()]))
    .nullable()
    .openapi({ description: "The response's headers as the agent got them (hop-by-hop removed)" }),
}).openapi("OperationDetail");

export const OperationListSchema = z.object({ operations: z.array(OperationSchema), nextCursor: NextCursor }).openapi("OperationList");

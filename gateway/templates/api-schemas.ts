// The templates API's schemas: the warm templates new agents are cloned from, as the OpenAPI document names them.
import { z } from "../../lib/api.ts";

export const TemplateSchema = z
  .object({
    hostId: z.string().openapi({ description: "The host that keeps it: a clone is made on the host of its template" }),
    key: z.string().openapi({
      description:
        "What it is a template of, hashed (image, memory, vCPUs, egress, hypervisor and guest versions): a change makes a new key, and a new template",
      example: "3f2a9c01d4e5b6a7",
    }),
    image: z.string().openapi({ description: "The agent image (`demo` or a digest)" }),
    memMiB: z.number().int(),
    vcpus: z.number().int(),
    allowEgress: z.boolean(),
    state: z.enum(["building", "ready", "failed"]).openapi({
      description:
        "building: its VM is booting or being checkpointed; ready: new agents of its kind are cloned from it; failed: its last build failed (tried again later)",
    }),
    createdAt: z.iso.datetime().optional().openapi({ description: "When it became ready" }),
    bytes: z.number().int().optional().openapi({ description: "Bytes its files hold (ready)" }),
    bootMs: z.number().optional().openapi({ description: "Its VM's cold boot, ms (ready): what a clone saves" }),
    error: z.string().optional().openapi({ description: "Why its last build failed (failed)" }),
  })
  .openapi("Template");

export const TemplateListSchema = z.object({ templates: z.array(TemplateSchema) }).openapi("TemplateList");

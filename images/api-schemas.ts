// The image API's parameters and answers as zod schemas: what validates a request is what /openapi.json shows.
import { NextCursor, PageQuery, z } from "../lib/api.ts";

const namePattern = /^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:\/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$/;
const tagPattern = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;
const filePattern = /^[\w][\w./-]{0,255}$/;

/** `POST /v1/images?name=&tag=&kind=&file=`: what the upload becomes. */
export const UploadQuery = z.strictObject({
  name: z
    .string({ error: (i) => (i.input === undefined ? "is required" : undefined) })
    .max(128, "must be at most 128 characters")
    .regex(namePattern, "must be lowercase letters, digits and . _ - separators, optionally with / (at most 128 characters)")
    .openapi({ description: "Image name (lowercase, `/` allowed)", example: "node-agent" }),
  tag: z
    .string()
    .regex(tagPattern, "must be 1–128 letters, digits, _ . - (not starting with . or -)")
    .default("latest")
    .openapi({ description: "Tag (default latest); an existing name:tag moves to the new digest", example: "v1" }),
  kind: z
    .enum(["containerfile", "archive"])
    .default("containerfile")
    .openapi({ description: "containerfile: the body is a tar of the build context; archive: an OCI archive or a `docker save` tarball" }),
  file: z
    .string()
    .regex(filePattern, "must be a relative path inside the build context")
    .refine((f) => !f.split("/").includes(".."), "must be a relative path inside the build context")
    .optional()
    .openapi({ description: "The Containerfile's path inside the context (default Containerfile, else Dockerfile)" }),
});

export const ImagesQuery = z.strictObject({ ...PageQuery.shape });

export const BuildLogQuery = z.strictObject({
  follow: z.enum(["true", "false"]).optional().openapi({ description: "true: stream the log until the build ends" }),
});

export const ImageIdParams = z.object({ id: z.string().openapi({ description: "Image id", example: "img_V1StGXR8Z5jdHi6B" }) });
export const BuildIdParams = z.object({ id: z.string().openapi({ description: "Build id", example: "bld_V1StGXR8Z5jdHi6B" }) });

export const ImageConfig = z
  .object({
    entrypoint: z.array(z.string()),
    cmd: z.array(z.string()),
    env: z.array(z.string()).openapi({ description: "KEY=value, in order" }),
    workdir: z.string(),
    user: z.string(),
    uid: z.number().int(),
    gid: z.number().int(),
    port: z.number().int().openapi({ description: "TCP port the agent serves HTTP on inside the VM" }),
    readyPath: z.string().optional().openapi({ description: "Readiness is an answer on this path rather than an open port" }),
  })
  .openapi("ImageConfig");

export const Image = z
  .object({
    id: z.string(),
    tenantId: z.string(),
    name: z.string(),
    tag: z.string(),
    digest: z.string().openapi({ description: "sha256:<hex> of the root filesystem image" }),
    sizeBytes: z.number().int(),
    config: ImageConfig,
    createdAt: z.string(),
  })
  .openapi("Image");

export const Build = z
  .object({
    id: z.string(),
    kind: z.enum(["containerfile", "archive"]),
    status: z.enum(["running", "succeeded", "failed"]),
    startedAt: z.string(),
    finishedAt: z.string().nullable(),
    digest: z.string().nullable(),
    error: z.object({ code: z.string(), message: z.string() }).nullable(),
    droppedEvents: z.number().int().openapi({ description: "Early events no longer kept (the full log is in the image's build.log)" }),
  })
  .openapi("ImageBuild");

export const ImageBuilt = z.object({ image: Image, build: Build }).openapi("ImageBuilt");
export const ImagePage = z.object({ images: z.array(Image), nextCursor: NextCursor }).openapi("ImagePage");
export const ImageDeleted = z.object({ id: z.string(), deleted: z.literal(true), filesRemoved: z.boolean() }).openapi("ImageDeleted");

// HTTP routes under /v1/images: build from a Containerfile or import an archive, list, show, delete, follow a build.
// Runtime-free: the build itself is the injected `ImageBuilder` (Node's is images/node-builder.ts).
import { createRoute } from "@hono/zod-openapi";
import type { Context } from "hono";
import { apiRouter, decodeCursor, errors, json, pageOf, z } from "../lib/api.ts";
import { AppError } from "../lib/errors.ts";
import { isId, newId } from "../lib/ids.ts";
import type { Logger } from "../lib/log.ts";
import { requireScope, scopeGate, type Caller, type GatewayEnv } from "../contracts/caller.ts";
import { type AuditLog, callerAction } from "../schema/audit-log.ts";
import { Build, BuildIdParams, BuildLogQuery, ImageBuilt, ImageDeleted, ImageIdParams, ImagePage, ImagesQuery, Image, UploadQuery } from "./api-schemas.ts";
import { eventText, type BuildRecord, type ImageBuilder } from "./builds.ts";
import { imageRecord, type ImageRepo, type ImageRow } from "./repo.ts";

export interface ImageRoutesDeps {
  repo: ImageRepo;
  /** Absent where this gateway cannot build (a Worker): listing and deleting rows still work. */
  builder?: ImageBuilder;
  audit: AuditLog;
  log: Logger;
  /** Largest upload (build context or archive), bytes. */
  maxUploadBytes: number;
}

const ndjson = "application/x-ndjson";
const tags = ["images"];
const binary = z.string().openapi({ format: "binary" });

/** The record's own view (images/builds.ts), in the shape the document gives it. */
const buildJson = (build: BuildRecord) => build.view() as z.infer<typeof Build>;

const uploadRoute = createRoute({
  method: "post",
  middleware: [scopeGate("images:write")],
  path: "/v1/images",
  operationId: "createImage",
  summary: "Build an image from a tar of a build context (Containerfile), or import an OCI / docker save archive",
  description:
    'Waits and answers 201 with the image, or 422 build_failed / 400 bad_archive with the reason. With `Accept: application/x-ndjson` it streams the build\'s events instead, one JSON object a line: first `{type:"build"}`, then step/log/progress events, last `{type:"image"}` or `{type:"error"}`.',
  tags,
  request: {
    query: UploadQuery,
    body: {
      required: true,
      description: "The build context as a tar, or the image archive",
      content: { "application/x-tar": { schema: binary }, "application/octet-stream": { schema: binary } },
    },
  },
  responses: {
    201: { description: "Built and registered", headers: z.object({ "x-build-id": z.string() }), content: { "application/json": { schema: ImageBuilt } } },
    200: {
      description: "The build's events as NDJSON (with Accept: application/x-ndjson)",
      headers: z.object({ "x-build-id": z.string() }),
      content: { [ndjson]: { schema: z.string().openapi({ description: "One JSON object a line" }) } },
    },
    ...errors(400, 405, 413, 422),
  },
});

const listRoute = createRoute({
  method: "get",
  middleware: [scopeGate("images:read")],
  path: "/v1/images",
  operationId: "listImages",
  summary: "The tenant's images, by name then tag",
  tags,
  request: { query: ImagesQuery },
  responses: { 200: json(ImagePage, "A page of images"), ...errors(400) },
});

const buildRoute = createRoute({
  method: "get",
  middleware: [scopeGate("images:read")],
  path: "/v1/images/builds/{id}",
  operationId: "getImageBuild",
  summary: "A build's status (builds are kept in this process's memory)",
  tags,
  request: { params: BuildIdParams },
  responses: { 200: json(Build, "The build"), ...errors(400, 404, 405) },
});

const buildLogRoute = createRoute({
  method: "get",
  middleware: [scopeGate("images:read")],
  path: "/v1/images/builds/{id}/log",
  operationId: "getImageBuildLog",
  summary: "A build's log as text; with follow=true it streams until the build ends",
  tags,
  request: { params: BuildIdParams, query: BuildLogQuery },
  responses: { 200: { description: "The log, a line per event", content: { "text/plain": { schema: z.string() } } }, ...errors(400, 404, 405) },
});

const getRoute = createRoute({
  method: "get",
  middleware: [scopeGate("images:read")],
  path: "/v1/images/{id}",
  operationId: "getImage",
  summary: "One image",
  tags,
  request: { params: ImageIdParams },
  responses: { 200: json(Image, "The image"), ...errors(400, 404) },
});

const deleteRoute = createRoute({
  method: "delete",
  middleware: [scopeGate("images:write")],
  path: "/v1/images/{id}",
  operationId: "deleteImage",
  summary: "Delete the tag; the files go when no tag names the digest (409 while a live agent runs the last one)",
  tags,
  request: { params: ImageIdParams },
  responses: { 200: json(ImageDeleted, "Deleted"), ...errors(400, 404, 409) },
});

/** An images cursor: the name and tag of the last image shown. */
function imagePosition(cursor: string): { name: string; tag: string } {
  const [name, tag] = decodeCursor(cursor, ["string", "string"]) as [string, string];
  return { name, tag };
}

export function createImageRoutes(deps: ImageRoutesDeps) {
  const r = apiRouter<GatewayEnv>();
  const { repo, builder } = deps;
  const encoder = new TextEncoder();

  function needBuilder(): ImageBuilder {
    if (!builder) throw new AppError("method_not_allowed", "this gateway builds no images (build through a Node gateway beside a host)");
    return builder;
  }

  async function ownImage(id: string, caller: Caller): Promise<ImageRow> {
    if (!isId("image", id)) throw new AppError("invalid_id", `"${id.slice(0, 64)}" is not an image id`);
    const row = await repo.get(id);
    if (!row || row.tenantId !== caller.tenantId) throw new AppError("not_found", `image ${id} not found`);
    return row;
  }

  function ownBuild(id: string, caller: Caller): BuildRecord {
    if (!isId("build", id)) throw new AppError("invalid_id", `"${id.slice(0, 64)}" is not a build id`);
    const build = needBuilder().get(id);
    if (!build || build.tenantId !== caller.tenantId) throw new AppError("not_found", `build ${id} not found`);
    return build;
  }

  function audit(c: Context<GatewayEnv>, caller: Caller, action: string, target: string, detail?: Record<string, unknown>) {
    return deps.audit.record(callerAction(caller, c.get("requestId"), action, target, detail));
  }

  r.openapi(uploadRoute, async (c) => {
    const caller = requireScope(c, "images:write");
    const b = needBuilder();
    const { name, tag, kind, file } = c.req.valid("query");
    const declared = Number(c.req.header("content-length") ?? "0");
    if (declared > deps.maxUploadBytes) throw new AppError("payload_too_large", `upload exceeds ${deps.maxUploadBytes} bytes`);
    const body = c.req.raw.body;
    if (!body) throw new AppError("bad_request", kind === "archive" ? "the body must be the image archive" : "the body must be a tar of the build context");

    const build = b.start({ tenantId: caller.tenantId, kind, ...(file ? { file } : {}), body, maxBytes: deps.maxUploadBytes });
    deps.log.info("image build started", { requestId: c.get("requestId"), buildId: build.id, tenantId: caller.tenantId, name, tag, kind });
    // Registered when the build succeeds, whether or not the caller is still there: the row comes after the files.
    const registered = build.done.then(async (artifact) => {
      const row = await repo.put({
        id: newId("image"),
        tenantId: caller.tenantId,
        name,
        tag,
        digest: artifact.digest,
        sizeBytes: artifact.sizeBytes,
        config: artifact.config,
        source: kind,
        buildId: build.id,
      });
      await audit(c, caller, "image.create", row.id, { name, tag, digest: artifact.digest, buildId: build.id });
      deps.log.info("image registered", { buildId: build.id, imageId: row.id, digest: artifact.digest, sizeBytes: artifact.sizeBytes });
      return row;
    });
    registered.catch((err) =>
      deps.log.info("image build failed", {
        requestId: c.get("requestId"),
        buildId: build.id,
        code: err instanceof AppError ? err.code : "internal",
        err: err instanceof Error ? err.message : String(err),
      }),
    );

    if ((c.req.header("accept") ?? "").includes(ndjson)) {
      const requestId = c.get("requestId");
      const line = (v: unknown) => encoder.encode(`${JSON.stringify(v)}\n`);
      const stream = new ReadableStream<Uint8Array>({
        async start(controller) {
          controller.enqueue(line({ type: "build", build: build.view() }));
          for await (const e of build.follow()) controller.enqueue(line(e));
          try {
            controller.enqueue(line({ type: "image", image: imageRecord(await registered) }));
          } catch (err) {
            const e = err instanceof AppError ? err : new AppError("internal", "image build failed");
            controller.enqueue(line({ type: "error", error: { code: e.code, message: e.message, requestId } }));
          }
          controller.close();
        },
      });
      // A stream: the typed helpers only build whole bodies (and read application/x-ndjson as no answer at all).
      return new Response(stream, { status: 200, headers: { "content-type": `${ndjson}; charset=utf-8`, "x-build-id": build.id } }) as never;
    }
    const row = await registered;
    return c.json({ image: imageRecord(row), build: buildJson(build) }, 201, { "x-build-id": build.id });
  });

  r.openapi(listRoute, async (c) => {
    const caller = requireScope(c, "images:read");
    const { limit, cursor } = c.req.valid("query");
    const rows = await repo.list(caller.tenantId, { limit: limit + 1, ...(cursor !== undefined ? { after: imagePosition(cursor) } : {}) });
    const page = pageOf(rows, limit, (i) => [i.name, i.tag]);
    return c.json({ images: page.items.map(imageRecord), nextCursor: page.nextCursor }, 200);
  });

  r.openapi(buildRoute, (c) => c.json(buildJson(ownBuild(c.req.valid("param").id, requireScope(c, "images:read"))), 200));

  r.openapi(buildLogRoute, (c) => {
    const build = ownBuild(c.req.valid("param").id, requireScope(c, "images:read"));
    if (c.req.valid("query").follow !== "true")
      return c.text(
        build
          .events()
          .map((e) => `${eventText(e)}\n`)
          .join(""),
        200,
      );
    const signal = c.req.raw.signal;
    const stream = new ReadableStream<Uint8Array>({
      async start(controller) {
        for await (const e of build.follow(signal)) controller.enqueue(encoder.encode(`${eventText(e)}\n`));
        controller.close();
      },
    });
    // A streamed text answer: the typed helpers only build whole bodies.
    return new Response(stream, { headers: { "content-type": "text/plain; charset=utf-8" } }) as never;
  });

  r.openapi(getRoute, async (c) => c.json(imageRecord(await ownImage(c.req.valid("param").id, requireScope(c, "images:read"))), 200));

  /** Deletes the tag; the files go when no row names the digest and no live agent runs it (409 while one does). */
  r.openapi(deleteRoute, async (c) => {
    const caller = requireScope(c, "images:write");
    const row = await ownImage(c.req.valid("param").id, caller);
    const otherRows = (await repo.rowsWithDigest(row.digest)) - 1;
    const agentsUsing = await repo.agentsWithDigest(row.digest);
    if (otherRows === 0 && agentsUsing > 0)
      throw new AppError("conflict", `image ${row.id} (${row.digest}) is used by ${agentsUsing} agent(s): delete them first`);
    await repo.remove(row.id);
    if (otherRows === 0 && builder) await builder.removeFiles(row.digest);
    await audit(c, caller, "image.delete", row.id, { name: row.name, tag: row.tag, digest: row.digest });
    return c.json({ id: row.id, deleted: true as const, filesRemoved: otherRows === 0 && builder !== undefined }, 200);
  });

  return r;
}

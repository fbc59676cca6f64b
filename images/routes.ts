// HTTP routes under /v1/images: build from a Containerfile or import an archive, list, show, delete, follow a build.
// Runtime-free: the build itself is the injected `ImageBuilder` (Node's is images/node-builder.ts).
import { Hono, type Context } from "hono";
import { AppError } from "../lib/errors.ts";
import { isId, newId } from "../lib/ids.ts";
import type { Logger } from "../lib/log.ts";
import { requireScope, type Caller, type GatewayEnv } from "../contracts/caller.ts";
import type { AuditLog } from "../schema/audit-log.ts";
import { eventText, type BuildKind, type BuildRecord, type ImageBuilder } from "./builds.ts";
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

const namePattern = /^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:\/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$/;
const tagPattern = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;
const filePattern = /^[\w][\w./-]{0,255}$/;
const ndjson = "application/x-ndjson";

export function createImageRoutes(deps: ImageRoutesDeps): Hono<GatewayEnv> {
  const r = new Hono<GatewayEnv>();
  const { repo, builder } = deps;
  const encoder = new TextEncoder();

  function needBuilder(): ImageBuilder {
    if (!builder) throw new AppError("method_not_allowed", "this gateway builds no images (build through a Node gateway beside a host)");
    return builder;
  }

  async function ownImage(c: Context<GatewayEnv>, caller: Caller): Promise<ImageRow> {
    const id = c.req.param("id") ?? "";
    if (!isId("image", id)) throw new AppError("invalid_id", `"${id.slice(0, 64)}" is not an image id`);
    const row = await repo.get(id);
    if (!row || row.tenantId !== caller.tenantId) throw new AppError("not_found", `image ${id} not found`);
    return row;
  }

  function ownBuild(c: Context<GatewayEnv>, caller: Caller): BuildRecord {
    const id = c.req.param("id") ?? "";
    if (!isId("build", id)) throw new AppError("invalid_id", `"${id.slice(0, 64)}" is not a build id`);
    const build = needBuilder().get(id);
    if (!build || build.tenantId !== caller.tenantId) throw new AppError("not_found", `build ${id} not found`);
    return build;
  }

  function audit(c: Context<GatewayEnv>, caller: Caller, action: string, target: string, detail?: Record<string, unknown>) {
    return deps.audit.record({ tenantId: caller.tenantId, actor: caller.subject, action, target, requestId: c.get("requestId"), ...(detail ? { detail } : {}) });
  }

  /**
   * `POST /v1/images?name=&tag=&kind=containerfile|archive&file=`: the body is a tar of the build context or the
   * archive. Waits and answers 201 with the image (422 build_failed / 400 bad_archive with the reason); with
   * `Accept: application/x-ndjson` it streams the build's events, one JSON object per line, the last `image` or `error`.
   */
  r.post("/v1/images", async (c) => {
    const caller = requireScope(c, "agents:admin");
    const b = needBuilder();
    const name = c.req.query("name") ?? "";
    if (!namePattern.test(name) || name.length > 128) throw new AppError("bad_request", "name must be lowercase letters, digits and . _ - separators, optionally with / (at most 128 characters)");
    const tag = c.req.query("tag") ?? "latest";
    if (!tagPattern.test(tag)) throw new AppError("bad_request", "tag must be 1–128 letters, digits, _ . - (not starting with . or -)");
    const kind = (c.req.query("kind") ?? "containerfile") as BuildKind;
    if (kind !== "containerfile" && kind !== "archive") throw new AppError("bad_request", "kind must be containerfile or archive");
    const file = c.req.query("file");
    if (file !== undefined && (!filePattern.test(file) || file.split("/").includes(".."))) throw new AppError("bad_request", "file must be a relative path inside the build context");
    const declared = Number(c.req.header("content-length") ?? "0");
    if (declared > deps.maxUploadBytes) throw new AppError("payload_too_large", `upload exceeds ${deps.maxUploadBytes} bytes`);
    const body = c.req.raw.body;
    if (!body) throw new AppError("bad_request", kind === "archive" ? "the body must be the image archive" : "the body must be a tar of the build context");

    const build = b.start({ tenantId: caller.tenantId, kind, ...(file ? { file } : {}), body, maxBytes: deps.maxUploadBytes });
    deps.log.info("image build started", { requestId: c.get("requestId"), buildId: build.id, tenantId: caller.tenantId, name, tag, kind });
    // Registered when the build succeeds, whether or not the caller is still there: the row comes after the files.
    const registered = build.done.then(async (artifact) => {
      const row = await repo.put({ id: newId("image"), tenantId: caller.tenantId, name, tag, digest: artifact.digest, sizeBytes: artifact.sizeBytes, config: artifact.config, source: kind, buildId: build.id });
      await audit(c, caller, "image.create", row.id, { name, tag, digest: artifact.digest, buildId: build.id });
      deps.log.info("image registered", { buildId: build.id, imageId: row.id, digest: artifact.digest, sizeBytes: artifact.sizeBytes });
      return row;
    });
    registered.catch((err) => deps.log.info("image build failed", { requestId: c.get("requestId"), buildId: build.id, code: err instanceof AppError ? err.code : "internal", err: err instanceof Error ? err.message : String(err) }));

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
      return new Response(stream, { status: 200, headers: { "content-type": `${ndjson}; charset=utf-8`, "x-build-id": build.id } });
    }
    const row = await registered;
    return c.json({ image: imageRecord(row), build: build.view() }, 201, { "x-build-id": build.id });
  });

  r.get("/v1/images", async (c) => {
    const caller = requireScope(c, "agents:admin");
    return c.json({ images: (await repo.list(caller.tenantId)).map(imageRecord) });
  });

  r.get("/v1/images/builds/:id", (c) => c.json(ownBuild(c, requireScope(c, "agents:admin")).view()));

  /** The build's log as text; with `follow=true` it streams until the build ends. */
  r.get("/v1/images/builds/:id/log", (c) => {
    const build = ownBuild(c, requireScope(c, "agents:admin"));
    if (c.req.query("follow") !== "true") return c.text(build.events().map((e) => `${eventText(e)}\n`).join(""));
    const signal = c.req.raw.signal;
    const stream = new ReadableStream<Uint8Array>({
      async start(controller) {
        for await (const e of build.follow(signal)) controller.enqueue(encoder.encode(`${eventText(e)}\n`));
        controller.close();
      },
    });
    return new Response(stream, { headers: { "content-type": "text/plain; charset=utf-8" } });
  });

  r.get("/v1/images/:id", async (c) => c.json(imageRecord(await ownImage(c, requireScope(c, "agents:admin")))));

  /** Deletes the tag; the files go when no row names the digest and no live agent runs it (409 while one does). */
  r.delete("/v1/images/:id", async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownImage(c, caller);
    const otherRows = (await repo.rowsWithDigest(row.digest)) - 1;
    const agentsUsing = await repo.agentsWithDigest(row.digest);
    if (otherRows === 0 && agentsUsing > 0) throw new AppError("conflict", `image ${row.id} (${row.digest}) is used by ${agentsUsing} agent(s): delete them first`);
    await repo.remove(row.id);
    if (otherRows === 0 && builder) await builder.removeFiles(row.digest);
    await audit(c, caller, "image.delete", row.id, { name: row.name, tag: row.tag, digest: row.digest });
    return c.json({ id: row.id, deleted: true, filesRemoved: otherRows === 0 && builder !== undefined });
  });

  return r;
}

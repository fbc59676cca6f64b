// `agentvm images ls|build|import|rm`: agent images, built from a directory or imported from an archive, with the build's progress.
import { existsSync, statSync } from "node:fs";
import { basename, resolve } from "node:path";
import type { Command } from "commander";
import { errorStatus, type ErrorCode } from "../lib/errors.ts";
import type { components } from "../contracts/api/types.ts";
import { fetchFailure, ok } from "./client.ts";
import { contextOf, type Context } from "./context.ts";
import { formatDuration } from "./duration.ts";
import { CliError, exitCodes, usageError } from "./exit.ts";
import { buildEventText, fileStream, imageName, mib, ndjson, tarDirectory, type BuildStreamEvent } from "./image-upload.ts";
import { duration, integer } from "./options.ts";
import { startProgress } from "./progress.ts";
import { shortTime } from "./agents.ts";

type Image = components["schemas"]["Image"];

/** An error line of the build stream as the exit code its status means. */
function buildFailure(e: { code: string; message: string; requestId: string }): CliError {
  const status = errorStatus[e.code as ErrorCode] ?? 500;
  return new CliError(status < 500 ? exitCodes.api : exitCodes.server, `error ${e.code}: ${e.message} (request ${e.requestId})`);
}

/** Streams the upload, shows the build's events as they come, and answers the image (or throws the build's error). */
async function upload(
  ctx: Context,
  body: ReadableStream<Uint8Array>,
  q: { name: string; tag: string; kind: "containerfile" | "archive"; file?: string | undefined },
  timeoutMs: number | undefined,
): Promise<void> {
  const api = ctx.api();
  const progress = ctx.json ? undefined : startProgress(`${q.kind === "archive" ? "importing" : "building"} ${q.name}:${q.tag}`);
  const signal = timeoutMs === undefined ? undefined : AbortSignal.timeout(timeoutMs);
  try {
    const stream = ok(
      await api.POST("/v1/images", {
        params: { query: { name: q.name, tag: q.tag, kind: q.kind, ...(q.file ? { file: q.file } : {}) } },
        // The document types a binary body as a string; the upload is a stream, sent as it is, never buffered.
        body: body as unknown as string,
        bodySerializer: (b: unknown) => b as BodyInit,
        headers: { "content-type": "application/x-tar", accept: "application/x-ndjson" },
        parseAs: "stream",
        duplex: "half",
        ...(signal ? { signal } : {}),
      }),
    );
    if (!stream) throw new CliError(exitCodes.server, "the gateway answered the upload without a body");
    let image: Extract<BuildStreamEvent, { type: "image" }>["image"] | undefined;
    for await (const { value: e, line } of ndjson<BuildStreamEvent>(stream)) {
      if (ctx.json) process.stdout.write(`${line}\n`);
      if (e.type === "error") throw buildFailure(e.error);
      if (e.type === "image") image = e.image;
      else if (e.type === "build") progress?.line(`build ${e.build.id}`);
      else progress?.line(buildEventText(e));
    }
    if (!image) throw new CliError(exitCodes.server, "the build stream ended without an image or an error");
    const took = progress ? ` in ${formatDuration(progress.elapsedMs())}` : "";
    progress?.done();
    if (!ctx.json) ctx.print(`image ${image.id} ${image.name}:${image.tag} ${image.digest} ${mib(image.sizeBytes)}${took}`);
  } catch (err) {
    progress?.done();
    throw fetchFailure(err, ctx.config);
  }
}

export function imagesCommand(program: Command): void {
  const images = program.command("images").description("agent images: build from a directory, import an archive, list, remove");

  images
    .command("ls")
    .description("list your images (every page)")
    .option("--limit <n>", "at most this many images", integer(1, 1_000_000))
    .action(async (o: { limit?: number }, cmd: Command) => {
      const ctx = contextOf(cmd);
      const api = ctx.api();
      const listed = await ctx.all(async (cursor, limit) => {
        const page = ok(await api.GET("/v1/images", { params: { query: { limit, ...(cursor ? { cursor } : {}) } } }));
        return { items: page.images, nextCursor: page.nextCursor };
      }, o.limit);
      if (ctx.json) return ctx.printJson({ images: listed.items, nextCursor: listed.nextCursor });
      ctx.printTable(
        [{ header: "ID" }, { header: "NAME", shrink: true }, { header: "DIGEST" }, { header: "SIZE", align: "right" }, { header: "CREATED" }],
        listed.items.map((i: Image) => [i.id, `${i.name}:${i.tag}`, i.digest.slice(0, 19), mib(i.sizeBytes), shortTime(i.createdAt)]),
      );
    });

  images
    .command("build")
    .description("build an image from a directory holding a Containerfile or Dockerfile (sent as a tar)")
    .argument("<dir>", "the build context")
    .option("--name <name[:tag]>", "the image's name and tag (default: the directory's name, tag latest)")
    .option("--file <path>", "the Containerfile inside the context (default Containerfile, else Dockerfile)")
    .option("--timeout <duration>", "give up waiting after this long (exit 5; the build goes on)", duration)
    .action(async (dir: string, o: { name?: string; file?: string; timeout?: number }, cmd: Command) => {
      if (!existsSync(dir) || !statSync(dir).isDirectory()) throw usageError(`build needs a directory (the build context): ${dir} is none`);
      const ctx = contextOf(cmd);
      ctx.api(); // no token: fail before packing
      const { name, tag } = imageName(o.name, basename(resolve(dir)));
      await upload(ctx, tarDirectory(dir), { name, tag, kind: "containerfile", file: o.file }, o.timeout);
    });

  images
    .command("import")
    .description("import an OCI archive or a docker save tarball")
    .argument("<file>", "the archive")
    .option("--name <name[:tag]>", "the image's name and tag (default: the file's name, tag latest)")
    .option("--timeout <duration>", "give up waiting after this long (exit 5; the import goes on)", duration)
    .action(async (file: string, o: { name?: string; timeout?: number }, cmd: Command) => {
      if (!existsSync(file) || !statSync(file).isFile()) throw usageError(`import needs an archive file: ${file} is none`);
      const ctx = contextOf(cmd);
      ctx.api();
      const { name, tag } = imageName(o.name, basename(file));
      await upload(ctx, fileStream(file), { name, tag, kind: "archive" }, o.timeout);
    });

  images
    .command("rm")
    .description("delete an image (refused while a live agent runs it)")
    .argument("<id>", "the image's id (img_…)")
    .action(async (id: string, _o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      const gone = ok(await ctx.api().DELETE("/v1/images/{id}", { params: { path: { id } } }));
      if (ctx.json) ctx.printJson(gone);
      else ctx.print(`deleted ${gone.id}${gone.filesRemoved ? " (and its files)" : ""}`);
    });
}

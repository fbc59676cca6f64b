// The Node `ImageBuilder`: spools an upload to disk, unpacks a build context, runs images/build one build at a time.
import { spawn } from "node:child_process";
import { createWriteStream, rmSync } from "node:fs";
import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { Readable, Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { Clock } from "../lib/clock.ts";
import { AppError } from "../lib/errors.ts";
import { newId } from "../lib/ids.ts";
import type { Logger } from "../lib/log.ts";
import { buildImage, removeArtifact, sweepBuildah, sweepTemp, type ContainerfileRunner } from "./build/index.ts";
import { BuildRecord, type BuildUpload, type ImageBuilder } from "./builds.ts";
import { TenantTurns } from "./tenant-turns.ts";
import type { ImageArtifact } from "../contracts/image.ts";

export interface NodeImageBuilderOptions {
  /** Images go under `<dataDir>/images/` (the hosts on this machine read them there). */
  dataDir: string;
  /** Debian bases and buildah's storage, kept across runs (outside any project clone). */
  cacheDir: string;
  clock: Clock;
  log: Logger;
  /** Puts a built image into the shared artifact store, so every host can fetch it (images/build/host-images.ts); absent: no store. */
  publish?(artifact: ImageArtifact): Promise<void>;
  /**
   * Where a tenant's Containerfile runs (images/vm-build/: its builder microVM); absent or answering undefined: buildah
   * on this host.
   */
  runnerFor?(tenantId: string, buildId: string): Promise<ContainerfileRunner | undefined>;
}

/** Finished builds kept for `GET /v1/images/builds/{id}`; older ones are forgotten (their log stays beside the image). */
const KEPT_BUILDS = 100;

export function createNodeImageBuilder(opts: NodeImageBuilderOptions): ImageBuilder {
  const builds = new Map<string, BuildRecord>();
  const uploads = join(opts.dataDir, "images", "uploads");
  // What builds of an earlier process left (it died mid-build): half-written images, build results, uploads.
  const swept = sweepTemp(opts.dataDir);
  if (swept.length > 0) opts.log.info("removed half-built images an earlier process left", { dirs: swept.length });
  void sweepBuildah(opts.cacheDir).catch((err) =>
    opts.log.warn("sweeping buildah's storage failed", { err: err instanceof Error ? err.message : String(err) }),
  );
  rmSync(uploads, { recursive: true, force: true }); // synchronously: a build may start right after this

  // One build at a time (buildah, a builder VM and mke2fs are disk- and CPU-bound: two at once only make both slower),
  // taken from the tenants in turn.
  const turns = new TenantTurns();

  function forgetOld(): void {
    const finished = [...builds.values()].filter((b) => b.status !== "running");
    for (const b of finished.slice(0, Math.max(0, finished.length - KEPT_BUILDS))) builds.delete(b.id);
  }

  async function run(record: BuildRecord, upload: BuildUpload, spooled: Promise<string>): Promise<void> {
    const work = join(uploads, record.id);
    try {
      const file = await spooled;
      let input = file;
      if (upload.kind === "containerfile") {
        input = join(work, "context");
        await mkdir(input);
        record.emit({ type: "progress", phase: "build", text: "unpacking the build context" });
        await untar(file, input);
      }
      const runner = upload.kind === "containerfile" ? await opts.runnerFor?.(upload.tenantId, record.id) : undefined;
      if (upload.kind === "containerfile" && opts.runnerFor && !runner)
        record.emit({ type: "log", line: "agentvm: no host runs microVMs now: this build's steps run on the gateway's machine (IMAGE_BUILDS=auto)" });
      const artifact = await buildImage({
        ...(runner ? { runner } : {}),
        kind: upload.kind,
        input,
        ...(upload.file ? { file: upload.file } : {}),
        dataDir: opts.dataDir,
        cacheDir: opts.cacheDir,
        onEvent: (e) => record.emit(e),
      });
      if (opts.publish) {
        // Before the image's row exists: a host that sees the row finds the image in the store.
        record.emit({ type: "progress", phase: "store", text: "putting the image into the shared artifact store", bytes: artifact.sizeBytes });
        await opts.publish(artifact);
      }
      record.succeed(artifact, new Date(opts.clock.now()));
    } catch (err) {
      if (!(err instanceof AppError)) opts.log.error("image build crashed", { buildId: record.id, err: err instanceof Error ? err.stack : String(err) });
      record.fail(err, new Date(opts.clock.now()));
    } finally {
      await rm(work, { recursive: true, force: true });
      forgetOld();
    }
  }

  return {
    start(upload) {
      const record = new BuildRecord(newId("build"), upload.tenantId, upload.kind, new Date(opts.clock.now()));
      builds.set(record.id, record);
      // The upload is read now (the client is sending it); the build waits for its turn.
      const spooled = spool(upload, join(uploads, record.id));
      spooled.catch(() => undefined);
      record.emit({ type: "progress", phase: "build", text: "queued" });
      turns.add(upload.tenantId, () => run(record, upload, spooled));
      return record;
    },
    get(id) {
      return builds.get(id);
    },
    async removeFiles(digest) {
      removeArtifact(opts.dataDir, digest);
    },
  };
}

/** Writes the upload to `<dir>/upload`, failing with 413 past `maxBytes`. */
async function spool(upload: BuildUpload, dir: string): Promise<string> {
  await mkdir(dir, { recursive: true });
  const path = join(dir, "upload");
  let bytes = 0;
  const limit = new Transform({
    transform(chunk: Buffer, _enc, done) {
      bytes += chunk.length;
      if (bytes > upload.maxBytes) done(new AppError("payload_too_large", `upload exceeds ${upload.maxBytes} bytes`));
      else done(null, chunk);
    },
  });
  try {
    await pipeline(Readable.fromWeb(upload.body as import("node:stream/web").ReadableStream<Uint8Array>), limit, createWriteStream(path));
  } catch (err) {
    if (err instanceof AppError) throw err;
    throw new AppError("bad_request", `the upload did not arrive whole: ${(err as Error).message}`);
  }
  if (bytes === 0)
    throw new AppError("bad_request", upload.kind === "archive" ? "the body must be the image archive" : "the body must be a tar of the build context");
  return path;
}

/** Unpacks a build context (GNU tar refuses absolute names and `..` by itself); owners are not kept. */
function untar(file: string, into: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const p = spawn("tar", ["-x", "-f", file, "-C", into, "--no-same-owner", "--no-overwrite-dir"], { stdio: ["ignore", "ignore", "pipe"] });
    let err = "";
    p.stderr.on("data", (d: Buffer) => (err += d.toString()));
    p.on("error", (e) => reject(new AppError("internal", `tar could not run: ${e.message}`)));
    p.on("close", (code) =>
      code === 0 ? resolve() : reject(new AppError("bad_request", `the build context is not a readable tar: ${err.trim().split("\n").slice(-2).join("; ")}`)),
    );
  });
}

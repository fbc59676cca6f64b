// Builds an agent image from a Containerfile or imports one from an archive, into a content-addressed ext4 root filesystem.
import { randomBytes } from "node:crypto";
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, rmSync, statSync, writeSync } from "node:fs";
import { join, relative, resolve } from "node:path";
import { AppError } from "../../lib/errors.ts";
import type { ImageArtifact } from "../../contracts/image.ts";
import { importArchive } from "./archive.ts";
import { baseFor, ensureBase, fromImages, type BaseImage, type BaseSpec } from "./base.ts";
import { BUILD_REPO, buildahBuild, buildahPushLayout, buildahRemoveImage, buildahSetup, parseStep } from "./buildah.ts";
import type { BuildEvent } from "./events.ts";
import { makeRootfsImage } from "./rootfs.ts";
import { BUILD_LOG, commitArtifact, makeTempDir, ROOTFS_FILE } from "./store.ts";
import { requireTools, type ImageTool } from "./tools.ts";
import { imageConfigOf, readLayoutConfig, unpackLayout } from "./unpack.ts";

export type { BuildEvent } from "./events.ts";
export { ensureImageTools } from "./tools.ts";
export { readArtifact, removeArtifact, sweepTemp } from "./store.ts";
export { sweepBuildah } from "./buildah.ts";
export { bases, baseFor, ensureBase } from "./base.ts";

export interface BuildRequest {
  /** containerfile: `input` is a directory holding the build context; archive: `input` is the archive file (OCI or docker save, detected). */
  kind: "containerfile" | "archive";
  input: string;
  /** The Containerfile's name inside the context (default: Containerfile, else Dockerfile). */
  file?: string;
  /** Artifacts go under `<dataDir>/images/`. */
  dataDir: string;
  /** Bases and buildah's storage (outside the project clone, e.g. ~/.cache/agentvm). */
  cacheDir: string;
  onEvent?: (e: BuildEvent) => void;
  signal?: AbortSignal;
  /** Where a Containerfile's steps run: absent, buildah on this host; else the runner (a microVM: images/vm-build/). */
  runner?: ContainerfileRunner;
}

/** One Containerfile build handed to a runner. */
export interface ContainerfileJob {
  contextDir: string;
  /** The Containerfile's path inside the context. */
  containerfile: string;
  /** Our bases its FROM lines name, ready in this host's storage. */
  bases: BaseImage[];
  /** A directory of this build's own (removed with it). */
  work: string;
  emit: (e: BuildEvent) => void;
  signal?: AbortSignal;
}

/** Runs a Containerfile's steps elsewhere than on this host and answers the result as an OCI archive file. */
export interface ContainerfileRunner {
  build(job: ContainerfileJob): Promise<string>;
}

/** The reference the image gets inside the temporary OCI layout. */
const LAYOUT_REF = "img";

/** The Containerfile of a build context: the one named (inside the context), else Containerfile, else Dockerfile. */
export function containerfileOf(context: string, file?: string): string {
  const root = resolve(context);
  if (file !== undefined) {
    const path = resolve(root, file);
    const rel = relative(root, path);
    if (rel === "" || rel.startsWith("..") || rel.startsWith("/"))
      throw new AppError("build_failed", `the Containerfile ${file} is not inside the build context`);
    if (!existsSync(path) || !statSync(path).isFile()) throw new AppError("build_failed", `the build context has no file ${file}`);
    return path;
  }
  for (const name of ["Containerfile", "Dockerfile"]) if (existsSync(join(root, name)) && statSync(join(root, name)).isFile()) return join(root, name);
  throw new AppError("build_failed", "the build context has no Containerfile (nor Dockerfile) at its root");
}

/**
 * Builds or imports an image, then unpacks it, reads its config and makes its ext4 root filesystem, committed under
 * `<dataDir>/images/sha256/<hex>/` (rootfs.ext4, image.json, build.log); an image of the same digest already there
 * is answered as it is. Everything is staged in one temporary directory under `<dataDir>/images/`, removed on
 * success and failure, so a failed or interrupted build leaves nothing behind (and buildah's storage keeps nothing of
 * it). Errors: `build_failed` (the Containerfile or the image is at fault; the message ends with the log's tail),
 * `bad_archive` (not an image archive, or a corrupt one), `internal` (a tool is missing, the host failed); an abort
 * rejects with the signal's reason.
 */
export async function buildImage(req: BuildRequest): Promise<ImageArtifact> {
  // A runner's result is an archive, imported as an uploaded one is (skopeo).
  const reads: ImageTool[] = req.kind === "containerfile" ? ["buildah", ...(req.runner ? (["skopeo"] as const) : [])] : ["skopeo"];
  requireTools([...reads, "umoci", "mke2fs", "debugfs", "dumpe2fs"]);
  const tmp = makeTempDir(req.dataDir);
  const work = join(tmp, "work");
  mkdirSync(work);
  const logFd = openSync(join(tmp, BUILD_LOG), "a");
  const tail: string[] = [];
  const emit = (e: BuildEvent) => {
    const line =
      e.type === "log"
        ? e.line
        : e.type === "progress"
          ? `[${e.phase}] ${e.text ?? ""}${e.bytes !== undefined ? ` (${e.bytes} bytes)` : ""}`
          : `STEP ${e.step}/${e.total}: ${e.text}`;
    writeSync(logFd, `${line}\n`);
    tail.push(line);
    if (tail.length > 30) tail.shift();
    try {
      req.onEvent?.(e);
    } catch {
      // a listener's failure is not the build's
    }
  };
  const log = (line: string) => emit({ type: "log", line });
  const signal = req.signal ? { signal: req.signal } : {};
  let logOpen = true;
  const closeLog = () => {
    if (logOpen) closeSync(logFd);
    logOpen = false;
  };
  try {
    const layout = join(work, "layout");
    if (req.kind === "containerfile") {
      await buildContainerfile(req, layout, work, emit);
    } else {
      emit({ type: "progress", phase: "export", text: "reading the archive", bytes: statSync(req.input).size });
      const format = await importArchive({ file: req.input, layout, ref: LAYOUT_REF, tmpDir: join(work, "tmp"), onLine: log, ...signal });
      log(`agentvm: imported a${format === "oci-archive" ? "n OCI archive" : " docker save tarball"}`);
    }

    emit({ type: "progress", phase: "unpack", text: "unpacking the layers (umoci)" });
    const oci = readLayoutConfig(layout, LAYOUT_REF);
    const root = await unpackLayout(layout, LAYOUT_REF, join(work, "bundle"), { onLine: log, ...signal });
    rmSync(layout, { recursive: true, force: true }); // the layers are in the root now; free their space before mke2fs
    const config = imageConfigOf(oci, root);
    log(`agentvm: config ${JSON.stringify(config)}`);

    emit({ type: "progress", phase: "rootfs", text: "making the ext4 root filesystem" });
    // Layers and config: what the image is. The config is in the seed so that two images of the same files but
    // another CMD get different bytes, hence different digests (image.json is per digest).
    const seed = JSON.stringify({ layers: oci.rootfs?.diff_ids ?? [], config });
    const image = await makeRootfsImage({ dir: root, out: join(tmp, ROOTFS_FILE), seed, scratch: join(work, "debugfs.cmds"), onLine: log, ...signal });
    emit({ type: "progress", phase: "rootfs", text: image.digest, bytes: image.sizeBytes });
    rmSync(work, { recursive: true, force: true });
    closeLog();
    return commitArtifact(req.dataDir, tmp, { digest: image.digest, sizeBytes: image.sizeBytes, config });
  } catch (err) {
    closeLog();
    rmSync(tmp, { recursive: true, force: true });
    if (req.signal?.aborted) throw req.signal.reason;
    if (err instanceof AppError) throw err;
    throw new AppError("internal", `the image build failed: ${(err as Error).message}\n${tail.slice(-10).join("\n")}`, { cause: err });
  }
}

async function buildContainerfile(req: BuildRequest, layout: string, work: string, emit: (e: BuildEvent) => void): Promise<void> {
  const signal = req.signal ? { signal: req.signal } : {};
  const file = containerfileOf(req.input, req.file);
  const wanted = new Map<string, BaseSpec>();
  for (const ref of fromImages(readFileSync(file, "utf8"))) {
    const spec = baseFor(ref);
    if (spec) wanted.set(`${spec.repo}:${spec.tag}`, spec);
  }
  const bases: BaseImage[] = [];
  for (const spec of wanted.values()) {
    emit({ type: "progress", phase: "base", text: `${spec.repo}:${spec.tag}` });
    const base = await ensureBase(spec, { cacheDir: req.cacheDir, onEvent: emit, ...signal });
    emit({ type: "progress", phase: "base", text: `${base.name} ${base.built ? "built" : "cached"} (${base.key.slice(0, 12)})` });
    bases.push(base);
  }
  if (req.runner) {
    const archive = await req.runner.build({ contextDir: resolve(req.input), containerfile: relative(resolve(req.input), file), bases, work, emit, ...signal });
    emit({ type: "progress", phase: "export", text: "reading the built image", bytes: statSync(archive).size });
    await importArchive({ file: archive, layout, ref: LAYOUT_REF, tmpDir: join(work, "tmp"), onLine: (line) => emit({ type: "log", line }), ...signal });
    rmSync(archive, { force: true });
    return;
  }

  // TMPDIR inside this build's directory: whatever buildah stages goes when the build does.
  const setup = buildahSetup(req.cacheDir, join(work, "tmp"));
  const tag = `${BUILD_REPO}/${process.pid}-${randomBytes(6).toString("hex")}:latest`;
  emit({ type: "progress", phase: "build", text: `buildah bud -f ${relative(req.input, file)}` });
  try {
    await buildahBuild(setup, {
      contextDir: resolve(req.input),
      containerfile: file,
      tag,
      iidfile: join(work, "iid"),
      onLine: (line) => {
        // A step line is told once, as the step (a client shows it as `STEP n/m: …`), not again as a log line.
        const step = parseStep(line);
        emit(step ? { type: "step", ...step } : { type: "log", line });
      },
      ...signal,
    });
    emit({ type: "progress", phase: "export", text: "buildah push oci:" });
    await buildahPushLayout(setup, tag, layout, LAYOUT_REF, signal);
  } finally {
    // vfs storage grows by a full copy of the image per build: the result lives on as the ext4, not in buildah.
    await buildahRemoveImage(setup, tag).catch((err: unknown) => emit({ type: "log", line: `agentvm: buildah rmi ${tag}: ${(err as Error).message}` }));
  }
}

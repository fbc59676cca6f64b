// The builder's own image (images/builder/, as an agent image) and our bases as OCI archives for it: made on this host from Debian's packages and our files only, cached by their keys.
import { createHash } from "node:crypto";
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { ImageArtifact } from "../../contracts/image.ts";
import { baseFor, ensureBase, imageKey, type BaseImage } from "../build/base.ts";
import { buildahPushArchive, buildahSetup } from "../build/buildah.ts";
import type { BuildEvent } from "../build/events.ts";
import { buildImage } from "../build/index.ts";
import { commitArtifact, makeTempDir, readArtifact, ROOTFS_FILE } from "../build/store.ts";
import { takeLock } from "../../lib/node-lock.ts";

/** The builder image's build context (its Containerfile and build.sh). */
const builderContext = join(import.meta.dirname, "../builder");

export interface BuilderImageOptions {
  dataDir: string;
  cacheDir: string;
  onEvent?: (e: BuildEvent) => void;
  signal?: AbortSignal;
}

/**
 * The builder image in `dataDir`: built on this host from images/builder/ (our Containerfile: Debian's buildah, our
 * script; nothing of a tenant's) once per key (that context and the Debian base it starts from) into a data directory
 * of its own, `<cacheDir>/builder/<key>/` (its `digest` file written once the build is whole), and copied from there
 * into a data directory that lacks it (a copy of an ext4 file instead of a build).
 */
export async function ensureBuilderImage(opts: BuilderImageOptions): Promise<ImageArtifact> {
  const signal = opts.signal ? { signal: opts.signal } : {};
  const debian = await ensureBase(baseFor("agentvm/debian:bookworm")!, {
    cacheDir: opts.cacheDir,
    ...(opts.onEvent ? { onEvent: opts.onEvent } : {}),
    ...signal,
  });
  const hash = createHash("sha256").update(loadedKey(debian));
  for (const f of readdirSync(builderContext).sort()) hash.update(f).update(readFileSync(join(builderContext, f)));
  const kept = join(opts.cacheDir, "builder", hash.digest("hex").slice(0, 32));
  const digestFile = join(kept, "digest");
  mkdirSync(kept, { recursive: true });
  const release = await takeLock(`${kept}.lock`, signal);
  try {
    let built = existsSync(digestFile) ? readArtifact(kept, readFileSync(digestFile, "utf8").trim()) : undefined;
    if (!built) {
      opts.onEvent?.({ type: "progress", phase: "build", text: "building the builder's image on this host (once per version of it)" });
      built = await buildImage({ kind: "containerfile", input: builderContext, dataDir: kept, cacheDir: opts.cacheDir, ...signal });
      writeFileSync(digestFile, `${built.digest}\n`);
    }
    const present = readArtifact(opts.dataDir, built.digest);
    if (present) return present;
    const tmp = makeTempDir(opts.dataDir);
    cpSync(built.rootfs, join(tmp, ROOTFS_FILE));
    return commitArtifact(opts.dataDir, tmp, { digest: built.digest, sizeBytes: built.sizeBytes, config: built.config });
  } finally {
    release();
  }
}

/** The key a base is loaded under in a builder (the committed image's, which changes with its files and config too). */
export function loadedKey(base: BaseImage): string {
  return imageKey(base.spec, base.key);
}

/** The base as an OCI archive (gzip layers: it crosses into the VM), kept under `<cacheDir>/builder/bases/<key>.tar`. */
export async function baseArchive(base: BaseImage, cacheDir: string, signal?: AbortSignal): Promise<string> {
  const dir = join(cacheDir, "builder", "bases");
  const file = join(dir, `${loadedKey(base)}.tar`);
  if (existsSync(file)) return file;
  mkdirSync(dir, { recursive: true });
  const release = await takeLock(`${file}.lock`, signal ? { signal } : {});
  try {
    if (existsSync(file)) return file;
    const tmp = `${file}.tmp-${process.pid}`;
    rmSync(tmp, { force: true });
    await buildahPushArchive(buildahSetup(cacheDir), base.name, tmp, "oci-archive");
    renameSync(tmp, file);
    return file;
  } finally {
    release();
  }
}

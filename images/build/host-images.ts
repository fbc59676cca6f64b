// A host's built images: the ones under its data directory, fetched from the shared artifact store when one is missing,
// put into the store after a build, and trimmed to a size (least recently used first) where the store holds a copy.
import { readdirSync, rmSync, statSync, utimesSync } from "node:fs";
import { stat } from "node:fs/promises";
import { join } from "node:path";
import { AppError } from "../../lib/errors.ts";
import type { Logger } from "../../lib/log.ts";
import { imageDir, isImageDigest, type ImageArtifact, type ImageConfig } from "../../contracts/image.ts";
import { commitArtifact, IMAGE_JSON, imagesRoot, makeTempDir, readArtifact, removeArtifact, ROOTFS_FILE } from "./store.ts";

/** What this needs of the shared artifact store (fleet-agent/artifacts/dir-store.ts): content-addressed blobs. */
export interface ImageBlobs {
  put(path: string): Promise<{ digest: string; added: boolean }>;
  get(digest: string, dest: string, opts?: { cache?: boolean }): Promise<void>;
  has(digest: string): Promise<boolean>;
}

export interface HostImagesOptions {
  dataDir: string;
  /** The shared store; absent: images are only where they were built (nothing is fetched, published or trimmed). */
  blobs?: ImageBlobs;
  /** An image's config and size by digest (its row): what image.json holds, written beside a fetched root filesystem. */
  configOf?(digest: string): Promise<{ config: ImageConfig; sizeBytes: number } | undefined>;
  /** Images kept under the data directory past which the least recently used are removed (only with a store). */
  maxBytes: number;
  /** Digests the host's awake VMs run now: never trimmed. */
  inUse(): ReadonlySet<string>;
  log: Logger;
}

export interface HostImages {
  /** The image when it is whole under the data directory (never fetches). */
  locate(digest: string): ImageArtifact | undefined;
  /**
   * The image, fetched from the store first when it is not here (verified against its digest as it is read, one fetch per
   * digest at a time); marks it used. Undefined when it is neither here nor in the store.
   */
  ensure(digest: string): Promise<ImageArtifact | undefined>;
  /** Puts a built image's root filesystem into the store (no store: nothing). */
  publish(artifact: ImageArtifact): Promise<void>;
  /** Removes least recently used images until the rest fit `maxBytes`; answers the digests removed. */
  trim(): Promise<string[]>;
  /** Puts every image under the data directory that the store lacks into it (those built before there was a store). */
  publishAll(): Promise<number>;
}

export function createHostImages(o: HostImagesOptions): HostImages {
  const fetching = new Map<string, Promise<ImageArtifact | undefined>>();
  /** Images read whole once: a wake of one of them costs one `utimes`, not a read of image.json (the wake path). */
  const known = new Map<string, ImageArtifact>();
  let trimming: Promise<string[]> | undefined;

  /** Marks the image used now (image.json's mtime: the trim's "last used"); false when its files are gone. */
  const touch = (digest: string): boolean => {
    const now = new Date();
    try {
      utimesSync(join(imageDir(o.dataDir, digest), IMAGE_JSON), now, now);
      return true;
    } catch {
      known.delete(digest); // removed meanwhile: found or fetched again below
      return false;
    }
  };

  async function fetchImage(digest: string): Promise<ImageArtifact | undefined> {
    const { blobs, configOf } = o;
    if (!blobs || !configOf) return undefined;
    const row = await configOf(digest);
    if (!row) return undefined;
    const started = performance.now();
    const tmp = makeTempDir(o.dataDir);
    try {
      const rootfs = join(tmp, ROOTFS_FILE);
      try {
        await blobs.get(digest, rootfs, { cache: false }); // the image's own directory is this host's copy
      } catch (err) {
        if (err instanceof AppError && err.code === "not_found") return undefined;
        throw err;
      }
      const size = (await stat(rootfs)).size;
      if (size !== row.sizeBytes) throw new AppError("internal", `image ${digest} in the store is ${size} bytes, its row says ${row.sizeBytes}`);
      const artifact = commitArtifact(o.dataDir, tmp, { digest, sizeBytes: size, config: row.config });
      o.log.info("image fetched from the artifact store", { digest, bytes: size, ms: Math.round(performance.now() - started) });
      void api.trim().catch((err: unknown) => o.log.warn("trimming images failed", { err: err instanceof Error ? err.message : String(err) }));
      return artifact;
    } finally {
      rmSync(tmp, { recursive: true, force: true }); // gone already when committed (renamed into place)
    }
  }

  async function trimOnce(): Promise<string[]> {
    const { blobs } = o;
    if (!blobs) return [];
    const images: { digest: string; bytes: number; usedAt: number }[] = [];
    for (const digest of localDigests(o.dataDir)) {
      const dir = imageDir(o.dataDir, digest);
      try {
        const rootfs = statSync(join(dir, ROOTFS_FILE));
        images.push({ digest, bytes: rootfs.blocks * 512, usedAt: statSync(join(dir, IMAGE_JSON)).mtimeMs });
      } catch {
        // half an image: the build's sweep or the next commit handles it
      }
    }
    let total = images.reduce((n, i) => n + i.bytes, 0);
    if (total <= o.maxBytes) return [];
    const inUse = o.inUse();
    const removed: string[] = [];
    for (const image of images.sort((a, b) => a.usedAt - b.usedAt)) {
      if (total <= o.maxBytes) break;
      if (inUse.has(image.digest) || !(await blobs.has(image.digest))) continue; // running, or this host holds the only copy
      known.delete(image.digest);
      removeArtifact(o.dataDir, image.digest);
      total -= image.bytes;
      removed.push(image.digest);
    }
    if (removed.length > 0) o.log.info("images removed from this host (least recently used; they are in the store)", { removed, bytes: total });
    return removed;
  }

  const api: HostImages = {
    locate: (digest) => readArtifact(o.dataDir, digest),
    async ensure(digest) {
      const seen = known.get(digest);
      if (seen && touch(digest)) return seen;
      const here = readArtifact(o.dataDir, digest);
      if (here) {
        known.set(digest, here);
        touch(digest);
        return here;
      }
      let pending = fetching.get(digest);
      if (!pending) {
        pending = fetchImage(digest)
          .then((fetched) => {
            if (fetched) known.set(digest, fetched);
            return fetched;
          })
          .finally(() => fetching.delete(digest));
        fetching.set(digest, pending);
      }
      return pending;
    },
    async publish(artifact) {
      if (!o.blobs) return;
      const put = await o.blobs.put(artifact.rootfs);
      if (put.digest !== artifact.digest) throw new AppError("internal", `image ${artifact.digest}'s root filesystem hashes to ${put.digest}`);
    },
    async publishAll() {
      if (!o.blobs) return 0;
      let n = 0;
      for (const digest of localDigests(o.dataDir)) {
        const artifact = readArtifact(o.dataDir, digest);
        if (!artifact || (await o.blobs.has(digest))) continue;
        await api.publish(artifact);
        n++;
      }
      if (n > 0) o.log.info("images put into the artifact store", { images: n });
      return n;
    },
    trim() {
      trimming ??= trimOnce().finally(() => (trimming = undefined));
      return trimming;
    },
  };
  return api;
}

/** The digests of the image directories under the data directory (whole or not). */
function localDigests(dataDir: string): string[] {
  try {
    return readdirSync(join(imagesRoot(dataDir), "sha256"))
      .map((hex) => `sha256:${hex}`)
      .filter(isImageDigest);
  } catch {
    return [];
  }
}

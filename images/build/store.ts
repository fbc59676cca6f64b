// The content-addressed image files under a data directory: built in a temporary directory, committed by one rename.
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { imageDir, isImageDigest, type ImageArtifact, type ImageConfig } from "../../contracts/image.ts";
import { pidAlive } from "../../lib/node-lock.ts";

export const ROOTFS_FILE = "rootfs.ext4";
export const IMAGE_JSON = "image.json";
export const BUILD_LOG = "build.log";
/** Temporary directories under `<dataDir>/images/`: `.tmp-<pid>-<random>` (the pid says whether its build still runs). */
const TMP_PREFIX = ".tmp-";

/** What image.json holds, exactly (the fleet-agent reads this file). */
export interface ImageJson {
  digest: string;
  sizeBytes: number;
  config: ImageConfig;
}

export function imagesRoot(dataDir: string): string {
  return join(resolve(dataDir), "images");
}

/** A fresh temporary directory for one build, on the same filesystem as the images (so the commit is a rename). */
export function makeTempDir(dataDir: string): string {
  const root = imagesRoot(dataDir);
  mkdirSync(root, { recursive: true });
  const dir = mkdtempSync(join(root, `${TMP_PREFIX}${process.pid}-`));
  chmodSync(dir, 0o755); // it becomes the image's directory: a jailed hypervisor (not root) reads the root filesystem in it
  return dir;
}

/** The image of that digest when its files are all there and image.json is whole and names it; else undefined. */
export function readArtifact(dataDir: string, digest: string): ImageArtifact | undefined {
  if (!isImageDigest(digest)) return undefined;
  const dir = imageDir(resolve(dataDir), digest);
  try {
    const json = JSON.parse(readFileSync(join(dir, IMAGE_JSON), "utf8")) as ImageJson;
    const rootfs = join(dir, ROOTFS_FILE);
    const size = statSync(rootfs).size;
    if (json.digest !== digest || json.sizeBytes !== size || typeof json.config !== "object" || json.config === null) return undefined;
    return { digest, rootfs, sizeBytes: size, config: json.config };
  } catch {
    return undefined;
  }
}

/**
 * Moves a finished build (`tmp` holding rootfs.ext4 and build.log) to its content address: image.json is written
 * into `tmp`, then `tmp` is renamed into place, so the address holds a whole image or nothing. An image already there
 * with that digest is kept and `tmp` removed (same digest, same bytes, same config); a broken directory at that
 * address (no image.json, a short file) is replaced.
 */
export function commitArtifact(dataDir: string, tmp: string, image: ImageJson): ImageArtifact {
  const existing = readArtifact(dataDir, image.digest);
  if (existing) {
    rmSync(tmp, { recursive: true, force: true });
    return existing;
  }
  const json: ImageJson = { digest: image.digest, sizeBytes: image.sizeBytes, config: image.config };
  writeFileSync(join(tmp, IMAGE_JSON), `${JSON.stringify(json, null, 2)}\n`);
  const dir = imageDir(resolve(dataDir), image.digest);
  mkdirSync(join(dir, ".."), { recursive: true });
  if (existsSync(dir)) discard(dataDir, dir);
  try {
    renameSync(tmp, dir);
  } catch (err) {
    // Another build of the same image committed first (rename onto a non-empty directory fails): theirs is as good.
    const code = (err as NodeJS.ErrnoException).code;
    const theirs = readArtifact(dataDir, image.digest);
    if ((code === "ENOTEMPTY" || code === "EEXIST") && theirs) {
      rmSync(tmp, { recursive: true, force: true });
      return theirs;
    }
    throw err;
  }
  return { digest: image.digest, rootfs: join(dir, ROOTFS_FILE), sizeBytes: image.sizeBytes, config: image.config };
}

/** Renames a directory out of the way first, then removes it: readers see the whole image or none. */
function discard(dataDir: string, dir: string): void {
  const trash = makeTempDir(dataDir);
  const target = join(trash, "old");
  try {
    renameSync(dir, target);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
  }
  rmSync(trash, { recursive: true, force: true });
}

/** Removes an image's files (the caller makes sure no row names it and no VM runs it). */
export function removeArtifact(dataDir: string, digest: string): void {
  if (!isImageDigest(digest)) throw new Error(`not an image digest: ${digest}`);
  const dir = imageDir(resolve(dataDir), digest);
  if (existsSync(dir)) discard(dataDir, dir);
}

/**
 * Removes temporary directories left by builds that died (their pid no longer runs); those of running builds and
 * of this process are kept. Answers the paths removed. Call at start, before any build of this process.
 */
export function sweepTemp(dataDir: string, isAlive: (pid: number) => boolean = pidAlive): string[] {
  const root = imagesRoot(dataDir);
  let names: string[];
  try {
    names = readdirSync(root);
  } catch {
    return [];
  }
  const removed: string[] = [];
  for (const name of names) {
    if (!name.startsWith(TMP_PREFIX)) continue;
    const pid = Number(/^\.tmp-(\d+)-/.exec(name)?.[1]);
    if (pid && (pid === process.pid || isAlive(pid))) continue;
    rmSync(join(root, name), { recursive: true, force: true });
    removed.push(join(root, name));
  }
  return removed;
}
